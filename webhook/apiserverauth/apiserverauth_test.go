package apiserverauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// testCA signs client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string, isCA bool) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: isCA,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) client(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

// serve runs handler behind auth on a real TLS server, as the webhook server
// configures its listener.
func serve(t *testing.T, auth *Auth, handler http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(auth.Require(handler))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	auth.TLS(srv.TLS)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, srv *httptest.Server, certs ...tls.Certificate) (int, error) {
	t.Helper()
	tr := srv.Client().Transport.(*http.Transport).Clone()
	if len(certs) > 0 {
		// Sent whatever CAs the server asks for: a client picks a
		// certificate by them, and a forger would send it anyway.
		tr.TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Post(srv.URL+"/validate", "application/json", strings.NewReader(`{"kind":"AdmissionReview"}`))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func TestOnlyTheAPIServersCertificateReachesTheHandler(t *testing.T) {
	ca := newCA(t, "apiserver-client-ca", true)
	other := newCA(t, "someone-elses-ca", true)
	reg := prometheus.NewRegistry()
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	auth, err := Load(writeFile(t, ca.pem), []string{"kube-apiserver-webhook-client"}, "")
	require.NoError(t, err)
	auth.Log = log
	require.NoError(t, auth.Register(reg))
	reached := 0
	srv := serve(t, auth, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		w.WriteHeader(http.StatusOK)
	}))

	code, err := post(t, srv, ca.client(t, "kube-apiserver-webhook-client"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "the API server's certificate")
	assert.Equal(t, 1, reached)

	code, err = post(t, srv)
	require.NoError(t, err, "a client without a certificate connects (the readiness probe does)")
	assert.Equal(t, http.StatusForbidden, code, "but its request is refused")

	code, err = post(t, srv, ca.client(t, "system:node:worker-1"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "a certificate of the same CA with another name (a kubelet's)")
	code, err = post(t, srv, ca.client(t, "Kube-Apiserver-Webhook-Client"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "names compare as Kubernetes compares user names, case and all")

	_, err = post(t, srv, other.client(t, "kube-apiserver-webhook-client"))
	require.Error(t, err, "a certificate of another CA with the allowed name fails the handshake")

	assert.Equal(t, 1, reached, "no refused request reached the handler")
	n, err := testutil.GatherAndCount(reg, "ichor_webhook_requests_refused_total")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "a series for each reason, registered")
	assert.InDelta(t, 1, testutil.ToFloat64(auth.refused.WithLabelValues(ReasonNoCertificate)), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(auth.refused.WithLabelValues(ReasonNameNotAllowed)), 0)
	require.Len(t, logged, 1, "the second refusal within a minute is counted, not logged")
	assert.Contains(t, logged[0], ReasonNoCertificate)
}

func TestRefusalsAreLoggedOnceAMinuteWithHowManyWentUnlogged(t *testing.T) {
	ca := newCA(t, "ca", true)
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	auth, err := Load(writeFile(t, ca.pem), []string{"apiserver"}, "")
	require.NoError(t, err)
	auth.Log = log
	now := time.Unix(1000, 0)
	auth.now = func() time.Time { return now }
	h := auth.Require(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Fatal("reached") }))
	hostile := strings.Repeat("%1b[31m", 200)
	for range 5 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/"+hostile, nil))
	}
	require.Len(t, logged, 1)
	assert.NotContains(t, logged[0], "\x1b", "the path is escaped")
	assert.Less(t, len(logged[0]), 2048, "and cut")
	now = now.Add(noticeEvery)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil))
	require.Len(t, logged, 2)
	assert.Contains(t, logged[1], `"refusedUnlogged"=4`)
}

func TestServerPutsEveryHandlerBehindTheCheck(t *testing.T) {
	ca := newCA(t, "ca", true)
	auth, err := Load(writeFile(t, ca.pem), []string{"apiserver"}, "")
	require.NoError(t, err)
	inner := crwebhook.NewServer(crwebhook.Options{})
	srv := auth.Server(inner)
	srv.Register("/validate", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Fatal("reached") }))
	rec := httptest.NewRecorder()
	inner.WebhookMux().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil))
	assert.Equal(t, http.StatusForbidden, rec.Code, "registered through the wrapper, refused on the inner server's mux")
	unwrapped, ok := srv.(interface{ Unwrap() crwebhook.Server })
	require.True(t, ok)
	assert.Same(t, inner, unwrapped.Unwrap())
}

func TestLoadRefusesWhatIsNotACABundle(t *testing.T) {
	ca := newCA(t, "ca", true)
	leaf := newCA(t, "not-a-ca", false)
	key, err := x509.MarshalECPrivateKey(ca.key)
	require.NoError(t, err)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key})
	for name, c := range map[string]struct {
		path  string
		names []string
		want  string
	}{
		"no names":           {writeFile(t, ca.pem), nil, "no client names"},
		"an empty name":      {writeFile(t, ca.pem), []string{"apiserver", ""}, `client name "" is empty`},
		"a name with spaces": {writeFile(t, ca.pem), []string{"a", " b"}, `client name " b" is empty or has spaces around it`},
		"missing file":       {filepath.Join(t.TempDir(), "absent"), []string{"a"}, "no such file"},
		"empty file":         {writeFile(t, nil), []string{"a"}, "no certificate"},
		"a key beside it":    {writeFile(t, append(append([]byte{}, ca.pem...), keyPEM...)), []string{"a"}, `"EC PRIVATE KEY", not a CERTIFICATE`},
		"not PEM":            {writeFile(t, []byte("hello")), []string{"a"}, "no certificate"},
		"a leaf, not a CA":   {writeFile(t, leaf.pem), []string{"a"}, "is not a CA"},
		"bad DER":            {writeFile(t, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")})), []string{"a"}, "certificate 1:"},
		"larger than a MiB":  {writeFile(t, append(append([]byte{}, ca.pem...), make([]byte, maxCAFile)...)), []string{"a"}, "larger than"},
		"a directory's name": {t.TempDir(), []string{"a"}, "is not a regular file"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load(c.path, c.names, "")
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	two := newCA(t, "second", true)
	auth, err := Load(writeFile(t, slices.Concat([]byte("# the old CA\n"), ca.pem, []byte("subject=CN=second\n"), two.pem)), []string{"a"}, "")
	require.NoError(t, err, "a bundle of two CAs, as during a rotation, with the text bundles carry")
	assert.Len(t, auth.pool.Subjects(), 2) //nolint:staticcheck // Subjects is enough for a pool built from files
}

// The file's digest pinned in the Deployment, where the ConfigMap's writers
// cannot change it: another file is refused, the pinned one loaded (review
// 166).
func TestAPinnedCAIsTheOnlyOneLoaded(t *testing.T) {
	ca := newCA(t, "apiserver-clients", true)
	path := writeFile(t, ca.pem)
	sum := sha256.Sum256(ca.pem)
	pin := hex.EncodeToString(sum[:])
	_, err := Load(path, []string{"a"}, pin)
	require.NoError(t, err)
	_, err = Load(path, []string{"a"}, strings.ToUpper(pin))
	require.NoError(t, err, "sha256sum's digits, in either case")
	other := newCA(t, "someone-else", true)
	_, err = Load(writeFile(t, other.pem), []string{"a"}, pin)
	require.ErrorContains(t, err, "not the pinned "+pin+": the CA was replaced")
}
