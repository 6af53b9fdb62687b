package taloscert_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	siderox509 "github.com/siderolabs/crypto/x509"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/talos/taloscert"
)

// newOSCA makes a CA the way `talosctl gen secrets` does (Ed25519, O=talos).
func newOSCA(t *testing.T, opts ...siderox509.Option) *siderox509.CertificateAuthority {
	t.Helper()

	ca, err := siderox509.NewSelfSignedCertificateAuthority(append([]siderox509.Option{siderox509.Organization("talos")}, opts...)...)
	require.NoError(t, err)

	return ca
}

func parse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()

	block, _ := pem.Decode(certPEM)
	require.NotNil(t, block)
	require.Equal(t, "CERTIFICATE", block.Type)

	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)

	return cert
}

func TestIssueClientCertificate(t *testing.T) {
	ca := newOSCA(t)

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)

	notBefore := time.Now().Truncate(time.Second)

	certPEM, err := taloscert.IssueClientCertificate(ca.CrtPEM, ca.KeyPEM, "os:reader", pub, notBefore, 10*time.Minute)
	require.NoError(t, err)

	cert := parse(t, certPEM)
	assert.Equal(t, []string{"os:reader"}, cert.Subject.Organization)
	assert.True(t, notBefore.Equal(cert.NotBefore))
	assert.True(t, notBefore.Add(10*time.Minute).Equal(cert.NotAfter))
	assert.Equal(t, x509.KeyUsageDigitalSignature, cert.KeyUsage)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	assert.False(t, cert.IsCA)
	assert.Equal(t, pub, cert.PublicKey)

	roots := x509.NewCertPool()
	roots.AddCert(ca.Crt)

	_, err = cert.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: notBefore.Add(time.Minute),
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	require.NoError(t, err)
}

func TestIssueAnyRoleAndKey(t *testing.T) {
	// An ECDSA CA (older clusters) signing an ECDSA key for an operator.
	ca := newOSCA(t, siderox509.ECDSA(true))

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	parsed, err := taloscert.ParseCA(ca.CrtPEM, ca.KeyPEM)
	require.NoError(t, err)

	certPEM, err := parsed.Issue(taloscert.ClientCertificate{
		Role: "os:operator", PublicKey: &key.PublicKey, CommonName: "alice", NotBefore: time.Now(), Lifetime: time.Hour,
	})
	require.NoError(t, err)

	cert := parse(t, certPEM)
	assert.Equal(t, []string{"os:operator"}, cert.Subject.Organization)
	assert.Equal(t, "alice", cert.Subject.CommonName)
}

func TestIssueRefuses(t *testing.T) {
	ca := newOSCA(t)

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)

	now := time.Now()

	for name, tc := range map[string]struct {
		role     string
		pub      any
		lifetime time.Duration
	}{
		"no role":         {role: "", pub: pub, lifetime: time.Minute},
		"unknown role":    {role: "system:masters", pub: pub, lifetime: time.Minute},
		"padded role":     {role: " os:reader", pub: pub, lifetime: time.Minute},
		"impersonator":    {role: "os:impersonator", pub: pub, lifetime: time.Minute},
		"no key":          {role: "os:reader", pub: nil, lifetime: time.Minute},
		"zero lifetime":   {role: "os:reader", pub: pub, lifetime: 0},
		"negative expiry": {role: "os:reader", pub: pub, lifetime: -time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := taloscert.IssueClientCertificate(ca.CrtPEM, ca.KeyPEM, tc.role, tc.pub, now, tc.lifetime)
			require.Error(t, err)
		})
	}
}

func TestParseCARefuses(t *testing.T) {
	ca := newOSCA(t)
	other := newOSCA(t)

	_, err := taloscert.ParseCA(ca.CrtPEM, other.KeyPEM)
	require.ErrorContains(t, err, "does not match")

	_, err = taloscert.ParseCA([]byte("junk"), ca.KeyPEM)
	require.Error(t, err)

	_, err = taloscert.ParseCA(ca.CrtPEM, []byte("junk"))
	require.Error(t, err)

	// A leaf is not a CA, even with its own key.
	pair, err := siderox509.NewKeyPair(ca, siderox509.Organization("os:admin"))
	require.NoError(t, err)

	_, err = taloscert.ParseCA(pair.CrtPEM, pair.KeyPEM)
	require.ErrorContains(t, err, "not a signing CA")
}
