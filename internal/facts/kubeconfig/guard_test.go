package kubeconfig_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientcertificatesv1 "k8s.io/client-go/kubernetes/typed/certificates/v1"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/netguard/netguardtest"
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
	cfg, err := l.RESTConfig(ctx, "tenant", kubeconfig.Read(data), false)
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
	cfg, err := l.RESTConfig(context.Background(), "tenant", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	tr, ok := cfg.Transport.(*http.Transport)
	require.True(t, ok)
	req, err := http.NewRequest(http.MethodGet, "https://example.com/", nil)
	require.NoError(t, err)
	proxy, err := tr.Proxy(req)
	require.NoError(t, err)
	assert.Nil(t, proxy, "the environment's proxy is used")

	// Plain HTTP is not reached, whatever a bundle's rule allowed (review
	// 62): neither the server nor whether it is the manager's own could be
	// told, and the tenant's token would travel in clear.
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a plain HTTP server was reached") }))
	t.Cleanup(plain.Close)
	_, err = l.RESTConfig(context.Background(), "tenant", kubeconfig.Read(tenantKubeconfig(plain.URL, ca)), false)
	require.ErrorContains(t, err, "only an https:// server is reached")
}

// csrListOf writes a CSR list of n items, each with a request of size
// bytes, as a tenant's server would answer a list.
func csrListOf(w io.Writer, n, size int) {
	_, _ = io.WriteString(w, `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{},"items":[`)
	blob := strings.Repeat("A", size)
	for i := range n {
		if i > 0 {
			_, _ = io.WriteString(w, ",")
		}
		_, _ = fmt.Fprintf(w, `{"metadata":{"name":"csr-%d","uid":"u-%d"},"spec":{"signerName":"kubernetes.io/kubelet-serving","usages":["server auth"],"request":"%s"}}`, i, i, blob)
	}
	_, _ = io.WriteString(w, `]}`)
}

// A tenant's server answers as it likes (review 28 H1: 216 KB of gzip
// became 200 MB of CSRs in the manager). No compression is asked for, so a
// body compressed anyway is not inflated, and a list past MaxResponseBytes,
// or any other answer past MaxObjectResponseBytes, is refused; an ordinary
// list is read as before.
func TestARemoteAnswerIsReadAsSentAndBounded(t *testing.T) {
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	require.NoError(t, err)
	csrListOf(zw, 200, 1<<20) // 200 MiB inflated
	require.NoError(t, zw.Close())
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	var mode atomic.Value
	var askedGzip atomic.Bool
	tenant := newServer(t, &cert, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			askedGzip.Store(true)
		}
		w.Header().Set("Content-Type", "application/json")
		switch mode.Load() {
		case "gzip":
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(gz.Bytes())
		case "large":
			csrListOf(w, 65, 1<<20) // past 64 MiB, streamed without a length
		case "objects":
			// A list of 5 MiB is a list; one CSR of 5 MiB is no object a
			// real server stores, and the answer to its read is refused.
			if strings.HasSuffix(r.URL.Path, "/certificatesigningrequests") {
				csrListOf(w, 5, 1<<20)
				return
			}
			_, _ = fmt.Fprintf(w, `{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"csr-0"},"spec":{"request":"%s"}}`, strings.Repeat("A", 5<<20))
		case "large-watch-error":
			// A watch's error answer, read whole by client-go.
			w.WriteHeader(http.StatusInternalServerError)
			for range 65 {
				_, _ = io.WriteString(w, strings.Repeat("x", 1<<20-1)+"\n")
			}
		case "large-list-error":
			// A list's error answer: a Status whose message client-go
			// keeps whole, wraps and logs (review 62).
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"%s"}`, strings.Repeat("\xff", 1<<20))
		case "small-list-error":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Conflict","message":"try again","code":409}`)
		default:
			csrListOf(w, 2, 1000)
		}
	})
	cfg, err := localOf(local).RESTConfig(t.Context(), "tenant", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	list := func() (*certificatesv1.CertificateSigningRequestList, error) {
		return cs.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{})
	}

	mode.Store("small")
	got, err := list()
	require.NoError(t, err)
	assert.Len(t, got.Items, 2)

	mode.Store("gzip")
	_, err = list()
	require.Error(t, err, "a compressed answer nobody asked for was read")
	assert.False(t, askedGzip.Load(), "the client asked the tenant's server for gzip")

	mode.Store("large")
	_, err = list()
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than the %d bytes a remote API server's answer may be", kubeconfig.MaxResponseBytes))
	assert.ErrorAs(t, err, new(*kubeconfig.AnswerTooLargeError), "client-go's error does not say the answer was too large")

	mode.Store("objects")
	got, err = list()
	require.NoError(t, err, "a list past the bound of one object's answer")
	assert.Len(t, got.Items, 5)
	_, err = cs.CertificatesV1().CertificateSigningRequests().Get(t.Context(), "csr-0", metav1.GetOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than the %d bytes a remote API server's answer may be", kubeconfig.MaxObjectResponseBytes))
	// The same server behind a path, as a proxy serves one: its lists are
	// lists (review of c8388d8).
	behind, err := localOf(local).RESTConfig(t.Context(), "tenant", kubeconfig.Read(tenantKubeconfig(tenant.URL+"/k8s/clusters/c-x", ca)), false)
	require.NoError(t, err)
	behindCS, err := kubernetes.NewForConfig(behind)
	require.NoError(t, err)
	got, err = behindCS.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err, "a list of a server behind a path bounded as one object's answer")
	assert.Len(t, got.Items, 5)
	_, err = behindCS.CertificatesV1().CertificateSigningRequests().Get(t.Context(), "csr-0", metav1.GetOptions{})
	require.Error(t, err)

	mode.Store("large-watch-error")
	_, err = cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than the %d bytes a remote API server's answer may be", kubeconfig.MaxErrorResponseBytes))

	// An error's answer is bounded as an error's, not as the list's it
	// answers: its message would be copied into every error and log line.
	mode.Store("large-list-error")
	_, err = list()
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than the %d bytes a remote API server's answer may be", kubeconfig.MaxErrorResponseBytes))
	assert.Less(t, len(err.Error()), 4096, "the error holds the server's message")
	mode.Store("small-list-error")
	_, err = list()
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), "an ordinary error answer is read as the API server's: %v", err)
}

// A watch's events are bounded one by one (review 30 H2): client-go reads a
// JSON event whole before its decoder's bound is checked, so a server could
// have it hold an event of any size; the watch ends once an event is past
// MaxWatchEventBytes, having read no more of it. Events of an ordinary
// size pass, one a line or broken over lines. The hostile event is sent as
// one line; as endless short lines (JSON may break a value between any two
// tokens: a bound per line let it through, review of 2026-12-05); and as one
// line under a media type that names protobuf in a parameter only (client-go
// decodes it as JSON; the guard took it for protobuf and bounded nothing).
func TestARemoteWatchEventIsBounded(t *testing.T) {
	const huge = 256 << 20
	const head = `{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":%q,"resourceVersion":"8"},"spec":{"signerName":"kubernetes.io/kubelet-serving","request":"%s"}}}`
	event := func(w io.Writer, name string, size int) {
		_, _ = fmt.Fprintf(w, head+"\n", name, strings.Repeat("A", size))
	}
	// The same event, pretty-printed, as a server may send one.
	brokenOverLines := func(w io.Writer, name string) {
		_, _ = fmt.Fprintf(w, "{\n  \"type\": \"ADDED\",\n  \"object\": {\n    \"kind\": \"CertificateSigningRequest\",\n"+
			"    \"apiVersion\": \"certificates.k8s.io/v1\",\n    \"metadata\": {\"name\": %q, \"resourceVersion\": \"9\"},\n"+
			"    \"spec\": {\"signerName\": \"kubernetes.io/kubelet-serving\", \"request\": \"QUFB\", \"usages\": [\n\"a}]{[\\\"\"\n]}\n  }\n}\n", name)
	}
	hostile := map[string]struct {
		contentType string
		start, unit string
	}{
		"one line": {"application/json",
			`{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"huge"},"spec":{"request":"`, "A"},
		"endless short lines": {"application/json",
			`{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"huge"},"spec":{"usages":[`, "0,\n"},
		"protobuf named in a parameter": {"application/json; x=application/vnd.kubernetes.protobuf",
			`{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"huge"},"spec":{"request":"`, "A"},
	}
	for name, tc := range hostile {
		t.Run(name, func(t *testing.T) {
			var sendHuge atomic.Bool
			sent := make(chan int64, 1)
			local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
			cert, ca := selfSigned(t)
			tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				event(w, "small", 100)
				if sendHuge.Load() {
					// One event that never ends, sent until the client
					// stops reading.
					_, _ = io.WriteString(w, tc.start)
					chunk, written := bytes.Repeat([]byte(tc.unit), (1<<20)/len(tc.unit)), int64(0)
					for written < huge {
						n, err := w.Write(chunk)
						written += int64(n)
						if err != nil {
							break
						}
					}
					sent <- written
					return
				}
				brokenOverLines(w, "pretty")
				event(w, "after", 100)
			})
			cfg, err := localOf(local).RESTConfig(t.Context(), "tenant", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
			require.NoError(t, err)
			cs, err := kubernetes.NewForConfig(cfg)
			require.NoError(t, err)
			var told atomic.Pointer[error]
			ctx := kubeconfig.WithAnswerTooLarge(t.Context(), func(err error) { told.Store(&err) })
			names := func() []string {
				w, err := cs.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{})
				require.NoError(t, err)
				defer w.Stop()
				var got []string
				for e := range w.ResultChan() {
					if csr, ok := e.Object.(*certificatesv1.CertificateSigningRequest); ok {
						got = append(got, csr.Name)
					} else {
						got = append(got, string(e.Type))
					}
				}
				return got
			}
			assert.Equal(t, []string{"small", "pretty", "after"}, names())
			assert.Nil(t, told.Load(), "an ordinary watch was told too large")
			sendHuge.Store(true)
			got := names()
			assert.Equal(t, "small", got[0])
			assert.NotContains(t, got, "huge")
			// client-go keeps only the message of the error that ended the
			// stream: the asker is told what it was.
			require.NotNil(t, told.Load(), "the asker was not told of the event past the bound")
			assert.ErrorAs(t, *told.Load(), new(*kubeconfig.AnswerTooLargeError))
			select {
			case written := <-sent:
				assert.Less(t, written, int64(4*kubeconfig.MaxWatchEventBytes), "the client read on past the bound")
			case <-time.After(time.Minute):
				t.Fatal("the server was still sending a minute after the watch ended")
			}
		})
	}
}

// The event a watch is reading takes its bytes from the tenant's budget,
// with its lists (review 62): a tenant's servers each sending, on one of
// its many watches, an event near the bound and never ending it held 16 MiB
// a watch beyond the lists' bound. What an event held is given back once it
// ends, and when its watch ends.
func TestTheEventsBeingReadAreBoundedWithTheTenantsLists(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	const start = `{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"held"},"spec":{"request":"`
	release := make(chan struct{})
	var ended sync.Once
	end := func() { ended.Do(func() { close(release) }) }
	var holding atomic.Int64
	tenant := newServer(t, &cert, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		// 2 MiB of an event that does not end until the test says.
		_, _ = io.WriteString(w, start+strings.Repeat("A", 2<<20))
		w.(http.Flusher).Flush()
		holding.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `"}}}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	t.Cleanup(func() {
		end()
		tenant.CloseClientConnections()
	})
	l := localOf(local)
	// An event of 2 MiB is charged what client-go keeps for it: its JSON
	// decoder's buffer and a frame buffer of 4 MiB, 12 MiB.
	l.ListBytes = 20 << 20
	watchOf := func(name string) (watch.Interface, error) {
		t.Helper()
		cfg, err := l.RESTConfig(t.Context(), name, kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
		require.NoError(t, err)
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		return cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
	}
	first, err := watchOf("team-a")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return kubeconfig.ListBytesInUse(l, "team-a") >= 2<<20 }, 20*time.Second, 10*time.Millisecond,
		"the event being read holds nothing of the tenant's budget")
	second, err := watchOf("team-a")
	require.NoError(t, err)
	// The second watch's event does not fit beside the first's: its watch
	// ends, with the reason.
	select {
	case e, ok := <-second.ResultChan():
		if ok {
			assert.Equal(t, watch.Error, e.Type, "an event past the tenant's budget was read: %v", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second watch read on past the tenant's budget")
	}
	second.Stop()
	other, err := watchOf("team-b")
	require.NoError(t, err, "another tenant's watch is held back by this one's")
	other.Stop()

	// The first event ends. The decoder keeps the buffer it grew for it as
	// long as the watch lasts, so the watch holds its bytes until it stops.
	end()
	select {
	case e := <-first.ResultChan():
		csr, ok := e.Object.(*certificatesv1.CertificateSigningRequest)
		require.True(t, ok, "%v", e)
		assert.Equal(t, "held", csr.Name)
	case <-time.After(30 * time.Second):
		t.Fatal("the first watch's event never came")
	}
	assert.GreaterOrEqual(t, kubeconfig.ListBytesInUse(l, "team-a"), int64(2<<20), "an event that ended gave back the memory its decoder still holds")
	first.Stop()
	require.Eventually(t, func() bool { return kubeconfig.ListBytesInUse(l, "team-a") == 0 }, 20*time.Second, 10*time.Millisecond,
		"a watch stopped keeps what its events held")
}

// A protobuf watch's frames are charged the same way, as soon as a frame's
// length is read (client-go's decoder grows its buffer to it), and a frame
// declared past MaxWatchEventBytes is refused before any of it is read.
func TestTheFramesOfAProtobufWatchAreBoundedWithTheTenantsLists(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	var declared atomic.Uint32
	tenant := newServer(t, &cert, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf;stream=watch")
		var header [4]byte
		binary.BigEndian.PutUint32(header[:], declared.Load())
		_, _ = w.Write(header[:])
		_, _ = w.Write(make([]byte, 1024)) // a frame begun, never ended
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	t.Cleanup(tenant.CloseClientConnections)
	l := localOf(local)
	l.ListBytes = 3 << 20
	cfg, err := l.RESTConfig(t.Context(), "team-a", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	watchCSRs := func() watch.Interface {
		t.Helper()
		w, err := cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
		require.NoError(t, err)
		return w
	}
	ended := func(w watch.Interface) bool {
		t.Helper()
		select {
		case e, ok := <-w.ResultChan():
			return !ok || e.Type == watch.Error
		case <-time.After(30 * time.Second):
			return false
		}
	}

	declared.Store(2 << 20)
	first := watchCSRs()
	require.Eventually(t, func() bool { return kubeconfig.ListBytesInUse(l, "team-a") >= 2<<20 }, 20*time.Second, 10*time.Millisecond,
		"a frame's declared length is not charged")
	second := watchCSRs()
	assert.True(t, ended(second), "a second frame of 2 MiB was read past the tenant's 3 MiB")
	second.Stop()
	first.Stop()
	require.Eventually(t, func() bool { return kubeconfig.ListBytesInUse(l, "team-a") == 0 }, 20*time.Second, 10*time.Millisecond)

	declared.Store(kubeconfig.MaxWatchEventBytes + 1)
	var told atomic.Pointer[error]
	ctx := kubeconfig.WithAnswerTooLarge(t.Context(), func(err error) { told.Store(&err) })
	huge, err := cs.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.True(t, ended(huge), "a frame declared past the bound was waited for")
	huge.Stop()
	require.NotNil(t, told.Load(), "the asker was not told of the frame past the bound")
	assert.ErrorAs(t, *told.Load(), new(*kubeconfig.AnswerTooLargeError))
	assert.Zero(t, kubeconfig.ListBytesInUse(l, "team-a"))
}

// A watch answered under a media type client-go does not decode is closed
// here, not left to the tenant's server to hold open; one answered with a
// success other than 200 is an error's answer, read to its bound.
func TestAWatchAnsweredAsNeitherJSONNorProtobufIsClosed(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	var mode atomic.Value
	tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) {
		switch mode.Load() {
		case "202":
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, strings.Repeat("x", 1<<20))
			return
		case "long":
			w.Header().Set("Content-Type", "text/"+strings.Repeat("x", 30<<10))
		case "none":
			// No type at all (nil stops Go's server from sniffing one):
			// JSON, to client-go.
			w.Header()["Content-Type"] = nil
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"untyped","resourceVersion":"1"}}}`+"\n")
			return
		default:
			w.Header().Set("Content-Type", "text/plain")
		}
		_, _ = io.WriteString(w, "hello")
	})
	cfg, err := localOf(local).RESTConfig(t.Context(), "team-a", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
	require.ErrorContains(t, err, `a watch answered as "text/plain", neither JSON nor protobuf`)
	mode.Store("202")
	_, err = cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
	require.ErrorContains(t, err, fmt.Sprintf("more than the %d bytes a remote API server's answer may be", kubeconfig.MaxErrorResponseBytes))
	// The type is the tenant's to make long: the error quotes it cut.
	mode.Store("long")
	_, err = cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
	require.ErrorContains(t, err, "neither JSON nor protobuf")
	assert.Less(t, len(err.Error()), 1024)
	mode.Store("none")
	w, err := cs.CertificatesV1().CertificateSigningRequests().Watch(t.Context(), metav1.ListOptions{})
	require.NoError(t, err, "a watch with no type is JSON")
	defer w.Stop()
	select {
	case e := <-w.ResultChan():
		csr, ok := e.Object.(*certificatesv1.CertificateSigningRequest)
		require.True(t, ok, "%v", e)
		assert.Equal(t, "untyped", csr.Name)
	case <-time.After(30 * time.Second):
		t.Fatal("no event")
	}
}

// countedWarnings counts the warnings the process-wide handler is given.
type countedWarnings struct{ n *atomic.Int64 }

func (c countedWarnings) HandleWarningHeaderWithContext(context.Context, int, string, string) {
	c.n.Add(1)
}

// A tenant's server chooses its answers' headers: its warnings never reach
// the manager's log (the process-wide handler logs every one), and an
// answer whose headers are past MaxResponseHeaderBytes (Go takes 10 MiB by
// default, some 900,000 warnings for client-go to parse) is an error.
func TestARemoteServersWarningsAreNotLoggedAndItsHeadersAreBounded(t *testing.T) {
	var logged atomic.Int64
	rest.SetDefaultWarningHandlerWithContext(countedWarnings{&logged})
	t.Cleanup(func() { rest.SetDefaultWarningHandler(rest.WarningLogger{}) })
	var flood atomic.Bool
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) {
		n := 10
		if flood.Load() {
			n = 2 * kubeconfig.MaxResponseHeaderBytes / 16
		}
		for i := range n {
			w.Header().Add("Warning", fmt.Sprintf(`299 - "w%d"`, i))
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{},"items":[]}`)
	})
	guarded := localOf(local)
	require.NoError(t, listCSRs(t, guarded, tenantKubeconfig(tenant.URL, ca)))
	assert.Zero(t, logged.Load(), "a tenant's warnings reached the process-wide handler")

	// The control: the same answer through a client of the process's
	// defaults is logged.
	plain, err := kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)).RESTConfig(false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(plain)
	require.NoError(t, err)
	_, err = cs.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Positive(t, logged.Load(), "the control logged nothing: the test proves nothing")

	flood.Store(true)
	err = listCSRs(t, guarded, tenantKubeconfig(tenant.URL, ca))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exceeded", "not refused for the size of its headers")
}

// A server in a denied network (the manager's own host by default) is
// neither probed nor connected to by the client, whether the kubeconfig
// names it by address, by a name that resolves there, or by its IPv4
// address written as IPv6: the tenant learns nothing of what listens
// there, and nothing is sent.
func TestAServerInADeniedNetworkIsNeitherProbedNorConnectedTo(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	var conns atomic.Int32
	tenant.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	_, port, err := net.SplitHostPort(tenant.Listener.Addr().String())
	require.NoError(t, err)

	l := localOf(local)
	l.Denied = netguard.Default()
	for _, host := range []string{"127.0.0.1", "localhost", "[::ffff:127.0.0.1]"} {
		doc := kubeconfig.Read(tenantKubeconfig("https://"+host+":"+port, ca))
		var refused *netguard.RefusedError
		_, err := l.Probe(t.Context(), doc)
		require.ErrorAs(t, err, &refused, host)
		// localhost may resolve to ::1 first.
		assert.Contains(t, []string{"127.0.0.0/8", "::1/128"}, refused.Network.String(), host)
		require.ErrorAs(t, listCSRs(t, l, tenantKubeconfig("https://"+host+":"+port, ca)), &refused, host)
	}
	assert.Zero(t, conns.Load(), "the tenant's server in a denied network was connected to")
	assert.Empty(t, tenant.seen())

	// The same server, its network not denied, is reached: the count
	// above would have shown a connection.
	l = localOf(local)
	l.Denied, err = netguard.Parse([]string{"127.0.0.3/32"})
	require.NoError(t, err)
	_, err = l.Probe(t.Context(), kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)))
	require.NoError(t, err)
	assert.Positive(t, conns.Load())
}

// The lists being read from one tenant's servers are bounded together, not
// only one by one: a list that would take the bytes read at once past
// Local.ListBytes is refused (client-go asks again), while another tenant's
// lists are read as before; and what a list took is given back once it is
// read and closed, so the tenant's next list is read.
func TestTheListsOfATenantAreBoundedTogether(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	const listHead = `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{},"items":[`
	padding := strings.Repeat(" ", 2<<20) // 2 MiB of JSON whitespace
	release := make(chan struct{})
	var ended sync.Once
	end := func() { ended.Do(func() { close(release) }) }
	var held atomic.Int64
	tenant := newServer(t, &cert, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, listHead+padding)
		if r.URL.Query().Get("labelSelector") == "hold=true" {
			// The first list is held, its 2 MiB sent, until the test
			// lets it end.
			w.(http.Flusher).Flush()
			held.Add(1)
			<-release
		}
		_, _ = io.WriteString(w, "]}")
	})
	// A failure below must not leave the held answer waiting, nor its
	// connection open: the server's close waits for both.
	t.Cleanup(func() {
		end()
		tenant.CloseClientConnections()
	})
	l := localOf(local)
	l.ListBytes = 3 << 20
	csrsOf := func(name string) clientcertificatesv1.CertificateSigningRequestInterface {
		t.Helper()
		cfg, err := l.RESTConfig(t.Context(), name, kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
		require.NoError(t, err)
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		return cs.CertificatesV1().CertificateSigningRequests()
	}
	// Two clusters of one tenant, and another tenant's.
	first, second, other := csrsOf("team-a"), csrsOf("team-a"), csrsOf("team-b")

	held1 := make(chan error, 1)
	go func() {
		_, err := first.List(t.Context(), metav1.ListOptions{LabelSelector: "hold=true"})
		held1 <- err
	}()
	require.Eventually(t, func() bool { return held.Load() == 1 }, 20*time.Second, 10*time.Millisecond)
	// The held list's 2 MiB are read as they come.
	require.Eventually(t, func() bool { return kubeconfig.ListBytesInUse(l, "team-a") >= 2<<20 }, 20*time.Second, 10*time.Millisecond)
	_, err := second.List(t.Context(), metav1.ListOptions{})
	require.ErrorIs(t, err, kubeconfig.ErrListsTooLarge, "a second list of 2 MiB beside a held one of 2 MiB was read past the tenant's 3 MiB of lists together")
	_, err = other.List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err, "another tenant's list is held back by this one's")

	end()
	require.NoError(t, <-held1, "the held list, once ended, is read")
	_, err = second.List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err, "what the lists took is given back")
	assert.Zero(t, kubeconfig.ListBytesInUse(l, "team-a"))

	// A list read under a lease keeps what it took until the lease is
	// released: client-go has closed the answer by then, and decoded it.
	ctx, giveBack := kubeconfig.WithListLease(t.Context())
	_, err = second.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Greater(t, kubeconfig.ListBytesInUse(l, "team-a"), int64(2<<20), "the decoded list's bytes were given back before the lease's release")
	giveBack()
	assert.Zero(t, kubeconfig.ListBytesInUse(l, "team-a"))
	giveBack() // twice gives back nothing more
	assert.Zero(t, kubeconfig.ListBytesInUse(l, "team-a"))
}

// What a tenant's server sends over HTTP/2 faster than client-go reads it
// waits in the connection's receive buffers, outside the tenant's budget of
// bytes being read: Go grants each stream 4 MiB and a connection 1 GiB by
// default, so each of a tenant's watches could hold megabytes the budget
// never sees (review 165). The windows the manager grants are smaller
// (1 MiB a stream): a server writing into an answer nobody reads is held to
// them.
func TestAnHTTP2AnswerNotReadIsHeldToASmallWindow(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	var written atomic.Int64
	tenant := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		chunk := bytes.Repeat([]byte(" "), 16<<10)
		for r.Context().Err() == nil && written.Load() < 64<<20 {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	tenant.EnableHTTP2 = true
	tenant.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	tenant.StartTLS()
	t.Cleanup(tenant.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cfg, err := localOf(local).RESTConfig(ctx, "tenant", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	client, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tenant.URL+"/api/v1/namespaces/x/configmaps/flood", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 2, resp.ProtoMajor, "the answer came over %s, not HTTP/2", resp.Proto)
	require.Eventually(t, func() bool { return written.Load() > 0 }, 10*time.Second, 10*time.Millisecond)
	// Unread for a second: what the server could send meanwhile is what the
	// window let through (4 MiB in well under a second by default).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		require.LessOrEqual(t, written.Load(), int64(2*kubeconfig.MaxReceiveBufferPerStream), "the server sent that much into an answer nobody read")
		time.Sleep(10 * time.Millisecond)
	}
}

// The local API server's CA is read again while the manager runs: its CA
// rotated (the kubelet updates the service account's CA file), a tenant's
// server under the new CA is the local API server, refused on the client
// made before the rotation too, at its next connection. Read once, it was
// judged not local, and connected to, until a restart (review 165).
func TestALocalCARotatedWhileRunningIsSeen(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{},"items":[]}`)
	})
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, certPEM(local.Server), 0o600))
	l := &kubeconfig.Local{Config: &rest.Config{Host: local.URL, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}}}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	doc := kubeconfig.Read(tenantKubeconfig(tenant.URL, ca))
	id, err := l.Probe(ctx, doc)
	require.NoError(t, err)
	require.False(t, id.VerifiesWithLocalCA)
	cfg, err := l.RESTConfig(ctx, "tenant", doc, false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err, "the tenant's server before the rotation")

	// The management cluster's CA rotates to the one the tenant's server
	// presents: both are served while it does.
	require.NoError(t, os.WriteFile(caFile, append(certPEM(local.Server), ca...), 0o600))
	kubeconfig.ExpireLocal(l)
	id, err = l.Probe(ctx, doc)
	require.NoError(t, err)
	assert.True(t, id.VerifiesWithLocalCA, "the rotated CA was not read")
	tenant.CloseClientConnections()
	_, err = cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.ErrorIs(t, err, kubeconfig.ErrServerIsLocal, "a connection of the client made before the rotation")
}

// A re-read of the local API server's identity that hangs (its handshake
// held up to ProbeTimeout) holds up no tenant's connection: the tenant's
// handshake starts the re-read and goes on with what was read before
// (review 167; the lock was held across the re-read, and every tenant
// handshake waited on it, up to its own timeout).
func TestAHangingReReadOfTheLocalIdentityHoldsUpNoTenant(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	// The local API server's address, through a relay that stops
	// answering once told to: a handshake then waits for its timeout.
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	var hang atomic.Bool
	var held atomic.Int32
	go func() {
		for {
			c, err := relay.Accept()
			if err != nil {
				return
			}
			if hang.Load() {
				held.Add(1)
				go func() { _, _ = io.Copy(io.Discard, c); held.Add(-1) }() // read, never answer
				continue
			}
			up, err := net.Dial("tcp", local.Listener.Addr().String())
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	cert, ca := selfSigned(t)
	tenant := newServer(t, &cert, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{},"items":[]}`)
	})
	l := &kubeconfig.Local{Config: &rest.Config{Host: "https://" + relay.Addr().String(), TLSClientConfig: rest.TLSClientConfig{CAData: certPEM(local.Server)}}}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cfg, err := l.RESTConfig(ctx, "tenant", kubeconfig.Read(tenantKubeconfig(tenant.URL, ca)), false)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	hang.Store(true)
	kubeconfig.ExpireLocal(l)
	tenant.CloseClientConnections()
	_, err = cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	// The re-read began, and has not ended (it ends only with its
	// handshake's timeout): the list did not wait for it.
	require.Eventually(t, func() bool { return held.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "the tenant's connection did not start the re-read")
	_ = relay.Close()
}

// A connection to a tenant's server that goes silent (a path that drops
// its packets: a load balancer's backend gone) is pinged and closed, so a
// watch on it ends and is made again, not held open on nothing while the
// cache says it is synced (review 191: client-go sets this health check
// only on the transports it makes).
func TestASilentConnectionToATenantIsClosed(t *testing.T) {
	defer kubeconfig.SetHTTP2HealthCheck(300*time.Millisecond, 300*time.Millisecond)()
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	tenant := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"ADDED"`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	tenant.EnableHTTP2 = true
	tenant.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	tenant.StartTLS()
	t.Cleanup(tenant.Close)
	// The path: bytes pass until it goes silent, then none either way,
	// the connection left open.
	silent := make(chan struct{})
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	go func() {
		for {
			in, err := proxy.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", tenant.Listener.Addr().String())
			if err != nil {
				in.Close()
				return
			}
			t.Cleanup(func() { in.Close(); out.Close() })
			pass := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					select {
					case <-silent:
						return
					default:
					}
					if err != nil {
						return
					}
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			go pass(out, in)
			go pass(in, out)
		}
	}()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	server := "https://" + proxy.Addr().String()
	cfg, err := localOf(local).RESTConfig(ctx, "tenant", kubeconfig.Read(tenantKubeconfig(server, ca)), false)
	require.NoError(t, err)
	client, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/apis/certificates.k8s.io/v1/certificatesigningrequests?watch=true", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 2, resp.ProtoMajor, "the answer came over %s, not HTTP/2", resp.Proto)
	first := make([]byte, 4)
	_, err = io.ReadFull(resp.Body, first)
	require.NoError(t, err)
	close(silent)
	_, err = io.Copy(io.Discard, resp.Body)
	require.Error(t, err, "the answer ended as if whole")
	assert.NoError(t, ctx.Err(), "the read ended only at the test's deadline: the silent connection was never closed")
	// Ended by the health check's unanswered ping, not by anything else
	// (review 192 F8).
	assert.ErrorContains(t, err, "client connection lost")
}

// What the client is made of is the Go side's own allow-list, whatever a
// bundle's rule lets through (review 191 F6: tested only through the
// default rule, which refuses these fields first): a token file, an exec
// plugin, an auth provider, impersonation and a proxy in the tenant's
// kubeconfig take no effect, and only the token reaches the server.
func TestOnlyWhatTheGoSideAllowsOfAKubeconfigTakesEffect(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	cert, ca := selfSigned(t)
	var headers sync.Map
	tenant := newServer(t, &cert, func(w http.ResponseWriter, r *http.Request) {
		for name := range r.Header {
			headers.Store(name, true)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","items":[]}`))
	})
	doc := string(tenantKubeconfig(tenant.URL, ca)) + `    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    as: system:admin
    as-groups: [system:masters]
    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "exit 1"], interactiveMode: Never}
    auth-provider: {name: oidc, config: {id-token: x}}
`
	doc = strings.Replace(doc, "    certificate-authority-data:", "    proxy-url: http://127.0.0.1:1\n    certificate-authority-data:", 1)
	read := kubeconfig.Read([]byte(doc))
	cfg, err := localOf(local).RESTConfig(context.Background(), "tenant", read, false)
	require.NoError(t, err)
	assert.Empty(t, cfg.BearerTokenFile)
	assert.Nil(t, cfg.ExecProvider)
	assert.Nil(t, cfg.AuthProvider)
	assert.Empty(t, cfg.Impersonate.UserName)
	assert.Empty(t, cfg.Impersonate.Groups)
	require.NoError(t, listCSRs(t, localOf(local), []byte(doc)))
	assert.Equal(t, []string{"Bearer tenant-token"}, tenant.seen(), "the server was reached otherwise than with the tenant's token, or through a proxy")
	for _, impersonation := range []string{"Impersonate-User", "Impersonate-Group"} {
		_, sent := headers.Load(impersonation)
		assert.False(t, sent, impersonation)
	}
}

// A password in the server URL, or an address longer than any API server's,
// is refused before anything is reached, whatever the bundle allowed: not
// probed, no client built. Go's client sent the password as basic
// authentication beside the tenant's certificate, and the probe's errors
// and client-go's quote the address whole, at every retry (review 236 F2,
// review 237 F5).
func TestAServerURLWithAPasswordOrOfAnyLengthIsNotReached(t *testing.T) {
	local := newServer(t, nil, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "{}", http.StatusForbidden) })
	_, ca := selfSigned(t)
	tenant, accepted := netguardtest.Listener(t)
	url := "https://" + tenant
	for name, server := range map[string]string{
		"a password":  "https://admin:s3cr3t@" + tenant,
		"a user name": "https://admin@" + tenant,
		"a long path": url + "/" + strings.Repeat("a", kubeconfig.MaxServerBytes),
	} {
		doc := kubeconfig.Read(tenantKubeconfig(server, ca))
		_, err := localOf(local).Probe(t.Context(), doc)
		require.Error(t, err, name)
		_, err2 := localOf(local).RESTConfig(t.Context(), "tenant", doc, false)
		require.Error(t, err2, name)
		for _, err := range []error{err, err2} {
			assert.NotContains(t, err.Error(), "s3cr3t", name)
			assert.Less(t, len(err.Error()), 256, name)
		}
	}
	assert.Zero(t, accepted.Load(), "the tenant's server was reached")

	bound := kubeconfig.Read(tenantKubeconfig(url+"/"+strings.Repeat("a", kubeconfig.MaxServerBytes-len(url)-1), ca))
	_, err := localOf(local).RESTConfig(t.Context(), "tenant", bound, false)
	require.NoError(t, err, "an address of the bound")
	_, _ = localOf(local).Probe(t.Context(), bound)
	assert.Equal(t, int32(1), accepted.Load(), "an address of the bound is probed")
}
