package servingcert_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
)

type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T, name string) ca {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2035, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return ca{cert: cert, key: key}
}

func (c ca) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

func (c ca) serving(t *testing.T, node string, ips ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(0x1234),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:     []string{node},
		NotBefore:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serve serves cert with TLS on a local port until the test ends.
func serve(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	return l.Addr().String()
}

func TestReadsTheLeafAsFacts(t *testing.T) {
	cluster := newCA(t, "kubernetes")
	addr := serve(t, cluster.serving(t, "worker-1", "10.5.0.2"))
	got := (&servingcert.Reader{Roots: cluster.pool()}).Read(t.Context(), addr)
	assert.True(t, got.Read, got.Error)
	assert.Equal(t, addr, got.Address)
	assert.Equal(t, []csrinput.Attribute{
		{OID: "2.5.4.10", Name: "O", Value: "system:nodes"},
		{OID: "2.5.4.3", Name: "CN", Value: "system:node:worker-1"},
	}, got.Subject)
	assert.Equal(t, []csrinput.SAN{{Type: "dns", Value: "worker-1"}, {Type: "ip", Value: "10.5.0.2"}}, got.SubjectAltNames)
	assert.Equal(t, "1234", got.Serial)
	assert.Equal(t, "CN=kubernetes", got.Issuer)
	assert.Equal(t, "2026-01-01T00:00:00Z", got.NotBefore)
	assert.Equal(t, "2027-01-01T00:00:00Z", got.NotAfter)
	assert.Equal(t, csrinput.PublicKey{Algorithm: "ECDSA", Bits: 256, Curve: "P-256"}, got.PublicKey)
	assert.True(t, got.IssuedByClusterCA, got.VerifyError)
}

func TestAnotherCAIsAFactNotAnError(t *testing.T) {
	cluster, other := newCA(t, "kubernetes"), newCA(t, "someone-else")
	addr := serve(t, other.serving(t, "worker-1", "10.5.0.2"))
	got := (&servingcert.Reader{Roots: cluster.pool()}).Read(t.Context(), addr)
	assert.True(t, got.Read, got.Error)
	assert.False(t, got.IssuedByClusterCA)
	assert.Contains(t, got.VerifyError, "does not verify against the cluster's CA")
}

func TestClosedPortIsUnread(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	got := (&servingcert.Reader{}).Read(t.Context(), addr)
	assert.False(t, got.Read)
	assert.Contains(t, got.Error, "dial "+addr)
	assert.Equal(t, []csrinput.SAN{}, got.SubjectAltNames)
}

// A peer that accepts and never answers costs the timeout, no more.
func TestSilentPeerCostsOnlyTheTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			held <- c
		}
	}()
	start := time.Now()
	got := (&servingcert.Reader{Timeout: 300 * time.Millisecond}).Read(t.Context(), l.Addr().String())
	took := time.Since(start)
	assert.False(t, got.Read)
	assert.Contains(t, got.Error, "TLS handshake")
	assert.Less(t, took, 3*time.Second)
	select {
	case c := <-held:
		c.Close()
	default:
	}
}

// The dial function is where a test maps a node's address to a listener.
func TestDialMapsTheAddress(t *testing.T) {
	cluster := newCA(t, "kubernetes")
	local := serve(t, cluster.serving(t, "worker-1", "10.5.0.2"))
	r := &servingcert.Reader{Roots: cluster.pool(), Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
		require.Equal(t, "10.5.0.2:10250", address)
		return (&net.Dialer{}).DialContext(ctx, network, local)
	}}
	got := r.Read(context.Background(), servingcert.Address("10.5.0.2", servingcert.DefaultPort))
	assert.True(t, got.Read, got.Error)
	assert.Equal(t, "10.5.0.2:10250", got.Address)
	assert.Equal(t, "[fd00::2]:10250", servingcert.Address("fd00::2", 10250))
}
