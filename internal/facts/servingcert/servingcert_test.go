package servingcert_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
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
	assert.Equal(t, int64(1767225600), got.NotBeforeUnix)
	assert.Equal(t, int64(1798761600), got.NotAfterUnix)
	assert.Equal(t, []string{"server auth"}, got.ExtKeyUsages)
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

// A kubelet's address is the node's to name: one in a denied network is not
// dialed at all, whether the reader dials itself (the address checked after
// DNS) or through a Dial (the address as written, before it).
func TestADeniedAddressIsNeverDialed(t *testing.T) {
	cluster := newCA(t, "kubernetes")
	addr := serve(t, cluster.serving(t, "worker-1", "10.5.0.2"))
	dialed := 0
	for name, r := range map[string]*servingcert.Reader{
		"own dial": {Roots: cluster.pool(), Denied: netguard.Default()},
		"a Dial": {Roots: cluster.pool(), Denied: netguard.Default(), Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			dialed++
			return (&net.Dialer{}).DialContext(ctx, network, address)
		}},
	} {
		got := r.Read(t.Context(), addr)
		assert.False(t, got.Read, name)
		assert.Contains(t, got.Error, "is in 127.0.0.0/8, a network the manager does not connect to", name)
		assert.Empty(t, got.Subject, name)
	}
	assert.Zero(t, dialed)
	// Its network not denied, the same kubelet is read.
	got := (&servingcert.Reader{Roots: cluster.pool(), Denied: netguard.Denied{netip.MustParsePrefix("10.0.0.0/8")}}).Read(t.Context(), addr)
	assert.True(t, got.Read, got.Error)
}

// leaf is a certificate for tmpl signed by c, served by a local listener.
func (c ca) leaf(t *testing.T, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// A kubelet's client certificate, served on its port: the same subject as
// its serving certificate, signed by the same CA, but for client auth only
// and naming nothing. The usages are a fact, named as a CSR's are; an OID
// Go does not know is named by its number.
func TestExtendedKeyUsagesAreNamed(t *testing.T) {
	cluster := newCA(t, "kubernetes")
	addr := serve(t, cluster.leaf(t, &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		NotBefore:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		ExtKeyUsage:        []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageAny},
		UnknownExtKeyUsage: []asn1.ObjectIdentifier{{1, 3, 6, 1, 4, 1, 99999, 1}},
		KeyUsage:           x509.KeyUsageDigitalSignature,
	}))
	got := (&servingcert.Reader{Roots: cluster.pool()}).Read(t.Context(), addr)
	require.True(t, got.Read, got.Error)
	assert.Equal(t, []string{"client auth", "any", "unknown OID 1.3.6.1.4.1.99999.1"}, got.ExtKeyUsages)
	assert.Equal(t, []csrinput.SAN{}, got.SubjectAltNames)
	assert.True(t, got.IssuedByClusterCA, "any usage is accepted by the issuer check: usages are the rule's to judge")

	none := serve(t, cluster.leaf(t, &x509.Certificate{
		SerialNumber: big.NewInt(8), Subject: pkix.Name{CommonName: "system:node:worker-1"},
		NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
	}))
	assert.Equal(t, []string{}, (&servingcert.Reader{Roots: cluster.pool()}).Read(t.Context(), none).ExtKeyUsages)
}

// A certificate whose only name is the node's in the constructed form of a
// DNS name has no name as Go (and every TLS client) reads it: the audit sees
// it as a name of unknown type, which the rule calls drifted, not the node's
// DNS name.
func TestANameInTheWrongFormIsNotTheNodes(t *testing.T) {
	cluster := newCA(t, "kubernetes")
	name, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, IsCompound: true, Bytes: []byte("worker-1")})
	require.NoError(t, err)
	value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: name})
	require.NoError(t, err)
	addr := serve(t, cluster.leaf(t, &x509.Certificate{
		SerialNumber: big.NewInt(9),
		Subject:      pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		NotBefore:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:        x509.KeyUsageDigitalSignature,
		ExtraExtensions: []pkix.Extension{{Id: csrinput.OIDSubjectAltName, Value: value}},
	}))
	got := (&servingcert.Reader{Roots: cluster.pool()}).Read(t.Context(), addr)
	require.True(t, got.Read, got.Error)
	assert.Empty(t, got.SANError)
	assert.Equal(t, []csrinput.SAN{{Type: "unknown", Value: hex.EncodeToString(name)}}, got.SubjectAltNames)
}

// RFC 5280's "no expiry" (99991231235959Z) is a time like any other: in
// Unix seconds, which the rule computes with, far beyond what OPA's time
// functions parse (2262).
func TestNoExpiryIsGivenInUnixSeconds(t *testing.T) {
	cluster := newCA(t, "kubernetes")
	addr := serve(t, cluster.leaf(t, &x509.Certificate{
		SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "system:node:worker-1"},
		DNSNames:  []string{"worker-1"},
		NotBefore: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}))
	got := (&servingcert.Reader{Roots: cluster.pool()}).Read(t.Context(), addr)
	require.True(t, got.Read, got.Error)
	assert.Equal(t, "9999-12-31T23:59:59Z", got.NotAfter)
	assert.Equal(t, int64(253402300799), got.NotAfterUnix)
}

// What a hostile kubelet controls is bounded before it reaches the rule,
// the decision log, conditions and Events: an issuer DN of 100 KB is cut
// to MaxText, saying how much was cut.
func TestHugeIssuerIsClipped(t *testing.T) {
	huge := newCA(t, strings.Repeat("x", 100_000))
	addr := serve(t, huge.serving(t, "worker-1", "10.5.0.2"))
	got := (&servingcert.Reader{Roots: newCA(t, "kubernetes").pool()}).Read(t.Context(), addr)
	require.True(t, got.Read, got.Error)
	assert.LessOrEqual(t, len(got.Issuer), servingcert.MaxText+len("...(100000 bytes more)"))
	assert.True(t, strings.HasPrefix(got.Issuer, "CN=xxxx"), got.Issuer[:20])
	assert.True(t, strings.HasSuffix(got.Issuer, "...(98979 bytes more)"), got.Issuer[len(got.Issuer)-30:])
	assert.LessOrEqual(t, len(got.VerifyError), servingcert.MaxText+len("...(100000 bytes more)"))
	assert.False(t, got.IssuedByClusterCA)
}

func TestClipCutsAtARune(t *testing.T) {
	assert.Equal(t, "short", servingcert.Clip("short", 10))
	assert.Equal(t, "ab...(5 bytes more)", servingcert.Clip("abé€", 3)) // é is 2 bytes: not cut in half
}

// A kubelet's certificate of more subject attributes than a request is read
// with is not read: each would be the rule's input, and a certificate
// message may be hundreds of kilobytes of them (review of 2026-12-06).
func TestASubjectOfManyAttributesIsNotRead(t *testing.T) {
	c := newCA(t, "kubernetes")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(0x1234),
		Subject:      pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		NotBefore:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for i := range csrinput.MaxSubjectAttributes {
		tmpl.Subject.ExtraNames = append(tmpl.Subject.ExtraNames, pkix.AttributeTypeAndValue{Type: asn1.ObjectIdentifier{2, 5, 4, 11}, Value: fmt.Sprintf("ou%d", i)})
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	require.NoError(t, err)
	got := (&servingcert.Reader{Roots: c.pool()}).Read(t.Context(), serve(t, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}))
	assert.False(t, got.Read)
	assert.Equal(t, "the certificate's subject has 66 attributes, more than the 64 it is read with", got.Error)
	assert.Empty(t, got.Subject)
}
