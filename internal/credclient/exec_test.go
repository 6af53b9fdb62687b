package credclient_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
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
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/credclient"
	"github.com/ichor-dev/ichor-policy/internal/execcache"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// The exec plugin prints what kubectl reads and caches it: the certificate
// it checked against its key, and nothing around it. Whoever may write a
// TalosCredentialRequest's status (or an issuer gone wrong) can answer with
// a certificate for the requester's key wrapped in terminal escapes, text
// and more PEM blocks, up to the object's size; none of it may reach
// kubectl's input, the cache or the person's terminal. Here the test
// answers each request itself, as such a writer, before any issuer could.
func TestTheExecPluginPassesOnOnlyTheCertificateItChecked(t *testing.T) {
	const namespace = "team-a"
	env, flags := adminIn(t, namespace)

	issue := forger(t)
	other, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	century := func(pub any) []byte { return issue(pub, time.Now().Add(-time.Minute), time.Now().AddDate(100, 0, 0)) }

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answered := answerEach(ctx, env, namespace, func(pub any) (string, []byte) {
		leaf := century(pub)
		return "\x1b]0;pwned\x07\x1b[2J text before\n" + string(leaf) +
			"\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaAo=\x07 text after\n" + string(century(other)) +
			strings.Repeat("padding ", 64<<10), leaf
	})

	var warn bytes.Buffer
	cacheDir := filepath.Join(t.TempDir(), "cache")
	asked := time.Now()
	cred, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
		Timeout: 30 * time.Second, Progress: io.Discard}, cacheDir, &warn)
	require.NoError(t, err, "warnings: %s", warn.String())
	// The forger's certificate says a century; the credential is reused no
	// longer than the hour asked for, counted from the request here.
	require.NotNil(t, cred.Status.ExpirationTimestamp)
	assert.False(t, cred.Status.ExpirationTimestamp.After(asked.Add(credclient.DefaultExecTTL)),
		"reused until %s, past the lifetime asked for", cred.Status.ExpirationTimestamp)
	var leaf []byte
	select {
	case leaf = <-answered:
	default:
		t.Fatal("the plugin returned without the forged answer")
	}
	require.NotNil(t, cred.Status)
	// Compared without printing them: a failure would print the padding.
	got := cred.Status.ClientCertificateData
	assert.True(t, got == string(leaf), "the plugin passed on %d bytes, not the %d of the certificate it checked", len(got), len(leaf))
	assert.False(t, strings.Contains(got+cred.Status.ClientKeyData+warn.String(), "\x1b"), "a terminal escape passed on")
	assert.Equal(t, 1, strings.Count(got, "BEGIN"), "PEM blocks passed on")

	// Nor is any of it written to an admin kubeconfig `ichor cluster
	// kubeconfig` writes from the same answer (review 171).
	out := filepath.Join(t.TempDir(), "admin.kubeconfig")
	_, err = credclient.Kubeconfig(t.Context(), credclient.Request{Kube: flags, Cluster: "prod", Out: out,
		Timeout: 30 * time.Second, Progress: io.Discard})
	require.NoError(t, err)
	written, err := clientcmd.LoadFromFile(out)
	require.NoError(t, err)
	require.Len(t, written.AuthInfos, 1)
	for _, auth := range written.AuthInfos {
		cert := string(auth.ClientCertificateData)
		assert.Equal(t, 1, strings.Count(cert, "BEGIN"), "PEM blocks written")
		assert.False(t, strings.Contains(cert, "\x1b") || strings.Contains(cert, "padding"), "the status's text was written")
	}

	// What was cached is what was printed: the next run answers from the
	// cache, without a request.
	cancel()
	again, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
		Timeout: 5 * time.Second, Progress: io.Discard}, cacheDir, &warn)
	require.NoError(t, err, "warnings: %s", warn.String())
	assert.True(t, again.Status.ClientCertificateData == got, "the cache gave back %d bytes, not the %d printed", len(again.Status.ClientCertificateData), len(got))
	var list ichorv1alpha1.TalosCredentialRequestList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(namespace)))
	assert.Len(t, list.Items, 2, "the second run asked again instead of reading the cache (the kubeconfig asked once)")
}

// The answer is read by name: a request deleted and made again under that
// name, with the requester's own public key and another purpose, is
// another's, never this request's answer; and a wait the person interrupts
// says so, not that the manager did not answer (review of 2026-12-06).
func TestTheAnswerIsTheRequestsOwnAndAnInterruptIsNoTimeout(t *testing.T) {
	const namespace = "team-b"
	env, flags := adminIn(t, namespace)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	replaced := make(chan struct{})
	go func() {
		for ctx.Err() == nil {
			var list ichorv1alpha1.TalosCredentialRequestList
			if err := env.Client.List(ctx, &list, client.InNamespace(namespace)); err == nil && len(list.Items) == 1 {
				old := list.Items[0]
				if env.Client.Delete(ctx, &old) == nil {
					again := &ichorv1alpha1.TalosCredentialRequest{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: old.Name}, Spec: old.Spec}
					again.Spec.Purpose = ichorv1alpha1.PurposeKubeconfigSuperAdmin
					if env.Client.Create(ctx, again) == nil {
						close(replaced)
						return
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	_, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
		Timeout: 30 * time.Second, Progress: io.Discard}, "", io.Discard)
	select {
	case <-replaced:
	case <-time.After(time.Minute):
		t.Fatalf("the request was never made again: %v", err)
	}
	// A read between the deletion and the creation finds none, which ends
	// the wait too (its own words); either way, never the other's answer,
	// nor a wait on it until the timeout.
	require.Error(t, err)
	if !strings.Contains(err.Error(), "was deleted before this command read an answer") {
		require.ErrorContains(t, err, "was deleted and made again by someone else before it was answered")
	}

	// Nobody answers; the person interrupts the wait.
	waiting, stop := context.WithCancel(t.Context())
	time.AfterFunc(2*time.Second, stop)
	_, err = credclient.ExecCredential(waiting, credclient.Request{Kube: flags, Cluster: "prod",
		Timeout: time.Minute, Progress: io.Discard}, "", io.Discard)
	require.ErrorContains(t, err, "stopped waiting for TalosCredentialRequest")
	assert.ErrorIs(t, err, context.Canceled)
}

// forger is an issuer of its own, as whoever may write a request's status
// (or an issuer gone wrong) would sign: a certificate for pub valid from
// notBefore to notAfter.
func forger(t *testing.T) func(pub any, notBefore, notAfter time.Time) []byte {
	t.Helper()
	return forgerOf(t, pkix.Name{CommonName: "ichor-admin:ada", Organization: []string{"ichor:admins"}}, x509.ExtKeyUsageClientAuth)
}

// forgerOf is forger of certificates of subject and usage.
func forgerOf(t *testing.T, subject pkix.Name, usage x509.ExtKeyUsage) func(pub any, notBefore, notAfter time.Time) []byte {
	t.Helper()
	_, caKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "forger"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	return func(pub any, notBefore, notAfter time.Time) []byte {
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2),
			Subject:   subject,
			NotBefore: notBefore, NotAfter: notAfter,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}}, ca, pub, caKey)
		require.NoError(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
}

// A kubeconfig written for the server reaches it as yours does: through
// the proxy your kubeconfig or --proxy-url names (review 186: it was
// dropped, and the admin kubeconfig dialled the server directly, past a
// proxy the network requires), the exec kubeconfig too; and the expiry said
// is the certificate's own, not what the status claims.
func TestAWrittenKubeconfigGoesThroughYourProxy(t *testing.T) {
	const namespace = "team-a"
	env, flags := adminIn(t, namespace)
	proxy, tunnels := connectProxy(t)
	*flags.ProxyURL = proxy

	issue := forger(t)
	notAfter := time.Now().Add(30 * time.Minute).Truncate(time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answerEach(ctx, env, namespace, func(pub any) (string, []byte) {
		leaf := issue(pub, time.Now().Add(-time.Minute), notAfter)
		return string(leaf), leaf
	})

	out := filepath.Join(t.TempDir(), "admin.kubeconfig")
	w, err := credclient.Kubeconfig(t.Context(), credclient.Request{Kube: flags, Cluster: "prod", Out: out,
		Timeout: 30 * time.Second, Progress: io.Discard})
	require.NoError(t, err)
	assert.NotZero(t, tunnels.Load(), "the request itself did not go through the proxy")
	assert.Equal(t, notAfter.UTC().Format(time.RFC3339), w.Expires, "the status's expiresAt (an hour) was said, not the certificate's date")
	execOut := filepath.Join(t.TempDir(), "exec.kubeconfig")
	_, err = credclient.ExecKubeconfig(t.Context(), credclient.Request{Kube: flags, Cluster: "prod", Out: execOut,
		Timeout: 30 * time.Second, Progress: io.Discard}, credclient.ExecPlugin{Command: "ichor"})
	require.NoError(t, err)
	for _, path := range []string{out, execOut} {
		written, err := clientcmd.LoadFromFile(path)
		require.NoError(t, err)
		require.Len(t, written.Clusters, 1)
		for _, c := range written.Clusters {
			assert.Equal(t, proxy, c.ProxyURL, filepath.Base(path))
		}
	}
}

// A person who may create a request but not read it gets no answer: said
// at once, naming the verb, not waited out and blamed on the manager
// (review 186: under kubectl the plugin waited its two minutes, then said
// "is the Ichor manager running?").
func TestAnAnswerYouMayNotReadIsSaidSo(t *testing.T) {
	const namespace = "team-a"
	env, _ := adminIn(t, namespace)
	const user = "ichor:cleo"
	require.NoError(t, env.Client.Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "ask-only"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create"}}},
	}))
	require.NoError(t, env.Client.Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "cleo-ask-only"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ask-only"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}))
	require.NoError(t, env.WaitAllowed(t.Context(), user, nil, authorizationv1.ResourceAttributes{Namespace: namespace, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"}))
	cfg, err := env.UserConfig(user)
	require.NoError(t, err)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["cleo"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["cleo"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "cleo", Namespace: namespace}
	kc.CurrentContext = "cleo"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	flags := kube.NewConfigFlags()
	*flags.KubeConfig = path

	_, err = credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
		Timeout: time.Minute, Progress: io.Discard}, "", io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "for its answer was refused")
	assert.Contains(t, err.Error(), "needs get on taloscredentialrequests.ichor.dev")
	assert.NotContains(t, err.Error(), "is the Ichor manager running")
}

// connectProxy is an HTTP proxy that tunnels CONNECT requests, and counts
// them.
func connectProxy(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	var tunnels atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		upstream, err := net.Dial("tcp", r.Host) //nolint:gosec // a test proxy: it tunnels to the API server the test client names
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer upstream.Close()
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		tunnels.Add(1)
		_, _ = io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
		go func() { _, _ = io.Copy(upstream, rw) }()
		_, _ = io.Copy(conn, upstream)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &tunnels
}

// answerEach answers each unanswered request of namespace, before any
// issuer could, with the status certificate answer makes for the
// requester's key, and sends the certificate answer says it made.
func answerEach(ctx context.Context, env *harness.Env, namespace string, answer func(pub any) (certificate string, leaf []byte)) <-chan []byte {
	answered := make(chan []byte, 1)
	statusEach(ctx, env, namespace, func(tcr *ichorv1alpha1.TalosCredentialRequest) func() {
		block, _ := pem.Decode([]byte(tcr.Spec.PublicKey))
		pub, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil
		}
		certificate, leaf := answer(pub)
		tcr.Status.Certificate = certificate
		tcr.Status.ExpiresAt = ptr.To(metav1.NewTime(time.Now().Add(time.Hour)))
		meta.SetStatusCondition(&tcr.Status.Conditions, metav1.Condition{Type: ichorv1alpha1.ConditionReady,
			Status: metav1.ConditionTrue, Reason: ichorv1alpha1.ReasonIssued, Message: "\x1b]0;pwned\x07 issued"})
		return func() {
			select {
			case answered <- leaf:
			default:
			}
		}
	})
	return answered
}

// statusEach gives each unanswered request of namespace the status answer
// writes into it, before any issuer could, until ctx ends; answer returns
// what to do once it is written, nil for a request it does not answer.
func statusEach(ctx context.Context, env *harness.Env, namespace string, answer func(*ichorv1alpha1.TalosCredentialRequest) (written func())) {
	go func() {
		for ctx.Err() == nil {
			var list ichorv1alpha1.TalosCredentialRequestList
			if err := env.Client.List(ctx, &list, client.InNamespace(namespace)); err == nil {
				for i := range list.Items {
					tcr := &list.Items[i]
					if meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady) != nil {
						continue
					}
					written := answer(tcr)
					if written != nil && env.Client.Status().Update(ctx, tcr) == nil {
						written()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// A refusal by the rules is held for execcache.RefusalHold: the runs within
// it are refused from the cache, without a request, so that a client that
// retries (k9s) does not ask the management server every few seconds
// (review 253 F4). A failure to issue is not held, nor is a refusal file
// the plugin did not write; a refusal's file removed, the next run asks.
func TestTheExecPluginHoldsARefusalNotAFailure(t *testing.T) {
	const namespace = "team-h"
	env, flags := adminIn(t, namespace)
	var mu sync.Mutex
	reason := ichorv1alpha1.ReasonFailed
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	statusEach(ctx, env, namespace, func(tcr *ichorv1alpha1.TalosCredentialRequest) func() {
		mu.Lock()
		defer mu.Unlock()
		meta.SetStatusCondition(&tcr.Status.Conditions, metav1.Condition{Type: ichorv1alpha1.ConditionReady,
			Status: metav1.ConditionFalse, Reason: reason, Message: "NotAuthorized: user \"ichor:ada\" may not download"})
		return func() {}
	})
	requests := func() int {
		var list ichorv1alpha1.TalosCredentialRequestList
		require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(namespace)))
		return len(list.Items)
	}
	cacheDir := filepath.Join(t.TempDir(), "cache")
	ask := func() (string, error) {
		var warn bytes.Buffer
		_, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
			Timeout: 30 * time.Second, Progress: io.Discard}, cacheDir, &warn)
		require.Error(t, err)
		return warn.String(), err
	}

	// Failed: not held, each run asks.
	_, err := ask()
	assert.Contains(t, err.Error(), "was not issued (Failed)")
	_, err = ask()
	assert.NotContains(t, err.Error(), "held")
	assert.Equal(t, 2, requests(), "a failure to issue was held")

	// Refused: held, the next run asks nothing.
	mu.Lock()
	reason = ichorv1alpha1.ReasonRefused
	mu.Unlock()
	_, err = ask()
	assert.Contains(t, err.Error(), "was not issued (Refused): NotAuthorized")
	assert.Equal(t, 3, requests())
	warn, err := ask()
	assert.Empty(t, warn)
	assert.ErrorAs(t, err, new(credclient.RefusedError))
	assert.Contains(t, err.Error(), "was not issued (Refused): NotAuthorized")
	assert.Contains(t, err.Error(), "and held: asked again from")
	assert.Equal(t, 3, requests(), "a held refusal was asked again")

	// A refusal file that holds longer than the plugin holds one is not
	// the plugin's: said, and asked.
	entries, err := os.ReadDir(cacheDir)
	require.NoError(t, err)
	var refusal string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".refusal") {
			refusal = filepath.Join(cacheDir, e.Name())
		}
	}
	require.NotEmpty(t, refusal, "no refusal file in %v", entries)
	data, err := os.ReadFile(refusal)
	require.NoError(t, err)
	var held execcache.Refusal
	require.NoError(t, json.Unmarshal(data, &held))
	held.Until = held.Until.AddDate(1, 0, 0)
	forged, err := json.Marshal(held)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(refusal, forged, 0o600))
	warn, _ = ask()
	assert.Contains(t, warn, "ignoring the refusal held in "+refusal)
	assert.Equal(t, 4, requests(), "a forged refusal was believed")

	// Removed, as the message says: asked at once.
	require.NoError(t, os.Remove(refusal))
	_, _ = ask()
	assert.Equal(t, 5, requests())
}

// The credential is reused for its lifetime counted on this machine's
// clock, whatever the certificate's dates say: a clock here ahead of the
// issuer's by more than the lifetime (here, a certificate that ended an
// hour ago by this clock) made each credential due at once, and kubectl,
// which asks again when the expiry it was told is past, asked for a new
// one before each of its requests (review 164). A certificate valid for no
// time is refused.
func TestTheExecPluginCountsTheLifetimeOnThisMachinesClock(t *testing.T) {
	const namespace = "team-c"
	env, flags := adminIn(t, namespace)
	issue := forger(t)
	var mu sync.Mutex
	window := [2]time.Duration{-2 * time.Hour, -time.Hour}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answerEach(ctx, env, namespace, func(pub any) (string, []byte) {
		mu.Lock()
		defer mu.Unlock()
		leaf := issue(pub, time.Now().Add(window[0]), time.Now().Add(window[1]))
		return string(leaf), leaf
	})

	cacheDir := filepath.Join(t.TempDir(), "cache")
	ask := func() (*clientauthv1.ExecCredential, error) {
		var warn bytes.Buffer
		cred, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
			Timeout: 30 * time.Second, Progress: io.Discard}, cacheDir, &warn)
		assert.Empty(t, warn.String())
		return cred, err
	}
	asked := time.Now()
	cred, err := ask()
	require.NoError(t, err)
	expires := cred.Status.ExpirationTimestamp.Time
	assert.True(t, expires.After(time.Now()), "kubectl was told the credential is due already: %s", expires)
	assert.False(t, expires.After(asked.Add(credclient.DefaultExecTTL)), "reused past the lifetime asked for: %s", expires)
	_, err = ask()
	require.NoError(t, err)
	var list ichorv1alpha1.TalosCredentialRequestList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(namespace)))
	assert.Equal(t, 1, len(list.Items), "the second run asked again instead of reading the cache")

	mu.Lock()
	window = [2]time.Duration{time.Hour, -time.Hour}
	mu.Unlock()
	cacheDir = ""
	_, err = ask()
	require.ErrorContains(t, err, "valid for no time")
}

// An answer that is not an admin's client certificate is neither printed
// nor cached, nor written to a kubeconfig: one in group system:masters (the
// break-glass kubeconfig's, which an admin kubeconfig never is), or one for
// servers (reviews 164, 170).
func TestTheExecPluginUsesOnlyAnAdminsClientCertificate(t *testing.T) {
	const namespace = "team-e"
	env, flags := adminIn(t, namespace)
	var mu sync.Mutex
	issue := forgerOf(t, pkix.Name{CommonName: "ichor-admin:ada", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answerEach(ctx, env, namespace, func(pub any) (string, []byte) {
		mu.Lock()
		defer mu.Unlock()
		leaf := issue(pub, time.Now(), time.Now().Add(time.Hour))
		return string(leaf), leaf
	})
	cacheDir := filepath.Join(t.TempDir(), "cache")
	ask := func() error {
		_, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
			Timeout: 30 * time.Second, Progress: io.Discard}, cacheDir, io.Discard)
		return err
	}
	require.ErrorContains(t, ask(), "in group system:masters")
	// Nor written to the admin kubeconfig `ichor cluster kubeconfig`
	// writes (review 170).
	out := filepath.Join(t.TempDir(), "admin.kubeconfig")
	_, err := credclient.Kubeconfig(t.Context(), credclient.Request{Kube: flags, Cluster: "prod", Out: out,
		Timeout: 30 * time.Second, Progress: io.Discard})
	require.ErrorContains(t, err, "in group system:masters")
	assert.NoFileExists(t, out)
	mu.Lock()
	issue = forgerOf(t, pkix.Name{CommonName: "ichor-admin:ada", Organization: []string{"ichor:admins"}}, x509.ExtKeyUsageServerAuth)
	mu.Unlock()
	require.ErrorContains(t, ask(), "not for client authentication")
	entries, err := os.ReadDir(cacheDir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.HasSuffix(e.Name(), ".json"), "cached: %s", e.Name())
	}

	// A reader's talosconfig holds os:reader alone, never os:admin under
	// its name (review 171).
	mu.Lock()
	issue = forgerOf(t, pkix.Name{Organization: []string{"os:admin"}}, x509.ExtKeyUsageClientAuth)
	mu.Unlock()
	t.Setenv("TALOSCONFIG", filepath.Join(t.TempDir(), "talosconfig"))
	talosOut := filepath.Join(t.TempDir(), "reader.talosconfig")
	_, err = credclient.Talosconfig(t.Context(), credclient.Request{Kube: flags, Cluster: "prod", Out: talosOut,
		TalosEndpoints: []string{"10.5.0.2"}, Timeout: 30 * time.Second, Progress: io.Discard})
	require.ErrorContains(t, err, `not os:reader alone`)
	assert.NoFileExists(t, talosOut)
}

// Runs of the plugin at once with nothing cached (kubectl commands in
// parallel, k9s's) ask once between them: each waits for the cache's lock
// and reads what the first run cached (review 164: no test held it).
func TestParallelRunsOfTheExecPluginAskOnce(t *testing.T) {
	const namespace = "team-d"
	env, flags := adminIn(t, namespace)
	issue := forger(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answerEach(ctx, env, namespace, func(pub any) (string, []byte) {
		leaf := issue(pub, time.Now(), time.Now().Add(time.Hour))
		return string(leaf), leaf
	})

	cacheDir := filepath.Join(t.TempDir(), "cache")
	const runs = 4
	certs := make([]string, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			cred, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
				Timeout: 30 * time.Second, Progress: io.Discard}, cacheDir, io.Discard)
			if assert.NoError(t, err) {
				certs[i] = cred.Status.ClientCertificateData
			}
		})
	}
	wg.Wait()
	var list ichorv1alpha1.TalosCredentialRequestList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(namespace)))
	assert.Equal(t, 1, len(list.Items), "runs at once asked more than once")
	for i := 1; i < runs; i++ {
		assert.True(t, certs[i] == certs[0], "run %d was given another credential", i)
	}
}

// A management server that accepts the connection and never answers ends
// the plugin within its timeout, the API's discovery included, which
// takes no context: kubectl runs the plugin with no deadline, holding
// every request of its process meanwhile, and the cache's lock holds every
// other run (review 164).
func TestTheExecPluginEndsWhenTheServerNeverAnswers(t *testing.T) {
	hold := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hold) })
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["silent"] = &clientcmdapi.Cluster{Server: srv.URL, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["ada"] = &clientcmdapi.AuthInfo{Token: "a-token"}
	cfg.Contexts["silent"] = &clientcmdapi.Context{Cluster: "silent", AuthInfo: "ada", Namespace: "team-a"}
	cfg.CurrentContext = "silent"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, kubeconfig))
	flags := kube.NewConfigFlags()
	*flags.KubeConfig = kubeconfig

	done := make(chan error, 1)
	go func() {
		_, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
			Timeout: time.Second, Progress: io.Discard}, filepath.Join(t.TempDir(), "cache"), io.Discard)
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "did not answer within 1s")
	case <-time.After(time.Minute):
		t.Fatal("the plugin still waits on a server that never answers")
	}
}

// adminIn starts a control plane with namespace, and kubectl's flags of its
// admin there.
func adminIn(t *testing.T, namespace string) (*harness.Env, *genericclioptions.ConfigFlags) {
	t.Helper()
	env := harness.StartForTest(t, harness.Options{})
	require.NoError(t, env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, env.AdminKubeconfig, 0o600))
	flags := kube.NewConfigFlags()
	*flags.KubeConfig = kubeconfig
	*flags.Namespace = namespace
	return env, flags
}

// A 403 of the API server that is not the webhook's denial (a quota, a
// namespace being deleted, RBAC) is not held: a quota frees up as answered
// requests are deleted, and the next run must ask (review 259 F3).
func TestTheExecPluginDoesNotHoldAQuotasRefusal(t *testing.T) {
	const namespace = "team-q"
	env, flags := adminIn(t, namespace)
	none := corev1.ResourceList{"count/taloscredentialrequests.ichor.dev": resource.MustParse("0")}
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "no-requests"},
		Spec:       corev1.ResourceQuotaSpec{Hard: none},
	}
	require.NoError(t, env.Client.Create(t.Context(), quota))
	// No quota controller runs here: its status is written as it would.
	quota.Status = corev1.ResourceQuotaStatus{Hard: none, Used: none}
	require.NoError(t, env.Client.Status().Update(t.Context(), quota))
	cacheDir := filepath.Join(t.TempDir(), "cache")
	var warn bytes.Buffer
	_, err := credclient.ExecCredential(t.Context(), credclient.Request{Kube: flags, Cluster: "prod",
		Timeout: 30 * time.Second, Progress: io.Discard}, cacheDir, &warn)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "quota")
	assert.NotErrorAs(t, err, new(credclient.RefusedError))
	refusals, globErr := filepath.Glob(filepath.Join(cacheDir, "*.refusal"))
	require.NoError(t, globErr)
	assert.Empty(t, refusals, "a quota's refusal was held")
}
