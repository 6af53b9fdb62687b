package taloscert_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
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

// The review of 2026-12-06: whoever writes a secrets bundle (a tenant, for
// its own cluster) writes its CA key, and parsing an RSA key checks and
// precomputes over its modulus: a key of a megabit (its primes need not be
// prime) took seconds to parse, under the lock every cluster's reads share,
// and hours to sign with. Its kind and size are checked first, from the
// certificate and the key's length.
func TestParseCARefusesAKeyOfAKindOrSizeItDoesNotTake(t *testing.T) {
	signer := newOSCA(t)
	caTemplate := func() *x509.Certificate {
		return &x509.Certificate{
			SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "tenant"},
			NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
	}
	// A certificate of a megabit RSA key, signed by another CA: cheap to
	// make, as the attack's is.
	huge := &rsa.PublicKey{N: new(big.Int).Lsh(big.NewInt(1), 1<<20-1), E: 65537}
	huge.N.Add(huge.N, big.NewInt(1))
	der, err := x509.CreateCertificate(rand.Reader, caTemplate(), signer.Crt, huge, signer.Key)
	require.NoError(t, err)
	hugeCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	_, err = taloscert.ParseCA(hugeCert, signer.KeyPEM)
	require.ErrorContains(t, err, "CA key is RSA of 1048576 bits; 2048 to 4096 are taken")

	// An Ed25519 CA's certificate beside a key of a megabyte: refused by
	// its length, unparsed.
	ca := newOSCA(t)
	bigKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: make([]byte, 1<<20)})
	_, err = taloscert.ParseCA(ca.CrtPEM, bigKey)
	require.ErrorContains(t, err, "1048576 bytes, longer than any key of the kinds taken")

	// ECDSA on P-224 is not taken; on P-256 it is.
	for curve, ok := range map[elliptic.Curve]bool{elliptic.P224(): false, elliptic.P256(): true} {
		key, err := ecdsa.GenerateKey(curve, rand.Reader)
		require.NoError(t, err)
		der, err := x509.CreateCertificate(rand.Reader, caTemplate(), caTemplate(), key.Public(), key)
		require.NoError(t, err)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		_, err = taloscert.ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
		if ok {
			require.NoError(t, err, curve.Params().Name)
		} else {
			require.ErrorContains(t, err, "P-224", curve.Params().Name)
		}
	}
}
