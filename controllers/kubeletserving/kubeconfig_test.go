package kubeletserving_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// recorder is a tenant's server: it records every connection and every
// Authorization header it is sent.
type recorder struct {
	*httptest.Server

	mu    sync.Mutex
	conns int
	auth  []string
	certs int
}

func newRecorder(t *testing.T, useTLS bool) *recorder {
	t.Helper()
	return newRecorderOn(t, useTLS, "")
}

// newRecorderOn is newRecorder listening on addr (httptest's loopback
// address when empty).
func newRecorderOn(t *testing.T, useTLS bool, addr string) *recorder {
	t.Helper()
	r := &recorder{}
	r.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		if req.TLS != nil {
			r.certs += len(req.TLS.PeerCertificates)
		}
		r.mu.Unlock()
		http.Error(w, "no", http.StatusForbidden)
	}))
	if addr != "" {
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		_ = r.Listener.Close()
		r.Listener = l
	}
	r.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.mu.Lock()
			r.conns++
			r.mu.Unlock()
		}
	}
	if useTLS {
		r.TLS = &tls.Config{ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12}
		r.StartTLS()
	} else {
		r.Start()
	}
	t.Cleanup(r.Close)
	return r
}

// untouched checks that the server was never connected to, so no credential
// reached it.
func (r *recorder) untouched(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Zero(t, r.conns, "the tenant's server was connected to")
	assert.Empty(t, r.auth, "the tenant's server received requests, with these Authorization headers")
	assert.Zero(t, r.certs, "the tenant's server received a client certificate")
}

// kubeconfigDoc is a kubeconfig of one cluster, user and context, with
// the given lines added under the cluster and the user.
func kubeconfigDoc(server, clusterLines, userLines string) string {
	return `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: ` + server + `
` + clusterLines + `contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
users:
- name: u
  user:
` + userLines
}

// remoteCluster creates a TalosCluster whose kubeconfigRef is the document,
// in a Secret that names it.
func remoteCluster(t *testing.T, name, doc string) *fixture {
	t.Helper()
	return remoteClusterClaimedBy(t, name, doc, "tenant")
}

// remoteClusterClaimedBy is remoteCluster with the Secret naming claim
// (ichorv1alpha1.SecretsClaimAnnotation) for the clusters that may use it.
func remoteClusterClaimedBy(t *testing.T, name, doc, claim string) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := "kubeconfig-" + name
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(ns, "talos-secrets")))
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubeconfig", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: claim}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(doc)},
	}))
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion:  "v1.14",
			SecretsRef:    ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			KubeconfigRef: &ichorv1alpha1.KubeconfigReference{Name: "kubeconfig"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true,
			}},
		},
	}
	require.NoError(t, env.Client.Create(ctx, cluster))
	return &fixture{t: t, ctx: ctx, ns: ns, cluster: cluster.Name}
}

// kubeconfigEntry is a decision-log entry of the kubeconfig rule.
type kubeconfigEntry struct {
	Path  string `json:"path"`
	Input struct {
		Cluster engine.KubeconfigCluster `json:"cluster"`
	} `json:"input"`
	Result engine.KubeconfigDecision `json:"result"`
}

func kubeconfigEntries(f *fixture) []kubeconfigEntry {
	return harness.Decisions(decisionLog, func(e kubeconfigEntry) bool {
		return e.Path == engine.PathKubeconfig && e.Input.Cluster.Namespace == f.ns && e.Input.Cluster.Name == f.cluster
	})
}

// waitRefused waits for the cluster's condition to say the kubeconfig is
// refused with every code, and checks the Event and the decision log.
func (f *fixture) waitRefused(codes ...string) metav1.Condition {
	f.t.Helper()
	var got *metav1.Condition
	require.Eventually(f.t, func() bool {
		got = meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return got != nil && got.Status == metav1.ConditionFalse && got.Reason == kubeletserving.ReasonKubeconfigRefused
	}, wait, 100*time.Millisecond, "the kubeconfig of %s was not refused: %+v", f.ns, got)
	for _, code := range codes {
		assert.Contains(f.t, got.Message, code+": ")
	}
	require.Eventually(f.t, func() bool {
		var list eventsv1.EventList
		require.NoError(f.t, env.Client.List(f.ctx, &list))
		for _, e := range list.Items {
			if e.Regarding.Kind == "TalosCluster" && e.Regarding.Namespace == f.ns && e.Reason == kubeletserving.ReasonKubeconfigRefused {
				return true
			}
		}
		return false
	}, wait, 200*time.Millisecond, "no KubeconfigRefused Event on %s", f.ns)
	entries := kubeconfigEntries(f)
	require.NotEmpty(f.t, entries)
	last := entries[len(entries)-1]
	assert.False(f.t, last.Result.Allowed)
	assert.Subset(f.t, last.Result.Reasons.Codes(), codes)
	return *got
}

// Each way a kubeconfig could make the manager act for a tenant is refused
// on its fields, and the server it names is never connected to.
func TestKubeconfigRefusedOnItsFieldsConnectsToNothing(t *testing.T) {
	dir := t.TempDir()
	// The manager's own token, as a file the tenant names.
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("the-managers-own-token"), 0o600))
	// A client certificate and key the manager holds.
	user, err := env.UserConfig("the-manager")
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, user.CertData, 0o600))
	require.NoError(t, os.WriteFile(keyFile, user.KeyData, 0o600))
	marker := filepath.Join(dir, "exec-ran")
	data := "    token: tenant-token\n"

	cases := []struct {
		name                  string
		cluster, user         string
		codes                 []string
		proxy, plain, unknown bool
	}{
		{name: "tokenfile", user: "    tokenFile: " + token + "\n", codes: []string{"PathField", "CredentialsMissing"}},
		{name: "cert-paths", user: "    client-certificate: " + certFile + "\n    client-key: " + keyFile + "\n", codes: []string{"PathField"}},
		{name: "ca-path", cluster: "    certificate-authority: " + certFile + "\n", user: data, codes: []string{"PathField"}},
		{name: "exec", user: "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'touch " + marker + "']\n      interactiveMode: Never\n", codes: []string{"ExecPlugin"}},
		{name: "auth-provider", user: "    auth-provider:\n      name: oidc\n      config: {id-token: stolen, idp-issuer-url: 'https://issuer.invalid'}\n", codes: []string{"AuthProvider"}},
		{name: "proxy-url", user: data, codes: []string{"ProxyURL"}, proxy: true},
		{name: "insecure", cluster: "    insecure-skip-tls-verify: true\n", user: data, codes: []string{"InsecureSkipTLSVerify"}},
		{name: "impersonation", user: data + "    as: system:admin\n    as-groups: [system:masters]\n", codes: []string{"Impersonation"}},
		{name: "unknown-field", user: data + "    tokenfile: " + token + "\n", codes: []string{"UnknownField"}},
		{name: "plain-http", user: data, codes: []string{"ServerNotHTTPS"}, plain: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server := newRecorder(t, !c.plain)
			clusterLines := c.cluster
			proxy := newRecorder(t, false)
			if c.proxy {
				clusterLines += "    proxy-url: " + proxy.URL + "\n"
			}
			if !c.plain && !strings.Contains(c.cluster, "insecure") {
				clusterLines += "    certificate-authority-data: " + base64.StdEncoding.EncodeToString(pemOf(server.Certificate().Raw)) + "\n"
			}
			// Checked even when the refusal never comes: what reached the
			// tenant's servers is the attack.
			t.Cleanup(func() {
				server.untouched(t)
				proxy.untouched(t)
				assert.NoFileExists(t, marker, "the exec command ran in the manager")
			})
			f := remoteCluster(t, c.name, kubeconfigDoc(server.URL, clusterLines, c.user))
			cond := f.waitRefused(c.codes...)
			assert.NotContains(t, cond.Message, "the-managers-own-token")
		})
	}
}

// A kubeconfigRef Secret that does not name the cluster is not used: whoever
// may write a TalosCluster but not the Secret would otherwise have another
// cluster's API server judged with this cluster's machines, deny its
// kubelets' requests, and cache its CSRs again against the namespace's
// bounds (review of 2026-12-05). Nothing is judged or sent to the server,
// and the cluster says why.
func TestAKubeconfigSecretThatDoesNotNameTheClusterIsNotUsed(t *testing.T) {
	server := newRecorder(t, true)
	t.Cleanup(func() { server.untouched(t) })
	doc := kubeconfigDoc(server.URL, "    certificate-authority-data: "+base64.StdEncoding.EncodeToString(pemOf(server.Certificate().Raw))+"\n", "    token: prod-token\n")

	f := remoteClusterClaimedBy(t, "unclaimed", doc, "prod")

	c := f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse)
	assert.Equal(t, kubeletserving.ReasonKubeconfigUnreadable, c.Reason)
	assert.Contains(t, c.Message, `Secret "kubeconfig": the Secret does not name this TalosCluster: its annotation ichor.dev/talos-clusters names "prod", not "tenant"`)
	assert.NotContains(t, c.Message, "prod-token")
	assert.Empty(t, kubeconfigEntries(f), "nothing judged")
}

// A kubeconfig whose server is in a network the manager does not connect to
// for a tenant (this suite's manager denies deniedHost, standing for the
// manager's loopback and the node's link, which the default denies: the
// other tests' servers are on 127.0.0.1) is not reached at all, neither probed nor sent
// the tenant's credential, whether it is named by its address or by that
// address written as IPv6, and the cluster says why.
func TestAServerInADeniedNetworkIsNeverReached(t *testing.T) {
	for i, host := range []string{deniedHost, "[::ffff:" + deniedHost + "]"} {
		server := newRecorderOn(t, true, net.JoinHostPort(deniedHost, "0"))
		t.Cleanup(func() { server.untouched(t) })
		_, port, err := net.SplitHostPort(server.Listener.Addr().String())
		require.NoError(t, err)
		doc := kubeconfigDoc("https://"+host+":"+port, "    certificate-authority-data: "+base64.StdEncoding.EncodeToString(pemOf(server.Certificate().Raw))+"\n", "    token: tenant-token\n")

		f := remoteCluster(t, fmt.Sprintf("denied-%d", i), doc)

		c := f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse)
		assert.Equal(t, kubeletserving.ReasonRemoteServerAddressRefused, c.Reason, c.Message)
		assert.Contains(t, c.Message, "address "+deniedHost+" is in "+deniedHost+"/32, a network the manager does not connect to: nothing was sent to it")
	}
}

// A kubeconfig is judged once per content: another reconcile of the cluster
// logs no new decision, and a new content is judged again.
func TestKubeconfigIsJudgedOncePerContent(t *testing.T) {
	server := newRecorder(t, true)
	f := remoteCluster(t, "once", kubeconfigDoc(server.URL, "", "    tokenFile: /etc/hostname\n"))
	f.waitRefused("PathField")
	require.Len(t, kubeconfigEntries(f), 1)

	// A change of the cluster reconciles it again; its condition follows
	// the new generation.
	c := f.get()
	c.Spec.TalosVersion = "v1.15"
	require.NoError(t, env.Client.Update(f.ctx, c))
	require.Eventually(t, func() bool {
		c := f.get()
		got := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return got != nil && got.ObservedGeneration == c.Generation
	}, wait, 100*time.Millisecond)
	assert.Len(t, kubeconfigEntries(f), 1, "the same kubeconfig was judged again")

	// Another content is judged.
	var s corev1.Secret
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "kubeconfig"}, &s))
	s.Data[ichorv1alpha1.DefaultKubeconfigKey] = []byte(kubeconfigDoc(server.URL, "", "    exec: {command: /bin/true, apiVersion: client.authentication.k8s.io/v1}\n"))
	require.NoError(t, env.Client.Update(f.ctx, &s))
	require.Eventually(t, func() bool {
		got := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return got != nil && strings.Contains(got.Message, "ExecPlugin")
	}, wait, 200*time.Millisecond)
	assert.Len(t, kubeconfigEntries(f), 2)
	server.untouched(t)
}

// Two contexts and no current-context: which is meant is a guess.
func TestKubeconfigWithTwoContextsAndNoCurrentIsRefused(t *testing.T) {
	server := newRecorder(t, true)
	doc := strings.Replace(kubeconfigDoc(server.URL, "", "    token: t\n"), "current-context: x\n", "", 1)
	doc = strings.Replace(doc, "contexts:\n", "contexts:\n- name: second\n  context: {cluster: c, user: u}\n", 1)
	f := remoteCluster(t, "two-contexts", doc)
	f.waitRefused("ContextAmbiguous")
	server.untouched(t)
}

// The API server the manager runs against, named by another name and with
// credentials given as data, is refused: only --local-clusters names the
// clusters that judge it. Its credential never reaches the decision log.
func TestKubeconfigOfTheManagersOwnAPIServerIsRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"as-is":      string(env.AdminKubeconfig),
		"other-name": strings.Replace(string(env.AdminKubeconfig), "127.0.0.1", "localhost", 1),
	} {
		t.Run(name, func(t *testing.T) {
			require.Contains(t, doc, "client-key-data")
			f := remoteCluster(t, "local-"+name, doc)
			f.waitRefused("ServerIsLocal")
			entries := kubeconfigEntries(f)
			require.Len(t, entries, 2, "one decision on the document, one on its server")
			assert.True(t, entries[0].Result.CheckIdentity)
			b, err := json.Marshal(harness.Decisions(decisionLog, func(e json.RawMessage) bool { return strings.Contains(string(e), f.ns) }))
			require.NoError(t, err)
			assert.NotContains(t, string(b), base64.StdEncoding.EncodeToString(env.Config.KeyData))
		})
	}
}

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// A tenant's server that passes the identity check and then never answers
// holds its own cluster's work (the cache sync waits up to 30 s, the
// transport up to kubeconfig.ResponseHeaderTimeout for any answer), and no
// other: a local cluster's kubelet gets its certificate while the tenant's
// first request is still unanswered.
func TestAStallingRemoteServerDoesNotDelayALocalCluster(t *testing.T) {
	release := make(chan struct{})
	var (
		mu       sync.Mutex
		requests int
		paths    []string
		done     = map[int]bool{}
	)
	stall := httptest.NewTLSServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		paths = append(paths, r.URL.Path)
		n := requests
		mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-release:
		}
		mu.Lock()
		done[n] = true
		mu.Unlock()
	}))
	t.Cleanup(stall.Close)
	t.Cleanup(func() { close(release) })
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: stall.Certificate().Raw}))
	remote := remoteCluster(t, "stall", kubeconfigDoc(stall.URL, "    certificate-authority-data: "+ca+"\n", "    token: tenant-token\n"))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: remote.ns, Name: remote.cluster}})
	})
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return requests > 0
	}, wait, 50*time.Millisecond, "the tenant's server was never asked")
	mu.Lock()
	// Review 7 H2: the first request is the watch's list, which the cache
	// sync bounds, not a discovery of the server's kinds, which nothing did.
	assert.Equal(t, "/apis/certificates.k8s.io/v1/certificatesigningrequests", paths[0])
	mu.Unlock()

	f := newFixture(t, false)
	f.machine("stall-local-1", "10.20.77.2")
	kubelet, err := env.StartKubelet(f.ctx, harness.KubeletOptions{
		NodeName: "stall-local-1", DNSNames: []string{"stall-local-1"}, IPs: []net.IP{net.ParseIP("10.20.77.2")},
	})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)
	ctx, cancel := context.WithTimeout(f.ctx, wait)
	defer cancel()
	_, err = kubelet.WaitForCertificate(ctx)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.False(t, done[1], "the local cluster's kubelet waited for the tenant's stalled request to end")
}

// stallingProxy is a tenant's API server that answers everything but its
// first approval write, which it holds until the client gives up: the
// server behind it is cfg's, reached with cfg's credentials. It returns the
// tenant's kubeconfig, and how many approval writes it held and saw given up.
func stallingProxy(t *testing.T, cfg *rest.Config) (doc string, stalls func() (held, gaveUp int64)) {
	t.Helper()
	target, err := url.Parse(cfg.Host)
	require.NoError(t, err)
	transport, err := rest.TransportFor(cfg)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // watches stream
	var held, gaveUp atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The tenant's token is not the server's: cfg's credentials are.
		r.Header.Del("Authorization")
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/approval") && held.CompareAndSwap(0, 1) {
			// Read to the end, so that the server notices the client
			// hanging up (its context ends).
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
				gaveUp.Add(1)
			case <-release:
			}
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	return kubeconfigDoc(srv.URL, "    certificate-authority-data: "+ca+"\n", "    token: tenant-token\n"),
		func() (int64, int64) { return held.Load(), gaveUp.Load() }
}

// hold is one request a stalling tenant server held, from its arrival until
// the client gave up.
type hold struct {
	tenant     string
	start, end time.Time
}

// Review 8 M3: starting the watch of a tenant's API server waits for that
// server (its TLS probe, the list its cache syncs from), and holds a
// reconcile worker meanwhile; the four are every cluster's. So at most one
// start of a tenant runs at a time, and at most two at once: six clusters
// of three tenants whose servers stall are started in turn, never more
// than two of them held together (nor two of one tenant), and each is
// tried.
func TestStallingTenantsHoldAtMostHalfTheReconcileWorkers(t *testing.T) {
	var (
		mu    sync.Mutex
		holds []hold
		asked = map[string]int{}
	)
	var clusters []*ichorv1alpha1.TalosCluster
	for _, tenant := range []string{"a", "b", "c"} {
		ns := "starts-" + tenant
		require.NoError(t, env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		require.NoError(t, env.Client.Create(t.Context(), env.SecretsBundleSecret(ns, "talos-secrets")))
		for _, name := range []string{"one", "two"} {
			srv := httptest.NewTLSServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				h := hold{tenant: tenant, start: time.Now()}
				mu.Lock()
				asked[ns+"/"+name]++
				mu.Unlock()
				<-r.Context().Done()
				h.end = time.Now()
				mu.Lock()
				holds = append(holds, h)
				mu.Unlock()
			}))
			t.Cleanup(srv.Close)
			ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
			require.NoError(t, env.Client.Create(t.Context(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "*"}},
				Data: map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(kubeconfigDoc(srv.URL,
					"    certificate-authority-data: "+ca+"\n", "    token: tenant-token\n"))},
			}))
			c := &ichorv1alpha1.TalosCluster{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: ichorv1alpha1.TalosClusterSpec{
					TalosVersion:  "v1.14",
					SecretsRef:    ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
					KubeconfigRef: &ichorv1alpha1.KubeconfigReference{Name: name},
					Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
						Enabled: true,
					}},
				},
			}
			clusters = append(clusters, c)
		}
	}
	for _, c := range clusters {
		require.NoError(t, env.Client.Create(t.Context(), c))
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), c) })
	}

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(asked) == len(clusters) && len(holds) >= len(clusters)
	}, wait, 50*time.Millisecond, "not every tenant's server was tried")

	// Held together: around a moment a second after one hold began, the
	// holds begun half a second before and ending half a second after.
	// (A start that follows another begins as soon as the last ended,
	// before its server may have seen the client hang up.)
	mu.Lock()
	defer mu.Unlock()
	most, mostOfOne := 0, 0
	for _, h := range holds {
		at := h.start.Add(time.Second)
		together, byTenant := 0, map[string]int{}
		for _, o := range holds {
			if !o.start.After(at.Add(-500*time.Millisecond)) && o.end.After(at.Add(500*time.Millisecond)) {
				together++
				byTenant[o.tenant]++
			}
		}
		most = max(most, together)
		for _, n := range byTenant {
			mostOfOne = max(mostOfOne, n)
		}
	}
	assert.LessOrEqual(t, most, 2, "more than half the reconcile workers waited on tenants' servers at once")
	assert.LessOrEqual(t, mostOfOne, 1, "two starts of one tenant waited on its servers at once")
	t.Logf("%d holds, at most %d together; asked: %v", len(holds), most, asked)
}

// tenantServerCluster is a TalosCluster of its own namespace whose
// kubeconfigRef names a tenant's API server that answers as handle does
// (JSON), and that server.
func tenantServerCluster(t *testing.T, name string, handle http.HandlerFunc) (*fixture, *httptest.Server) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		handle(w, r)
	}))
	t.Cleanup(srv.Close)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	f := remoteCluster(t, name, kubeconfigDoc(srv.URL, "    certificate-authority-data: "+ca+"\n", "    token: tenant-token\n"))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: f.cluster}})
	})
	return f, srv
}

// refuseWatch answers a watch as a server without watch list answers a
// watch list: client-go falls back to a list.
func refuseWatch(w http.ResponseWriter) {
	w.WriteHeader(http.StatusMethodNotAllowed)
	_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"MethodNotAllowed","code":405}`)
}

// writeCSRList answers a list with n CSRs of signer.
func writeCSRList(w io.Writer, n int, signer string) {
	_, _ = io.WriteString(w, `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[`)
	for i := range n {
		if i > 0 {
			_, _ = io.WriteString(w, ",")
		}
		_, _ = fmt.Fprintf(w, `{"metadata":{"name":"csr-%d","uid":"u-%d","resourceVersion":"7"},"spec":{"signerName":%q,"usages":["server auth"],"request":""}}`, i, i, signer)
	}
	_, _ = io.WriteString(w, `]}`)
}

// testTenantMaxCSRs is the most CSRs the tests' manager keeps of a
// tenant's API server.
const testTenantMaxCSRs = 500

// A tenant's API server that lists more CSRs than the manager keeps of one
// (review 28 H1: any number, each as large as client-go decodes) is not
// cached: its cluster says why, and the server is asked again later, not
// believed.
func TestATenantServerListingMoreThanTheManagerKeepsIsNotCached(t *testing.T) {
	var lists atomic.Int64
	f, _ := tenantServerCluster(t, "many", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			refuseWatch(w)
			return
		}
		lists.Add(1)
		writeCSRList(w, testTenantMaxCSRs+1, "kubernetes.io/kubelet-serving")
	})
	var cond *metav1.Condition
	require.Eventually(t, func() bool {
		cond = meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return cond != nil && cond.Reason == kubeletserving.ReasonRemoteServerTooLarge &&
			strings.Contains(cond.Message, fmt.Sprintf("holds more than %d CSRs", testTenantMaxCSRs))
	}, wait, 100*time.Millisecond, "the cluster does not say its server lists too many CSRs: %+v", cond)
	assert.Positive(t, lists.Load())
}

// A tenant's API server that stops answering the watch of its CSRs after
// it started (here it refuses the manager's credential: a token revoked)
// is said on its cluster, and Ready is False: client-go alone listed again
// and again, its cache kept as it was and still synced, so a request made
// meanwhile was never seen, and the cluster said its requests were decided
// (review of 2026-12-06).
func TestATenantServerThatStopsAnsweringIsSaidOnItsCluster(t *testing.T) {
	var broken atomic.Bool
	var watches atomic.Int64
	cut := make(chan struct{})
	f, _ := tenantServerCluster(t, "unanswered", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case broken.Load():
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}`)
		case r.URL.Query().Get("watch") == "true" && r.URL.Query().Get("sendInitialEvents") == "true":
			refuseWatch(w)
		case r.URL.Query().Get("watch") == "true":
			watches.Add(1)
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-cut:
			}
		default:
			writeCSRList(w, 0, "kubernetes.io/kubelet-serving")
		}
	})
	require.Eventually(t, func() bool { return watches.Load() > 0 }, wait, 50*time.Millisecond, "the tenant's server was never watched")
	broken.Store(true)
	close(cut)
	var cond *metav1.Condition
	require.Eventually(t, func() bool {
		cond = meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return cond != nil && cond.Reason == kubeletserving.ReasonKubeconfigUnreadable &&
			strings.Contains(cond.Message, "does not answer the watch of its CSRs") && strings.Contains(cond.Message, "Unauthorized")
	}, wait, 100*time.Millisecond, "the cluster does not say its server stopped answering: %+v", cond)
	ready := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, metav1.ConditionFalse, ready.Status, "Ready while the server's requests are not seen: %+v", ready)
}

// A tenant that rewrites its kubeconfig Secret to undo the backoff of a
// failed start has its server listed once a backoff, not once a rewrite
// (each rewrite used to start the count afresh, so a tenant could have the
// manager list its server as often as it wrote the Secret): the first
// rewrite after a failure (a fix) is started at once, those within the next
// wait are not started at all, and the last is started once that wait (twice
// the request bound, the second failure's) is over.
func TestRewritingAKubeconfigDoesNotUndoTheBackoff(t *testing.T) {
	tenant := newRewritingTenant(t, "rewritten")
	tenant.rewrite("fix")
	require.Eventually(t, tenant.says(kubeletserving.ReasonRemoteServerInvalid), wait, 50*time.Millisecond,
		"the first rewrite after a failed start was not started, or did not fail")
	spam := make([]string, 8)
	for i := range spam {
		spam[i] = fmt.Sprintf("spam-%d", i)
		tenant.rewrite(spam[i])
	}
	tenant.rewrite("last")
	require.Eventually(t, tenant.listed("last"), wait, 50*time.Millisecond, "the last rewrite was not started once the backoff was over")
	for _, token := range spam {
		assert.False(t, tenant.listed(token)(), "%s, written within the backoff of the last rewrite started, was started", token)
	}
	fixed, _ := tenant.listedAt("fix")
	last, _ := tenant.listedAt("last")
	// Started no sooner than a wait (6 s) after the rewrite started before
	// it, which listed soon after its start (a second is left for that).
	assert.GreaterOrEqual(t, last.Sub(fixed), 5*time.Second, "the last rewrite was started before the backoff was over")
}

// A content the rule refuses ends the wait of a failed start, as a start
// that works does, but not its count: a tenant that alternated a failing
// kubeconfig with a refused one had the failing one started at once after
// each refusal, the count never past one.
func TestAlternatingWithARefusedKubeconfigDoesNotUndoTheBackoff(t *testing.T) {
	tenant := newRewritingTenant(t, "alternating")
	tenant.rewriteDoc(kubeconfigDoc(tenant.srv.URL, "    insecure-skip-tls-verify: true\n", "    token: refused\n"))
	require.Eventually(t, tenant.says(kubeletserving.ReasonKubeconfigRefused), wait, 50*time.Millisecond,
		"the first rewrite after a failed start was not judged")
	tenant.rewrite("again")
	require.Eventually(t, tenant.says(kubeletserving.ReasonRemoteServerTooLarge), wait, 50*time.Millisecond,
		"the failing content was not started after the refusal")
	tenant.rewrite("again-2")
	require.Eventually(t, tenant.listed("again-2"), wait, 50*time.Millisecond, "the second failing content was not started once the backoff was over")
	again, _ := tenant.listedAt("again")
	again2, _ := tenant.listedAt("again-2")
	// The second failure's wait is twice the request bound (6 s): before,
	// the refusal forgot the first, and again-2 was started at once.
	assert.GreaterOrEqual(t, again2.Sub(again), 4*time.Second, "the refusal undid the count of failed starts")
	assert.False(t, tenant.listed("refused")(), "a refused kubeconfig reached its server")
}

// rewritingTenant is a cluster whose tenant's server fails every start
// (too many CSRs, or for the token "fix" what no server sends) and records
// when each token first listed, and whose tenant rewrites its kubeconfig.
type rewritingTenant struct {
	*fixture
	srv *httptest.Server

	mu    sync.Mutex
	lists map[string]time.Time
}

func newRewritingTenant(t *testing.T, name string) *rewritingTenant {
	tenant := &rewritingTenant{lists: map[string]time.Time{}}
	tenant.fixture, tenant.srv = tenantServerCluster(t, name, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			refuseWatch(w)
			return
		}
		token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		tenant.mu.Lock()
		if _, ok := tenant.lists[token]; !ok {
			tenant.lists[token] = time.Now()
		}
		tenant.mu.Unlock()
		if token == "fix" {
			// What no server sends, so that this start's failure is
			// seen on the cluster (RemoteServerInvalid).
			_, _ = io.WriteString(w, `{"kind":"CertificateSigningRequestList","apiVersion":"certificates.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[`+
				`{"metadata":{"namespace":"x","name":"csr-0","uid":"u-0","resourceVersion":"7"},"spec":{"signerName":"kubernetes.io/kubelet-serving","usages":["server auth"],"request":""}}]}`)
			return
		}
		writeCSRList(w, testTenantMaxCSRs+1, "kubernetes.io/kubelet-serving")
	})
	require.Eventually(t, tenant.says(kubeletserving.ReasonRemoteServerTooLarge), wait, 50*time.Millisecond, "the first start did not fail")
	require.True(t, tenant.listed("tenant-token")())
	return tenant
}

func (r *rewritingTenant) listedAt(token string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.lists[token]
	return at, ok
}

func (r *rewritingTenant) listed(token string) func() bool {
	return func() bool { _, ok := r.listedAt(token); return ok }
}

// rewrite writes a kubeconfig with token; rewriteDoc writes doc. Secrets
// are not watched: the tenant has its cluster reconciled after each rewrite
// by making a machine, as it may.
func (r *rewritingTenant) rewrite(token string) {
	r.t.Helper()
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw}))
	r.rewriteDoc(kubeconfigDoc(r.srv.URL, "    certificate-authority-data: "+ca+"\n", "    token: "+token+"\n"))
}

func (r *rewritingTenant) rewriteDoc(doc string) {
	r.t.Helper()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "kubeconfig", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "tenant"}}}
	secret.Data = map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(doc)}
	require.NoError(r.t, env.Client.Update(r.ctx, secret))
	sum := sha256.Sum256([]byte(doc))
	r.addMachine(fmt.Sprintf("after-%x", sum[:4]), "127.0.0.1:50000")
}

// says is whether the cluster's KubeletServingCertificates condition has
// reason want.
func (r *rewritingTenant) says(want string) func() bool {
	return func() bool {
		c := meta.FindStatusCondition(r.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return c != nil && c.Reason == want
	}
}

// A tenant's server whose list answer is larger than the manager reads of
// one is said on the cluster as one that holds too many CSRs, not as a
// kubeconfig that cannot be used (review 36).
func TestATenantServerAnsweringMoreThanTheManagerReadsIsSaidSo(t *testing.T) {
	f, _ := tenantServerCluster(t, "huge-answer", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			refuseWatch(w)
			return
		}
		// Declared past the bound: refused before a byte of it is read.
		w.Header().Set("Content-Length", strconv.Itoa(kubeconfig.MaxResponseBytes+1))
		writeCSRList(w, 1, "kubernetes.io/kubelet-serving")
	})
	var cond *metav1.Condition
	require.Eventually(t, func() bool {
		cond = meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return cond != nil && cond.Reason == kubeletserving.ReasonRemoteServerTooLarge &&
			strings.Contains(cond.Message, fmt.Sprintf("more than the %d a remote API server's answer may be", kubeconfig.MaxResponseBytes))
	}, wait, 100*time.Millisecond, "the cluster does not say its server's answer is too large: %+v", cond)
}

// A tenant's server whose watch sends an event larger than the manager
// reads of one is said on the cluster too: client-go ends the stream,
// keeping only the error's message, and would watch again for ever with
// nothing said (review 36 L6).
func TestATenantServerWatchingWithAnEventTooLargeIsSaidSo(t *testing.T) {
	f, _ := tenantServerCluster(t, "huge-event", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("watch") == "true" && q.Has("sendInitialEvents"):
			refuseWatch(w)
		case q.Get("watch") == "true":
			// One event that never ends its line, until the client stops
			// reading.
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1","metadata":{"name":"huge"},"spec":{"request":"`)
			chunk := []byte(strings.Repeat("A", 1<<20))
			for range 2 * kubeconfig.MaxWatchEventBytes >> 20 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		default:
			writeCSRList(w, 0, "")
		}
	})
	var cond *metav1.Condition
	require.Eventually(t, func() bool {
		cond = meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return cond != nil && cond.Reason == kubeletserving.ReasonRemoteServerTooLarge &&
			strings.Contains(cond.Message, "an event of the watch is more than")
	}, wait, 100*time.Millisecond, "the cluster does not say its server's watch event is too large: %+v", cond)
}

// A tenant's server that grows past what the manager keeps after its watch
// started is not left with a stale cache and nothing said: the watch stops,
// the cluster says why as a failed start does, and once the server sends
// less the cluster is watched again. Here each watch brings more CSRs than
// the bound while each list brings none: client-go alone would list and
// watch again for ever, its cache never current.
func TestATenantServerGrowingPastTheBoundAfterItsStartIsSaidOnTheCluster(t *testing.T) {
	var grown atomic.Bool
	var watches atomic.Int64
	f, growing := tenantServerCluster(t, "growing", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("watch") == "true" && q.Has("sendInitialEvents"):
			refuseWatch(w)
		case q.Get("watch") != "true":
			writeCSRList(w, 0, "")
		default:
			watches.Add(1)
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			if grown.Load() {
				for i := range testTenantMaxCSRs + 1 {
					_, _ = fmt.Fprintf(w, `{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1",`+
						`"metadata":{"name":"csr-%d","uid":"u-%d","resourceVersion":"%d"},"spec":{"signerName":"example.com/other","usages":["server auth"],"request":""}}}`+"\n", i, i, 8+i)
				}
				w.(http.Flusher).Flush()
			}
			<-r.Context().Done()
		}
	})
	condition := func() *metav1.Condition {
		return meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	}
	watching := func() bool {
		cond := condition()
		return watches.Load() > 0 && cond != nil && !refusedReason(cond.Reason)
	}
	require.Eventually(t, watching, wait, 100*time.Millisecond, "the tenant's server is not watched: %+v", condition())
	started := condition()

	// The watch open now stays quiet: the next one brings the CSRs.
	grown.Store(true)
	growing.CloseClientConnections()
	require.Eventually(t, func() bool {
		cond := condition()
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == kubeletserving.ReasonRemoteServerTooLarge &&
			strings.Contains(cond.Message, fmt.Sprintf("holds more than %d CSRs", testTenantMaxCSRs))
	}, wait, 100*time.Millisecond, "the cluster does not say its server grew past the bound: %+v", condition())

	grown.Store(false)
	watches.Store(0)
	require.Eventually(t, watching, wait, 100*time.Millisecond, "the tenant's server is not watched again: %+v", condition())
	assert.Equal(t, started.Reason, condition().Reason)
}

// A tenant's clusters are held to the bound together: a tenant does not get
// the bound once more for each cluster it makes. The second of two
// clusters whose servers hold more together is not watched, and says so;
// once the first is gone, it is.
func TestATenantsClustersAreHeldToTheBoundTogether(t *testing.T) {
	const each = testTenantMaxCSRs/2 + 1
	f, _ := tenantServerCluster(t, "together", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("watch") == "true" && q.Has("sendInitialEvents"):
			refuseWatch(w)
		case q.Get("watch") == "true":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			writeCSRList(w, each, "example.com/other")
		}
	})
	first := &ichorv1alpha1.TalosCluster{}
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: f.cluster}, first))
	// The same kubeconfig, which names both clusters.
	var kubeconfig corev1.Secret
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: first.Spec.KubeconfigRef.Name}, &kubeconfig))
	kubeconfig.Annotations[ichorv1alpha1.SecretsClaimAnnotation] = f.cluster + ",second"
	require.NoError(t, env.Client.Update(f.ctx, &kubeconfig))
	second := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "second"}, Spec: first.Spec}
	require.NoError(t, env.Client.Create(f.ctx, second))
	t.Cleanup(func() {
		for _, name := range []string{f.cluster, "second"} {
			_ = env.Client.Delete(context.Background(), &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}})
		}
	})
	condition := func(name string) *metav1.Condition {
		var c ichorv1alpha1.TalosCluster
		if err := env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, &c); err != nil {
			return nil
		}
		return meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	}
	together := fmt.Sprintf("the API servers of the clusters of namespace %s hold more than %d CSRs together", f.ns, testTenantMaxCSRs)
	refused := func(name string) bool {
		cond := condition(name)
		return cond != nil && cond.Reason == kubeletserving.ReasonRemoteServerTooLarge && strings.Contains(cond.Message, together)
	}
	watched := func(name string) bool {
		cond := condition(name)
		return cond != nil && cond.Reason != "" && !refusedReason(cond.Reason)
	}
	var held, left string
	require.Eventually(t, func() bool {
		switch {
		case watched(f.cluster) && refused("second"):
			held, left = f.cluster, "second"
		case watched("second") && refused(f.cluster):
			held, left = "second", f.cluster
		default:
			return false
		}
		return true
	}, wait, 100*time.Millisecond, "not one cluster watched and the other refused: %+v, %+v", condition(f.cluster), condition("second"))

	require.NoError(t, env.Client.Delete(f.ctx, &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: held}}))
	require.Eventually(t, func() bool { return watched(left) }, wait, 100*time.Millisecond,
		"the cluster left is not watched once the other is gone: %+v", condition(left))
}

// writeWatchList answers a watch list with n CSRs of signer and the
// bookmark that ends them, as an API server does, and holds the watch open.
func writeWatchList(w http.ResponseWriter, r *http.Request, n int, signer string) {
	w.WriteHeader(http.StatusOK)
	for i := range n {
		_, _ = fmt.Fprintf(w, `{"type":"ADDED","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1",`+
			`"metadata":{"name":"csr-%d","uid":"u-%d","resourceVersion":"8"},"spec":{"signerName":%q,"usages":["server auth"],"request":""}}}`+"\n", i, i, signer)
	}
	_, _ = io.WriteString(w, `{"type":"BOOKMARK","object":{"kind":"CertificateSigningRequest","apiVersion":"certificates.k8s.io/v1",`+
		`"metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// A cache that lists again by watch list keeps what it held until the
// list's bookmark comes, and so does its count (review 31 H2): a server
// that stalls its cluster's second watch list cannot have the tenant's
// count dropped while its cache still holds everything, and another of
// the tenant's clusters is refused what the first still holds.
func TestAWatchListThatNeverEndsKeepsTheTenantsCount(t *testing.T) {
	const first = testTenantMaxCSRs - 100
	var stalled atomic.Bool
	var relists atomic.Int64
	f, server := tenantServerCluster(t, "watchlist", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("watch") != "true":
			writeCSRList(w, first, "example.com/other")
		case q.Has("sendInitialEvents") && stalled.Load():
			// The second watch list: nothing, and no bookmark.
			relists.Add(1)
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case q.Has("sendInitialEvents"):
			writeWatchList(w, r, first, "example.com/other")
		default:
			// A plain watch from the bookmark's version: too old, so
			// client-go lists again, by watch list.
			w.WriteHeader(http.StatusGone)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}`)
		}
	})
	condition := func(name string) *metav1.Condition {
		var c ichorv1alpha1.TalosCluster
		if err := env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: name}, &c); err != nil {
			return nil
		}
		return meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	}
	require.Eventually(t, func() bool {
		cond := condition(f.cluster)
		return cond != nil && cond.Reason != "" && !refusedReason(cond.Reason)
	}, wait, 100*time.Millisecond, "the first cluster is not watched: %+v", condition(f.cluster))

	stalled.Store(true)
	server.CloseClientConnections()
	require.Eventually(t, func() bool { return relists.Load() > 0 }, wait, 100*time.Millisecond, "the first cluster's cache did not list again")

	second, _ := tenantServerCluster(t, "watchlist-second", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("watch") != "true":
			writeCSRList(w, 200, "example.com/other")
		case q.Has("sendInitialEvents"):
			writeWatchList(w, r, 200, "example.com/other")
		default:
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	// The second cluster is of another namespace: move it into the
	// first's, beside it.
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: second.ns, Name: second.cluster}, &c))
	var secret corev1.Secret
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: second.ns, Name: "kubeconfig"}, &secret))
	require.NoError(t, env.Client.Create(f.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "kubeconfig-second", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "second"}}, Data: secret.Data}))
	spec := c.Spec
	spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "kubeconfig-second"}
	require.NoError(t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "second"}, Spec: spec}))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "second"}})
	})
	together := fmt.Sprintf("the API servers of the clusters of namespace %s hold more than %d CSRs together", f.ns, testTenantMaxCSRs)
	require.Eventually(t, func() bool {
		cond := condition("second")
		return cond != nil && cond.Reason == kubeletserving.ReasonRemoteServerTooLarge && strings.Contains(cond.Message, together)
	}, wait, 100*time.Millisecond, "the second cluster is not refused what the first still holds: %+v", condition("second"))
}

// refusedReason is whether a KubeletServingCertificates reason says the
// cluster's API server is not watched (or not yet).
func refusedReason(reason string) bool {
	switch reason {
	case kubeletserving.ReasonKubeconfigUnreadable, kubeletserving.ReasonKubeconfigRefused,
		kubeletserving.ReasonRemoteServerTooLarge, kubeletserving.ReasonRemoteServerInvalid,
		kubeletserving.ReasonRemoteServerAddressRefused, kubeletserving.ReasonRemoteWatchStarting,
		kubeletserving.ReasonPolicyEvaluationFailed:
		return true
	}
	return false
}
