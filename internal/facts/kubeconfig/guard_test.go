package kubeconfig_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
)

// server records the Authorization headers it is sent.
type server struct {
	*httptest.Server

	mu   sync.Mutex
	auth []string
}

func (s *server) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...)
}

// newServer starts a TLS server answering with h, presenting cert (the
// httptest certificate when nil).
func newServer(t *testing.T, cert *tls.Certificate, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		s.mu.Unlock()
		h(w, r)
	}))
	if cert != nil {
		s.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// selfSigned is a certificate for 127.0.0.1 with a key of its own (every
// httptest server shares one).
func selfSigned(t *testing.T) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(2),
		Subject:               pkix.Name{CommonName: "tenant"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func certPEM(s *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}

func tenantKubeconfig(serverURL string, ca []byte) []byte {
	return []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: ` + serverURL + `
    certificate-authority-data: ` + base64.StdEncoding.EncodeToString(ca) + `
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user:
    token: tenant-token
`)
}

func localOf(local *server) *kubeconfig.Local {
	return &kubeconfig.Local{Config: &rest.Config{Host: local.URL, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM(local.Server)}}}
}

func listCSRs(t *testing.T, l *kubeconfig.Local, data []byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := l.RESTConfig(ctx, kubeconfig.Read(data), false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	return err
}

// A tenant's server that passed the probe answers with a redirect to the
// manager's own API server: the tenant's token never reaches it.
func TestRedirectToTheLocalAPIServerIsNotFollowed(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	tenant := newServer(t, &cert, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, local.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect) //nolint:gosec // G710: the tenant's server redirects on purpose
	})
	// The tenant's CA data trusts its own server and the local CA (public:
	// kube-root-ca.crt is in every namespace).
	err := listCSRs(t, localOf(local), tenantKubeconfig(tenant.URL, append(ca, certPEM(local.Server)...)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redirects are not followed")
	assert.Equal(t, []string{"Bearer tenant-token"}, tenant.seen())
	assert.Empty(t, local.seen(), "the local API server received the tenant's requests")
}

// A connection whose peer presents the local API server's key is refused at
// the handshake, whatever the probe said before.
func TestConnectionToTheLocalKeyIsRefused(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	// Another server with the same key (every httptest server shares it):
	// the local API server under another address.
	relay := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	err := listCSRs(t, localOf(local), tenantKubeconfig(relay.URL, certPEM(local.Server)))
	require.ErrorIs(t, err, kubeconfig.ErrServerIsLocal)
	assert.Empty(t, relay.seen())
	assert.Empty(t, local.seen())
}

// A server that is not the local one is talked to, with no proxy.
func TestRemoteServerIsReachedDirectly(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","items":[]}`))
	})
	l := localOf(local)
	require.NoError(t, listCSRs(t, l, tenantKubeconfig(tenant.URL, ca)))
	assert.Equal(t, []string{"Bearer tenant-token"}, tenant.seen())
	cfg, err := l.RESTConfig(context.Background(), kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	tr, ok := cfg.Transport.(*http.Transport)
	require.True(t, ok)
	req, err := http.NewRequest(http.MethodGet, "https://example.com/", nil)
	require.NoError(t, err)
	proxy, err := tr.Proxy(req)
	require.NoError(t, err)
	assert.Nil(t, proxy, "the environment's proxy is used")
}
