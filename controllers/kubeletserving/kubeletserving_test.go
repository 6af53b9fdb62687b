package kubeletserving_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// One control plane and one manager serve every test of the package; each
// test has its own namespace, cluster and node names.
var (
	env         *harness.Env
	decisionLog = &harness.DecisionLog{}
	// local are the clusters named as judges of this API server
	// (--local-clusters); each test names its own.
	local = &cluster.Local{}
	// odd answers for the nodes a test names, and the real engine's answer
	// for every other (odd_test.go).
	odd = &enginetest.Answers[engine.CSRDecision]{}
	// oddRejection answers odd rejections for the machines a test names.
	oddRejection = &enginetest.Answers[engine.CSRDecision]{}
	// gates hold the rejections of the machines a test names (flood_test.go).
	gates = &rejectionGates{}
	// metrics are the approver's, in a registry of the tests' own.
	metricsRegistry = prometheus.NewRegistry()
	metrics         *kubeletserving.Metrics
	nodeReaders     *kubeletserving.NodeReaders
	// managerCache reads what the manager's cache holds.
	managerCache client.Reader
)

const wait = 60 * time.Second

// deniedHost is the address this suite's manager does not connect to for a
// tenant (kubeconfig.Local.Denied): it stands for the networks the default
// denies, loopback among them, where every other test's servers are.
const deniedHost = "127.0.0.3"

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Options{}, func(ctx context.Context, e *harness.Env) (func(), error) {
		env = e
		return nil, startManager(ctx)
	}))
}

// floodAllowance is the test bundle's min_undecided_allowance, with no
// allowance per machine: the flood guard trips at a count a test can reach
// whatever the machines of the other tests, and far above what they leave
// undecided.
const floodAllowance = 20

func startManager(ctx context.Context) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	b, err := bundles.Default()
	if err != nil {
		return err
	}
	cfg := b.Data["ichor"].(map[string]any)["kubelet_serving"].(map[string]any)["config"].(map[string]any)
	cfg["min_undecided_allowance"] = json.Number(strconv.Itoa(floodAllowance))
	cfg["max_undecided_per_machine"] = json.Number("0")
	b.Manifest.Revision = bundles.Digest(b)
	eng, err := engine.New(ctx, engine.Options{Bundle: b, DecisionLog: decisionLog, Log: os.Stderr})
	if err != nil {
		return err
	}
	if err := env.AtStop(func() { eng.Stop(context.Background()) }); err != nil {
		return err
	}
	if metrics, err = kubeletserving.NewMetrics(metricsRegistry); err != nil {
		return err
	}
	mgr, err := env.NewManager(env.Config, nil)
	if err != nil {
		return err
	}
	managerCache = mgr.GetClient()
	// As the manager ships: the identities of machines expected to ask
	// are watched.
	nodeReaders = &kubeletserving.NodeReaders{Reader: mgr.GetAPIReader(), Timeout: 2 * time.Second, UnreachableAfter: 2 * time.Second, Watch: true}
	r := &kubeletserving.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Clientset: env.Clientset,
		Engine:    &enginetest.Engine{Engine: eng, KubeletServingFunc: oddServing, KubeletServingRejectionFunc: rejection},
		Metrics:   metrics,
		Recorder:  mgr.GetEventRecorder("ichor-kubelet-serving"),
		// A machine whose reads fail for two seconds counts as unreachable
		// for Ready, so that a test sees it within its deadline.
		NodeReaders:    nodeReaders,
		ResyncInterval: 3 * time.Second,
		// A tenant's server that holds a request is given up on soon.
		TenantRequestTimeout: 3 * time.Second,
		// Few, so a test's tenant server can list more.
		TenantMaxCSRs:  testTenantMaxCSRs,
		LocalClusters:  local,
		LocalAPIServer: &kubeconfig.Local{Config: env.Config, Denied: netguard.Denied{netip.PrefixFrom(netip.MustParseAddr(deniedHost), 32)}},
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	harness.RunManager(ctx, mgr, "manager")
	return nil
}

// fixture is one test's cluster.
type fixture struct {
	t       *testing.T
	ctx     context.Context
	ns      string
	cluster string
}

func newFixture(t *testing.T, verify bool) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	ns = strings.Trim(ns, "-")
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(ns, "talos-secrets")))
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true, VerifyFromAPIServer: verify,
			}},
		},
	}
	local.Add(client.ObjectKeyFromObject(cluster))
	require.NoError(t, env.Client.Create(ctx, cluster))
	return &fixture{t: t, ctx: ctx, ns: ns, cluster: cluster.Name}
}

// machine starts a node's Talos API and registers its TalosMachine.
func (f *fixture) machine(name string, addrs ...string) *harness.TalosNode {
	f.t.Helper()
	var addresses []netip.Addr
	for _, a := range addrs {
		addresses = append(addresses, netip.MustParseAddr(a))
	}
	node, err := env.StartTalosNode(f.ctx, harness.NodeOptions{Name: name, Addresses: addresses})
	require.NoError(f.t, err)
	f.t.Cleanup(node.Stop)
	f.addMachine(name, node.Endpoint())
	return node
}

func (f *fixture) addMachine(name, endpoint string) {
	f.t.Helper()
	m := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: ichorv1alpha1.TalosMachineSpec{
			ClusterName: f.cluster, Hostname: name, Endpoint: endpoint, Role: ichorv1alpha1.MachineRoleWorker,
		},
	}
	require.NoError(f.t, env.Client.Create(f.ctx, m))
	m.Status.NodeName = name
	require.NoError(f.t, env.Client.Status().Update(f.ctx, m))
}

// nodeClient is a client authenticated as the node's kubelet.
func nodeClient(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg, err := env.UserConfig(user, groups...)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return cs
}

// submit creates a kubelet-serving CSR as user.
func submit(t *testing.T, cs kubernetes.Interface, name string, r csrgen.Request, usages ...certificatesv1.KeyUsage) string {
	t.Helper()
	pemBytes, err := csrgen.PEM(r)
	require.NoError(t, err)
	return submitPEM(t, cs, name, pemBytes, usages...)
}

func submitPEM(t *testing.T, cs kubernetes.Interface, name string, pemBytes []byte, usages ...certificatesv1.KeyUsage) string {
	t.Helper()
	obj := csrgen.ServingObject(name, "ignored", pemBytes, usages...)
	obj.Spec.Username, obj.Spec.Groups = "", nil // the API server sets them from the requester
	return env.SubmitCSR(t, cs, obj)
}

// decided waits for the CSR to be approved or denied.
func decided(t *testing.T, name string) certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	var got *certificatesv1.CertificateSigningRequestCondition
	require.Eventually(t, func() bool {
		got = harness.Verdict(env.GetCSR(t, name))
		return got != nil
	}, wait, 100*time.Millisecond, "CSR %s was not decided", name)
	return *got
}

// loggedPending waits for a pending decision of the CSR in the decision log,
// with the given code, and then checks that the CSR is still undecided.
func loggedPending(t *testing.T, name, code string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, e := range entriesFor(name) {
			if e.Result.Action == engine.ActionPending && e.Result.Reasons[0].Code == code {
				return true
			}
		}
		return false
	}, wait, 100*time.Millisecond, "no pending %s decision logged for %s", code, name)
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "CSR %s must stay pending", name)
}

func requireDenied(t *testing.T, name string, codes ...string) certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	c := decided(t, name)
	require.Equal(t, certificatesv1.CertificateDenied, c.Type, c.Message)
	assert.Equal(t, codes[0], c.Reason)
	for _, code := range codes {
		assert.Contains(t, c.Message, code+": ")
	}
	assert.Contains(t, c.Message, "decision ")
	return c
}

func TestGoodRequestIsApprovedSignedAndRecorded(t *testing.T) {
	f := newFixture(t, false)
	f.machine("good-1", "10.20.0.2", "fd00:20::2")
	kubelet, err := env.StartKubelet(f.ctx, harness.KubeletOptions{
		NodeName: "good-1", DNSNames: []string{"good-1"}, IPs: []net.IP{net.ParseIP("10.20.0.2"), net.ParseIP("fd00:20::2")},
	})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)

	ctx, cancel := context.WithTimeout(f.ctx, wait)
	defer cancel()
	cert, err := kubelet.WaitForCertificate(ctx)
	require.NoError(t, err)
	assert.Equal(t, "system:node:good-1", cert.Subject.CommonName)
	assert.ElementsMatch(t, []string{"10.20.0.2", "fd00:20::2"}, ipStrings(cert.IPAddresses))

	csrs, err := kubelet.CSRs(f.ctx)
	require.NoError(t, err)
	require.NotEmpty(t, csrs)
	c := harness.Verdict(&csrs[0])
	require.NotNil(t, c)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type)
	assert.Equal(t, kubeletserving.ApprovalReason, c.Reason)
	assert.Contains(t, c.Message, `node "good-1"`)

	// Recorded on the machine, and the cluster's condition follows.
	require.Eventually(t, func() bool {
		var m ichorv1alpha1.TalosMachine
		require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "good-1"}, &m))
		rec := m.Status.KubeletServingCertificate
		return rec != nil && rec.Request == csrs[0].Name && rec.NotAfter.Time.Equal(cert.NotAfter.Truncate(time.Second))
	}, wait, 100*time.Millisecond)
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionTrue)

	// The decision is in the log, with its revision.
	entries := entriesFor(csrs[0].Name)
	require.NotEmpty(t, entries)
	assert.Equal(t, engine.ActionApprove, entries[len(entries)-1].Result.Action)
	assert.NotEmpty(t, entries[len(entries)-1].Bundles["ichor"].Revision)

	// No Event: the condition and the log say it (one Event a denial or a
	// pending verdict, none an approval).
}

// A machine expected to ask (no certificate recorded) is watched before its
// kubelet asks: its decision reads no node. Once its certificate is
// recorded, it is no longer expected to ask and its watch ends.
func TestAJoiningMachineIsDecidedFromItsWatchAndLetGoOnceRecorded(t *testing.T) {
	f := newFixture(t, false)
	node := f.machine("watched-1", "10.21.0.2")
	key := types.NamespacedName{Namespace: f.ns, Name: f.cluster}
	require.Eventually(t, func() bool { return nodeReaders.WatchLive(key, node.Endpoint()) }, wait, 10*time.Millisecond,
		"the joining machine's identity is not watched")

	kubelet, err := env.StartKubelet(f.ctx, harness.KubeletOptions{NodeName: "watched-1", DNSNames: []string{"watched-1"}, IPs: []net.IP{net.ParseIP("10.21.0.2")}})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)
	ctx, cancel := context.WithTimeout(f.ctx, wait)
	defer cancel()
	_, err = kubelet.WaitForCertificate(ctx)
	require.NoError(t, err)
	assert.Zero(t, node.Calls(talosapi.MethodStateGet), "the decision read the node although its watch was live")

	require.Eventually(t, func() bool { return !nodeReaders.WatchLive(key, node.Endpoint()) }, wait, 10*time.Millisecond,
		"the watch of a machine with its certificate recorded did not end")
	watches := node.Calls(talosapi.MethodStateWatch)
	kubelet.Stop()
	// A request of a machine not expected to ask is read from the node.
	require.NoError(t, node.SetIdentity(f.ctx, talosapi.Identity{Nodename: "watched-1", Hostname: "watched-1", Addresses: []netip.Addr{netip.MustParseAddr("10.21.0.3")}}))
	again, err := env.StartKubelet(f.ctx, harness.KubeletOptions{NodeName: "watched-1", DNSNames: []string{"watched-1"}, IPs: []net.IP{net.ParseIP("10.21.0.3")}})
	require.NoError(t, err)
	t.Cleanup(again.Stop)
	_, err = again.WaitForCertificate(ctx)
	require.NoError(t, err)
	assert.Positive(t, node.Calls(talosapi.MethodStateGet), "the request of a machine not watched was not read from its node")
	assert.Equal(t, watches, node.Calls(talosapi.MethodStateWatch), "a machine not expected to ask was watched again")
}

// The watches over all clusters are bounded: a cluster's machines beyond the
// room the others leave are read at decision time, and take the room when it
// is given back.
func TestTheWatchesOverAllClustersAreBounded(t *testing.T) {
	ctx := t.Context()
	ns := "watches-bounded"
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(ns, "talos-secrets")))
	cluster := func(name string) *ichorv1alpha1.TalosCluster {
		return &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: ichorv1alpha1.TalosClusterSpec{SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"}}}
	}
	a, b := cluster("a"), cluster("b")
	var endpoints []string
	var nodes []*harness.TalosNode
	for i := range 3 {
		node, err := env.StartTalosNode(ctx, harness.NodeOptions{Name: fmt.Sprintf("bounded-%d", i), Addresses: []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.22.0.%d", i+2))}})
		require.NoError(t, err)
		t.Cleanup(node.Stop)
		endpoints = append(endpoints, node.Endpoint())
		nodes = append(nodes, node)
	}
	nr := &kubeletserving.NodeReaders{Reader: env.Client, Timeout: 2 * time.Second, Watch: true, WatchMax: 2}
	t.Cleanup(nr.Stop)
	live := func(c *ichorv1alpha1.TalosCluster, endpoint string) func() bool {
		return func() bool { return nr.WatchLive(client.ObjectKeyFromObject(c), endpoint) }
	}

	require.NoError(t, nr.Keep(ctx, a, endpoints[:2]))
	require.NoError(t, nr.Keep(ctx, b, endpoints[2:]))
	require.Eventually(t, live(a, endpoints[1]), wait, 10*time.Millisecond)
	watched, _ := nr.Watches()
	assert.Equal(t, 2, watched)
	assert.False(t, live(b, endpoints[2])(), "a watch beyond the bound")
	id, src, err := nr.Read(ctx, b, endpoints[2])
	require.NoError(t, err)
	assert.Equal(t, talosnode.FromRead, src)
	assert.Equal(t, "bounded-2", id.Nodename)

	// Room given back is taken at the cluster's next Keep.
	require.NoError(t, nr.Keep(ctx, a, endpoints[:1]))
	require.NoError(t, nr.Keep(ctx, b, endpoints[2:]))
	require.Eventually(t, live(b, endpoints[2]), wait, 10*time.Millisecond)
	watched, _ = nr.Watches()
	assert.Equal(t, 2, watched)

	// A watched node that goes away ends its watch, and the end is counted
	// by its cause (review 261 F3).
	reg := prometheus.NewRegistry()
	require.NoError(t, kubeletserving.RegisterWatchMetrics(reg, nr))
	nodes[0].Stop()
	require.Eventually(t, func() bool { return watchEnds(t, reg, "lost") >= 1 }, wait, 10*time.Millisecond, "the lost watch was not counted")
}

// watchEnds is the count of watch ends of the cause that reg gathers.
func watchEnds(t *testing.T, reg *prometheus.Registry, cause string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "ichor_talos_identity_watch_ends_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cause" && l.GetValue() == cause {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestEachDenyReasonEndToEnd(t *testing.T) {
	f := newFixture(t, false)
	f.machine("deny-1", "10.21.0.2")
	node := nodeClient(t, "system:node:deny-1", "system:nodes")
	other := nodeClient(t, "system:node:deny-2", "system:nodes")
	// A user outside system:nodes that may still create CSRs, to show the group check.
	outsider := "system:node:deny-1-outsider"
	bindCSRCreator(t, outsider)
	noGroup := nodeClient(t, outsider)
	uri, err := url.Parse("spiffe://cluster.local/deny-1")
	require.NoError(t, err)
	good := csrgen.Request{Subject: csrgen.NodeSubject("deny-1"), DNSNames: []string{"deny-1"}, IPs: []net.IP{net.ParseIP("10.21.0.2")}}
	extraOrg := good
	extraOrg.Subject = pkix.Name{CommonName: "system:node:deny-1", Organization: []string{"system:nodes", "system:masters"}}
	keyUsage := pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: []byte{0x03, 0x02, 0x05, 0xa0}}

	cases := []struct {
		name  string
		make  func(t *testing.T) string
		codes []string
	}{
		// A request that does not parse or whose signature does not verify
		// never reaches the approver: the API server refuses to create it.
		// The rule still denies it (engine and check-csr tests prove it), in
		// case it ever arrives from elsewhere.
		{"wrong-requester", func(t *testing.T) string { return submit(t, other, "deny-wrong-requester", good) }, []string{"UsernameMismatch"}},
		{"no-nodes-group", func(t *testing.T) string { return submit(t, noGroup, "deny-no-group", good) }, []string{"GroupMissing", "UsernameMismatch"}},
		{"extra-organization", func(t *testing.T) string { return submit(t, node, "deny-extra-org", extraOrg) }, []string{"SubjectMismatch"}},
		{"foreign-dns", func(t *testing.T) string {
			r := good
			r.DNSNames = []string{"kubernetes.default.svc"}
			return submit(t, node, "deny-foreign-dns", r)
		}, []string{"DNSNameNotNode"}},
		{"email-name", func(t *testing.T) string {
			r := good
			r.Emails = []string{"root@deny-1"}
			return submit(t, node, "deny-email", r)
		}, []string{"SANTypeForbidden"}},
		{"uri-name", func(t *testing.T) string {
			r := good
			r.URIs = []*url.URL{uri}
			return submit(t, node, "deny-uri", r)
		}, []string{"SANTypeForbidden"}},
		{"no-name", func(t *testing.T) string {
			return submit(t, node, "deny-no-name", csrgen.Request{Subject: csrgen.NodeSubject("deny-1")})
		}, []string{"SANMissing"}},
		{"bad-usages", func(t *testing.T) string {
			return submit(t, node, "deny-usages", good, "digital signature", "server auth", "client auth")
		}, []string{"UsagesNotAllowed"}},
		{"extra-extension", func(t *testing.T) string {
			r := good
			r.Extensions = []pkix.Extension{keyUsage}
			return submit(t, node, "deny-extension", r)
		}, []string{"ExtensionForbidden"}},
		// The API server accepts a subjectAltName extension with a second
		// SEQUENCE of names after the first; no name of it is approved.
		{"smuggled-names", func(t *testing.T) string {
			r := csrgen.Request{Subject: csrgen.NodeSubject("deny-1"), Extensions: []pkix.Extension{smuggledNames(t)}}
			return submit(t, node, "deny-smuggled", r)
		}, []string{"MalformedRequest"}},
		// A key that can be factored, asking for exactly the node's names.
		{"weak-key", func(t *testing.T) string {
			weak, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // G403: the weak key under test
			require.NoError(t, err)
			r := good
			r.Key = weak
			return submit(t, node, "deny-weak-key", r)
		}, []string{"PublicKeyNotAllowed"}},
		{"weak-curve", func(t *testing.T) string {
			weak, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
			require.NoError(t, err)
			r := good
			r.Key = weak
			return submit(t, node, "deny-weak-curve", r)
		}, []string{"PublicKeyNotAllowed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.make(t)
			requireDenied(t, name, tc.codes...)
			f.waitEvent(name, "Denied")
			entries := entriesFor(name)
			require.NotEmpty(t, entries)
			assert.Equal(t, engine.ActionDeny, entries[len(entries)-1].Result.Action)
		})
	}
}

func TestCompromisedNodeAskingForAnotherNodesIPIsDenied(t *testing.T) {
	f := newFixture(t, false)
	f.machine("victim-1", "10.22.0.2")
	f.machine("evil-1", "10.22.0.3")
	evil, err := env.StartKubelet(f.ctx, harness.KubeletOptions{
		NodeName: "evil-1", DNSNames: []string{"evil-1"}, IPs: []net.IP{net.ParseIP("10.22.0.2")},
	})
	require.NoError(t, err)
	t.Cleanup(evil.Stop)
	// First it rewrites its own Node object to claim the victim's address,
	// which NodeRestriction would allow: the rule must not care.
	_, err = evil.RegisterNode(f.ctx, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.22.0.2"})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(f.ctx, wait)
	defer cancel()
	// Its request, pending or already decided: the approver may be quicker
	// than this look.
	csr, err := evil.WaitForCSR(ctx, func(*certificatesv1.CertificateSigningRequest) bool { return true })
	require.NoError(t, err)
	c := requireDenied(t, csr.Name, "IPNotNode")
	assert.Contains(t, c.Message, "IP address 10.22.0.2 is not one of the node's addresses")
	assert.Nil(t, evil.Current(), "the compromised kubelet has no certificate")
}

// A node denied for good is said so on the cluster, with the denial's
// reason, where it read as one joining (review 247, F3); a request that
// another node makes in a machine's name says nothing of that machine; and
// the note names the node's newest request.
func TestANodeDeniedForGoodIsSaidOnTheCluster(t *testing.T) {
	f := newFixture(t, false)
	f.machine("forgood-1", "10.61.0.2")
	f.machine("forgood-named", "10.61.0.3")
	f.machine("forgood-other", "10.61.0.4")
	node := nodeClient(t, "system:node:forgood-1", "system:nodes")
	bad := submit(t, node, "forgood-foreign-ip", csrgen.Request{Subject: csrgen.NodeSubject("forgood-1"), DNSNames: []string{"forgood-1"}, IPs: []net.IP{net.ParseIP("10.61.0.3")}})
	denial := requireDenied(t, bad, "IPNotNode")
	other := nodeClient(t, "system:node:forgood-other", "system:nodes")
	inItsName := submit(t, other, "forgood-in-its-name", csrgen.Request{Subject: csrgen.NodeSubject("forgood-named"), DNSNames: []string{"forgood-named"}, IPs: []net.IP{net.ParseIP("10.61.0.3")}})
	require.Equal(t, certificatesv1.CertificateDenied, decided(t, inItsName).Type)

	said := fmt.Sprintf("forgood-1: its node's newest request, CSR %q, was denied (%s): %s", bad, denial.Reason, denial.Message)
	var got metav1.Condition
	require.Eventually(t, func() bool {
		c := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		if c != nil {
			got = *c
		}
		return c != nil && strings.Contains(c.Message, said) && strings.Contains(c.Message, "forgood-other: its node's newest request")
	}, wait, 100*time.Millisecond, "the denials are not said: %+v", got)
	assert.Equal(t, ichorv1alpha1.ReasonMachinesPending, got.Reason)
	assert.NotContains(t, got.Message, "forgood-named: its node's", "a request made in its name by another node")

	// Its next request is its newest: the note names that one, whatever
	// became of the first (the name sorts after the first's, should both be
	// made within the same second, as the API server's timestamps are).
	later := submit(t, node, "forgood-later-foreign-ip", csrgen.Request{Subject: csrgen.NodeSubject("forgood-1"), DNSNames: []string{"forgood-1"}, IPs: []net.IP{net.ParseIP("10.61.0.3")}})
	laterDenial := requireDenied(t, later, "IPNotNode")
	saidLater := fmt.Sprintf("forgood-1: its node's newest request, CSR %q, was denied (%s): %s", later, laterDenial.Reason, laterDenial.Message)
	require.Eventually(t, func() bool {
		c := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		if c != nil {
			got = *c
		}
		return c != nil && strings.Contains(c.Message, saidLater) && !strings.Contains(c.Message, bad)
	}, wait, 100*time.Millisecond, "the note does not name the node's newest request: %+v", got)
}

// It is decided once at each version that changes what the rule reads, not
// at each write of a condition of another type to its status, which whoever
// may write the status (on a tenant's server, the tenant; a hostile server
// without any write) can send without end (review 165).
func TestUnknownMachineStaysPending(t *testing.T) {
	newFixture(t, false)
	node := nodeClient(t, "system:node:stranger-1", "system:nodes")
	name := submit(t, node, "pending-unknown", csrgen.Request{Subject: csrgen.NodeSubject("stranger-1"), DNSNames: []string{"stranger-1"}})
	loggedPending(t, name, "MachineUnknown")

	before := len(entriesFor(name))
	writes := env.ChurnStatus(t, name, 2*time.Second)
	require.Greater(t, writes, 20)
	// Each judging cluster's own wait may end once meanwhile.
	assert.LessOrEqual(t, len(entriesFor(name))-before, judgingClusters(t), "decisions while the request's status was written %d times", writes)
}

// judgingClusters is how many TalosClusters judge the test's API server:
// the package's earlier tests leave theirs.
func judgingClusters(t *testing.T) int {
	t.Helper()
	var clusters ichorv1alpha1.TalosClusterList
	require.NoError(t, env.Client.List(t.Context(), &clusters))
	judging := 0
	for _, c := range clusters.Items {
		if c.Spec.Security.KubeletServingCertificates.Enabled && c.Spec.KubeconfigRef == nil {
			judging++
		}
	}
	return judging
}

// A request for a name no machine has stays pending whatever else it holds
// (ADR 0125): it is decided once at each version, not again at each change
// of the machines, which any machine's change in any namespace makes, while
// no machine takes its name; once one does, it is decided on its merits.
func TestARequestForAnUnknownNameIsDecidedOnceUntilAMachineTakesIt(t *testing.T) {
	f := newFixture(t, false)
	ghostNode := nodeClient(t, "system:node:ghost-9", "system:nodes")
	req := csrgen.Request{Subject: csrgen.NodeSubject("ghost-9"), IPs: []net.IP{net.ParseIP("10.46.0.9")}}
	ghost := submit(t, ghostNode, "ghost-9", req)
	loggedPending(t, ghost, "MachineUnknown")
	for i := range 3 {
		f.machine(fmt.Sprintf("churn-%d", i), fmt.Sprintf("10.46.0.%d", i+2))
		// A request for another made-up name, made after the change: once
		// it is decided, the look the change started is past the first.
		later := submit(t, ghostNode, fmt.Sprintf("ghost-9-later-%d", i), csrgen.Request{
			Subject: csrgen.NodeSubject(fmt.Sprintf("ghost-later-%d", i)), IPs: []net.IP{net.ParseIP("10.46.0.9")},
		})
		loggedPending(t, later, "MachineUnknown")
	}
	// Each cluster that judges this API server decides it once.
	assert.LessOrEqual(t, len(entriesFor(ghost)), judgingClusters(t), "decided again at a change of other machines")

	f.machine("ghost-9", "10.46.0.9")
	v := decided(t, ghost)
	assert.Equal(t, certificatesv1.CertificateApproved, v.Type, v.Message)
}

func TestUnreadableNodeStaysPendingUntilItAnswers(t *testing.T) {
	f := newFixture(t, false)
	talos := f.machine("flaky-1", "10.23.0.2")
	talos.SetUnavailable(true)
	node := nodeClient(t, "system:node:flaky-1", "system:nodes")
	name := submit(t, node, "pending-unreadable", csrgen.Request{Subject: csrgen.NodeSubject("flaky-1"), IPs: []net.IP{net.ParseIP("10.23.0.2")}})
	loggedPending(t, name, "NodeUnreadable")

	talos.SetUnavailable(false)

	c := decided(t, name)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
}

// requestOfANodeWithAnotherCA starts a machine whose Talos API trusts only a
// new OS CA, not the cluster's bundle, and has its kubelet ask: the request
// is pending (NodeUnreadable) until the manager reads the node with that CA.
func (f *fixture) requestOfANodeWithAnotherCA(node, ip string) (*talosapi.CA, string) {
	f.t.Helper()
	ca, err := talosapi.NewCA()
	require.NoError(f.t, err)
	talos, err := env.StartTalosNode(f.ctx, harness.NodeOptions{Name: node, Addresses: []netip.Addr{netip.MustParseAddr(ip)}, CA: ca})
	require.NoError(f.t, err)
	f.t.Cleanup(talos.Stop)
	f.addMachine(node, talos.Endpoint())
	kubelet := nodeClient(f.t, "system:node:"+node, "system:nodes")
	name := submit(f.t, kubelet, node, csrgen.Request{Subject: csrgen.NodeSubject(node), IPs: []net.IP{net.ParseIP(ip)}})
	loggedPending(f.t, name, "NodeUnreadable")
	return ca, name
}

// The cluster's secrets bundle is read at most every secretsFreshness (10 s),
// not per decision: an OS CA rotated in place is in use within that time, so
// a node that trusts only the new CA is unreadable until then (pending, never
// judged on a stale read) and approved soon after.
func TestAnOSCARotatedInPlaceIsUsedWithinSecondsOfTheRotation(t *testing.T) {
	f := newFixture(t, false)
	rotated, name := f.requestOfANodeWithAnotherCA("rotated-1", "10.24.0.2")

	secret, err := env.SecretsBundleSecretWithOSCA(f.ns, "talos-secrets", rotated)
	require.NoError(t, err)
	var current corev1.Secret
	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKeyFromObject(secret), &current))
	current.Data = secret.Data
	require.NoError(t, env.Client.Update(f.ctx, &current))
	rotatedAt := time.Now()

	c := decided(t, name)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
	t.Logf("approved %s after the rotation", time.Since(rotatedAt).Round(100*time.Millisecond))
}

// A cluster pointed at another secrets bundle uses it at once: the cached
// bundle is the one its secretsRef names.
func TestASecretsRefChangeIsUsedAtOnce(t *testing.T) {
	f := newFixture(t, false)
	other, name := f.requestOfANodeWithAnotherCA("moved-1", "10.25.0.2")

	secret, err := env.SecretsBundleSecretWithOSCA(f.ns, "talos-secrets-2", other)
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(f.ctx, secret))
	var cluster ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: f.cluster}, &cluster))
	cluster.Spec.SecretsRef.Name = secret.Name
	require.NoError(t, env.Client.Update(f.ctx, &cluster))

	// The change of spec wakes the cluster, whose pass reads the node with
	// the new bundle: well before the old one's 10 s are up.
	require.Eventually(t, func() bool { return harness.Verdict(env.GetCSR(t, name)) != nil }, 8*time.Second, 100*time.Millisecond,
		"CSR %s not decided within 8 s of the secretsRef change", name)
	c := decided(t, name)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
}

// A cluster pointed at a Secret that does not name it is not read with that
// Secret's OS CA: its requests stay pending, the node's error naming the
// annotation, until whoever owns the Secret names the cluster in it; the
// next look (every unreadableRecheck) then reads the node and approves.
func TestASecretThatDoesNotNameTheClusterIsNotUsed(t *testing.T) {
	f := newFixture(t, false)
	ca, err := talosapi.NewCA()
	require.NoError(t, err)
	secret, err := env.SecretsBundleSecretWithOSCA(f.ns, "another-clusters-secrets", ca)
	require.NoError(t, err)
	secret.Annotations[ichorv1alpha1.SecretsClaimAnnotation] = "another-cluster"
	require.NoError(t, env.Client.Create(f.ctx, secret))
	// A merge patch: the controller writes the cluster's status meanwhile.
	var cluster ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: f.cluster}, &cluster))
	patch := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.SecretsRef.Name = secret.Name
	require.NoError(t, env.Client.Patch(f.ctx, &cluster, patch))
	talos, err := env.StartTalosNode(f.ctx, harness.NodeOptions{Name: "unclaimed-1", Addresses: []netip.Addr{netip.MustParseAddr("10.26.0.2")}, CA: ca})
	require.NoError(t, err)
	t.Cleanup(talos.Stop)
	f.addMachine("unclaimed-1", talos.Endpoint())
	kubelet := nodeClient(t, "system:node:unclaimed-1", "system:nodes")
	name := submit(t, kubelet, "unclaimed-1", csrgen.Request{Subject: csrgen.NodeSubject("unclaimed-1"), IPs: []net.IP{net.ParseIP("10.26.0.2")}})

	says := `Secret "another-clusters-secrets": invalid secrets bundle: the Secret does not name this TalosCluster: its annotation ichor.dev/talos-clusters names "another-cluster", not "` + f.cluster + `"`
	require.Eventually(t, func() bool {
		for _, e := range entriesFor(name) {
			var node csrinput.Node
			if e.Result.Action == engine.ActionPending && json.Unmarshal(e.Input.Node, &node) == nil && strings.Contains(node.Error, says) {
				return true
			}
		}
		return false
	}, wait, 100*time.Millisecond, "no pending decision logged for %s whose node error names the claim", name)
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "CSR %s must stay pending", name)

	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKeyFromObject(secret), secret))
	secret.Annotations[ichorv1alpha1.SecretsClaimAnnotation] = "another-cluster," + f.cluster
	require.NoError(t, env.Client.Update(f.ctx, secret))
	c := decided(t, name)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
}

func TestAnotherSignerIsUntouched(t *testing.T) {
	f := newFixture(t, false)
	f.machine("other-1", "10.24.0.2")
	node := nodeClient(t, "system:node:other-1", "system:nodes")
	pemBytes, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("other-1")})
	require.NoError(t, err)
	obj := csrgen.ServingObject("other-signer", "other-1", pemBytes, "digital signature", "key encipherment", "client auth")
	obj.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	obj.Spec.Username, obj.Spec.Groups = "", nil
	_, err = node.CertificatesV1().CertificateSigningRequests().Create(f.ctx, obj, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.Clientset.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), "other-signer", metav1.DeleteOptions{})
	})
	// A kubelet-serving request made after it is decided; by then the other
	// one has been seen by every pass.
	serving := submit(t, node, "other-signer-serving", csrgen.Request{Subject: csrgen.NodeSubject("other-1"), IPs: []net.IP{net.ParseIP("10.24.0.2")}})
	decided(t, serving)
	// A full pass has run once the cluster has its condition, True or False.
	require.Eventually(t, func() bool {
		return meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates) != nil
	}, wait, 100*time.Millisecond)

	assert.Nil(t, harness.Verdict(env.GetCSR(t, "other-signer")))
	assert.Empty(t, entriesFor("other-signer"))
}

func TestConditionAndLatch(t *testing.T) {
	f := newFixture(t, true)
	f.machine("latch-1", "10.25.0.2")
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingVerified, metav1.ConditionFalse)
	k1, err := env.StartKubelet(f.ctx, harness.KubeletOptions{NodeName: "latch-1", IPs: []net.IP{net.ParseIP("10.25.0.2")}})
	require.NoError(t, err)
	t.Cleanup(k1.Stop)
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionTrue)
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingVerified, metav1.ConditionTrue)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// A machine joins later: the first condition turns False naming it, the
	// latch holds, and Ready, which is not about the nodes, stays True.
	f.addMachine("latch-2", "127.0.0.1:1")
	cond := f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse)
	assert.Contains(t, cond.Message, "latch-2")
	assert.True(t, meta.IsStatusConditionTrue(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified))
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// Switching verification off removes the latch; switching the option off removes both.
	c := f.get()
	c.Spec.Security.KubeletServingCertificates.VerifyFromAPIServer = false
	require.NoError(t, env.Client.Update(f.ctx, c))
	f.waitNoCondition(ichorv1alpha1.ConditionKubeletServingVerified)
	c = f.get()
	c.Spec.Security.KubeletServingCertificates.Enabled = false
	require.NoError(t, env.Client.Update(f.ctx, c))
	f.waitNoCondition(ichorv1alpha1.ConditionKubeletServingCertificates)
	// Nothing to approve: Ready, for the new generation.
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonKubeletServingOff)
}

// waitReady waits until Ready has the status and reason, computed from the
// cluster's current generation, and checks that kstatus (what Flux's and
// Argo CD's health checks and kubectl wait --for=condition read) agrees:
// Current when Ready is True, InProgress when it is False.
func (f *fixture) waitReady(status metav1.ConditionStatus, reason string) metav1.Condition {
	f.t.Helper()
	var got *metav1.Condition
	var cluster *ichorv1alpha1.TalosCluster
	require.Eventually(f.t, func() bool {
		cluster = f.get()
		got = meta.FindStatusCondition(cluster.Status.Conditions, ichorv1alpha1.ConditionReady)
		return got != nil && got.Status == status && got.Reason == reason &&
			got.ObservedGeneration == cluster.Generation && cluster.Status.ObservedGeneration == cluster.Generation
	}, wait, 100*time.Millisecond, "Ready did not become %s (%s) for the current generation: %+v", status, reason, got)

	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cluster)
	require.NoError(f.t, err)
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(ichorv1alpha1.GroupVersion.WithKind("TalosCluster"))
	res, err := kstatus.Compute(u)
	require.NoError(f.t, err)
	want := kstatus.CurrentStatus
	if status != metav1.ConditionTrue {
		want = kstatus.InProgressStatus
	}
	assert.Equal(f.t, want, res.Status, "kstatus: %s", res.Message)
	return *got
}

func (f *fixture) get() *ichorv1alpha1.TalosCluster {
	f.t.Helper()
	var c ichorv1alpha1.TalosCluster
	require.NoError(f.t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: f.cluster}, &c))
	return &c
}

func (f *fixture) waitCondition(typ string, status metav1.ConditionStatus) metav1.Condition {
	f.t.Helper()
	var got *metav1.Condition
	require.Eventually(f.t, func() bool {
		got = meta.FindStatusCondition(f.get().Status.Conditions, typ)
		return got != nil && got.Status == status
	}, wait, 100*time.Millisecond, "condition %s did not become %s", typ, status)
	return *got
}

func (f *fixture) waitNoCondition(typ string) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		return meta.FindStatusCondition(f.get().Status.Conditions, typ) == nil
	}, wait, 100*time.Millisecond, "condition %s was not removed", typ)
}

// waitEvent waits for an Event about the named CSR with the given reason.
func (f *fixture) waitEvent(csr, reason string) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		var list eventsv1.EventList
		require.NoError(f.t, env.Client.List(f.ctx, &list))
		for _, e := range list.Items {
			if e.Regarding.Kind == "CertificateSigningRequest" && e.Regarding.Name == csr && e.Reason == reason {
				return true
			}
		}
		return false
	}, wait, 200*time.Millisecond, "no %s Event for CSR %s", reason, csr)
}

func bindCSRCreator(t *testing.T, user string) {
	t.Helper()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-creator-" + strings.ReplaceAll(user, ":", "-")},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get"}}},
	}
	require.NoError(t, env.Client.Create(t.Context(), role))
	require.NoError(t, env.Client.Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
	}))
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

type logEntry struct {
	DecisionID string `json:"decision_id"`
	Path       string `json:"path"`
	Input      struct {
		CSR struct {
			Name string `json:"name"`
		} `json:"csr"`
		// Machine is the machine found for the request, when one was.
		Machine json.RawMessage `json:"machine"`
		// Node is the identity read from the Talos API, when one was read.
		Node json.RawMessage `json:"node"`
		// Requests are the counts the flood guards read.
		Requests *csrinput.Requests `json:"requests"`
	} `json:"input"`
	Result  engine.CSRDecision `json:"result"`
	Bundles map[string]struct {
		Revision string `json:"revision"`
	} `json:"bundles"`
	Timestamp time.Time `json:"timestamp"`
}

// entriesFor is the decisions logged for the CSR, oldest first.
func entriesFor(csr string) []logEntry {
	return harness.Decisions(decisionLog, func(e logEntry) bool { return e.Input.CSR.Name == csr })
}

func TestClusterWithKubeconfigRefIsJudgedInItsOwnAPIServer(t *testing.T) {
	ctx := t.Context()
	workload, err := harness.Start(ctx, harness.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = workload.Stop() })

	// Review 6 M4: the tenant's server holds the first approval write
	// until the manager gives up on it (TenantRequestTimeout), as a server
	// that accepts a request and never answers; the decision is written
	// again, and no worker is held for good.
	tenant, stalls := stallingProxy(t, workload.Config)

	ns := "remote-cluster"
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	// The workload cluster's own secrets bundle: its OS CA signs its nodes' Talos APIs.
	require.NoError(t, env.Client.Create(ctx, workload.SecretsBundleSecret(ns, "talos-secrets")))
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workload-kubeconfig", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "workload"}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(tenant)},
	}))
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workload"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion:  "v1.14",
			SecretsRef:    ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			KubeconfigRef: &ichorv1alpha1.KubeconfigReference{Name: "missing-kubeconfig"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true,
			}},
		},
	}
	require.NoError(t, env.Client.Create(ctx, cluster))
	f := &fixture{t: t, ctx: ctx, ns: ns, cluster: cluster.Name}

	// A kubeconfig Secret that does not exist is said so on the cluster.
	cond := f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse)
	require.Eventually(t, func() bool {
		c := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		cond = *c
		return c.Reason == kubeletserving.ReasonKubeconfigUnreadable
	}, wait, 100*time.Millisecond)
	assert.Contains(t, cond.Message, `get Secret "missing-kubeconfig"`)

	c := f.get()
	c.Spec.KubeconfigRef.Name = "workload-kubeconfig"
	require.NoError(t, env.Client.Update(ctx, c))
	node, err := workload.StartTalosNode(ctx, harness.NodeOptions{Name: "remote-1", Addresses: []netip.Addr{netip.MustParseAddr("10.26.0.2")}})
	require.NoError(t, err)
	t.Cleanup(node.Stop)
	f.addMachine("remote-1", node.Endpoint())
	kubelet, err := workload.StartKubelet(ctx, harness.KubeletOptions{NodeName: "remote-1", IPs: []net.IP{net.ParseIP("10.26.0.2")}})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)

	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	cert, err := kubelet.WaitForCertificate(waitCtx)
	require.NoError(t, err, "the kubelet of the workload cluster got no certificate")
	assert.Equal(t, "system:node:remote-1", cert.Subject.CommonName)
	assert.Eventually(t, func() bool {
		held, gaveUp := stalls()
		return held == 1 && gaveUp == 1
	}, wait, 50*time.Millisecond, "the stalled approval write was not given up")
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionTrue)

	// Review 6 H1: the operator deletes the kubeconfig Secret to stop Ichor
	// acting there. Once the cluster says so, nothing more is decided in
	// its API server, not even through the watch started before.
	require.NoError(t, env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workload-kubeconfig"}}))
	require.Eventually(t, func() bool {
		c := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		cond = *c
		return c.Reason == kubeletserving.ReasonKubeconfigUnreadable
	}, wait, 100*time.Millisecond, "the cluster does not say its kubeconfig is gone")
	assert.Contains(t, cond.Message, `get Secret "workload-kubeconfig"`)
	cfg, err := workload.UserConfig("system:node:remote-1", "system:nodes")
	require.NoError(t, err)
	remoteNode, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	pemBytes, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("remote-1"), IPs: []net.IP{net.ParseIP("10.26.0.2")}})
	require.NoError(t, err)
	obj := csrgen.ServingObject("after-the-kubeconfig-is-gone", "ignored", pemBytes)
	obj.Spec.Username, obj.Spec.Groups = "", nil
	name := workload.SubmitCSR(t, remoteNode, obj)
	// A decision comes within a second when the cluster is judged; ten
	// seconds without one is the proof there is none.
	assert.Never(t, func() bool {
		got, err := remoteNode.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		return err == nil && approval.IsDecided(got)
	}, 10*time.Second, 200*time.Millisecond, "a request was decided for a cluster whose kubeconfig is gone")
	assert.Empty(t, entriesFor(name), "a decision was logged for a cluster whose kubeconfig is gone")
}

// Review 191 F2: a kubeconfigRef that names another cluster's API server
// (here the workload's, whose signer signs with its own Kubernetes CA, while
// the TalosCluster's secrets bundle holds another) has its nodes'
// certificates approved and signed there, but none recorded: the machine
// says why, and verification is not latched, which would render the
// kube-apiserver's --kubelet-certificate-authority for certificates it
// refuses.
func TestACertificateNotFromTheClustersCAIsNotRecorded(t *testing.T) {
	ctx := t.Context()
	workload, err := harness.Start(ctx, harness.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = workload.Stop() })
	// The workload's server behind a proxy that takes the tenant's token, as
	// TestClusterWithKubeconfigRefIsJudgedInItsOwnAPIServer: its first
	// approval write is held, and written again after TenantRequestTimeout.
	tenant, _ := stallingProxy(t, workload.Config)

	ns := "foreign-ca"
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	// This environment's bundle, whose Kubernetes CA is not the one the
	// workload's signer signs with; its OS CA is the workload's, so that
	// the nodes' identities are read and their requests approved.
	secret, err := env.SecretsBundleSecretWithOSCA(ns, "talos-secrets", workload.TalosCA())
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(ctx, secret))
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workload-kubeconfig", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "mistaken"}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(tenant)},
	}))
	require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mistaken"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion:  "v1.14",
			SecretsRef:    ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			KubeconfigRef: &ichorv1alpha1.KubeconfigReference{Name: "workload-kubeconfig"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true, VerifyFromAPIServer: true,
			}},
		},
	}))
	// The workload's server is let go before its proxy closes, which waits
	// for the manager's connections to end (t.Context has ended by then).
	t.Cleanup(func() {
		ctx := context.Background()
		assert.NoError(t, env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workload-kubeconfig"}}))
		assert.Eventually(t, func() bool {
			var c ichorv1alpha1.TalosCluster
			if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "mistaken"}, &c); err != nil {
				return false
			}
			cond := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
			return cond != nil && cond.Reason == kubeletserving.ReasonKubeconfigUnreadable
		}, wait, 100*time.Millisecond, "the cluster does not say its kubeconfig is gone")
	})
	f := &fixture{t: t, ctx: ctx, ns: ns, cluster: "mistaken"}
	node, err := workload.StartTalosNode(ctx, harness.NodeOptions{Name: "foreign-1", Addresses: []netip.Addr{netip.MustParseAddr("10.27.0.2")}})
	require.NoError(t, err)
	t.Cleanup(node.Stop)
	f.addMachine("foreign-1", node.Endpoint())
	kubelet, err := workload.StartKubelet(ctx, harness.KubeletOptions{NodeName: "foreign-1", IPs: []net.IP{net.ParseIP("10.27.0.2")}})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)

	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	_, err = kubelet.WaitForCertificate(waitCtx)
	require.NoError(t, err, "the request was not approved and signed in the workload's API server")

	var got eventsv1.Event
	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		require.NoError(t, env.Client.List(ctx, &list, client.InNamespace(ns)))
		for _, e := range list.Items {
			if e.Regarding.Kind == "TalosMachine" && e.Regarding.Name == "foreign-1" && e.Reason == kubeletserving.ReasonCertificateNotRecorded {
				got = e
				return true
			}
		}
		return false
	}, wait, 200*time.Millisecond, "no %s Event on the machine", kubeletserving.ReasonCertificateNotRecorded)
	assert.Contains(t, got.Note, "does not verify against the cluster's CA")
	assert.Contains(t, got.Note, "in the API server the cluster's kubeconfigRef names")
	// Each request its own series: related to it, not to its version.
	csrs, err := kubelet.CSRs(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, csrs)
	require.NotNil(t, got.Related, "the Event names no request")
	assert.Equal(t, "CertificateSigningRequest", got.Related.Kind)
	assert.Equal(t, csrs[0].Name, got.Related.Name)
	assert.Equal(t, csrs[0].UID, got.Related.UID)
	assert.Empty(t, got.Related.ResourceVersion)
	// The condition says it while the machine waits: the Event expires.
	require.Eventually(t, func() bool {
		c := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return c != nil && strings.Contains(c.Message, "foreign-1: the certificate issued for CSR") && strings.Contains(c.Message, "does not verify")
	}, wait, 200*time.Millisecond, "the condition does not say why the machine's certificate is not recorded")

	var m ichorv1alpha1.TalosMachine
	require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "foreign-1"}, &m))
	assert.Nil(t, m.Status.KubeletServingCertificate, "a certificate the cluster's CA did not sign was recorded")
	verified := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)
	require.NotNil(t, verified)
	assert.Equal(t, metav1.ConditionFalse, verified.Status, "verification latched on a certificate the kube-apiserver refuses")
	assert.Equal(t, ichorv1alpha1.ReasonAwaitingCertificates, verified.Reason)
}

func TestNodeNameOfTwoClustersMachinesStaysPending(t *testing.T) {
	a := newFixture(t, false)
	b := &fixture{t: t, ctx: t.Context(), ns: a.ns + "-b", cluster: "other"}
	require.NoError(t, env.Client.Create(b.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}))
	require.NoError(t, env.Client.Create(b.ctx, env.SecretsBundleSecret(b.ns, "talos-secrets")))
	other := a.get().DeepCopy()
	other.ObjectMeta = metav1.ObjectMeta{Namespace: b.ns, Name: b.cluster}
	other.Status = ichorv1alpha1.TalosClusterStatus{}
	local.Add(client.ObjectKeyFromObject(other))
	require.NoError(t, env.Client.Create(b.ctx, other))
	// Both clusters judge this API server, and each has a machine twin-1.
	a.machine("twin-1", "10.27.0.2")
	b.machine("twin-1", "10.27.0.3")
	// The request comes once the manager has seen both machines (each
	// cluster's condition names its own, from the same cache): before that,
	// a's machine alone answers to the name, and a is right to decide.
	for _, f := range []*fixture{a, b} {
		require.Eventually(t, func() bool {
			c := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
			return c != nil && strings.Contains(c.Message, "twin-1")
		}, wait, 100*time.Millisecond, "the manager has not seen machine twin-1 of %s/%s", f.ns, f.cluster)
	}
	node := nodeClient(t, "system:node:twin-1", "system:nodes")

	name := submit(t, node, "pending-ambiguous", csrgen.Request{Subject: csrgen.NodeSubject("twin-1"), IPs: []net.IP{net.ParseIP("10.27.0.2")}})

	loggedPending(t, name, "MachineAmbiguous")
}

func TestAClusterTheOperatorDidNotNameJudgesNothingHere(t *testing.T) {
	named := newFixture(t, false)
	named.machine("owner-1", "10.28.0.2")
	// A tenant's cluster in its own namespace, without kubeconfigRef: its
	// Talos API, which the tenant controls, claims the named cluster's node IP.
	tenant := &fixture{t: t, ctx: t.Context(), ns: named.ns + "-tenant", cluster: "tenant"}
	require.NoError(t, env.Client.Create(tenant.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant.ns}}))
	require.NoError(t, env.Client.Create(tenant.ctx, env.SecretsBundleSecret(tenant.ns, "talos-secrets")))
	cluster := named.get().DeepCopy()
	cluster.ObjectMeta = metav1.ObjectMeta{Namespace: tenant.ns, Name: tenant.cluster}
	cluster.Status = ichorv1alpha1.TalosClusterStatus{}
	require.NoError(t, env.Client.Create(tenant.ctx, cluster))
	tenant.machine("intruder-1", "10.28.0.2")

	// The tenant's cluster says why it judges nothing.
	cond := tenant.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse)
	require.Eventually(t, func() bool {
		c := meta.FindStatusCondition(tenant.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		cond = *c
		return c.Reason == kubeletserving.ReasonLocalClusterNotNamed
	}, wait, 100*time.Millisecond)
	assert.Contains(t, cond.Message, "--local-clusters")
	ready := tenant.waitReady(metav1.ConditionFalse, kubeletserving.ReasonLocalClusterNotNamed)
	assert.Contains(t, ready.Message, "--local-clusters")

	// Its node asks for the named cluster's node IP, which its own Talos API
	// vouches for. The named cluster, which alone judges this API server,
	// manages no machine of that name: pending, never approved.
	intruder := nodeClient(t, "system:node:intruder-1", "system:nodes")
	stolen := submit(t, intruder, "tenant-stolen-ip", csrgen.Request{Subject: csrgen.NodeSubject("intruder-1"), IPs: []net.IP{net.ParseIP("10.28.0.2")}})
	loggedPending(t, stolen, "MachineUnknown")
	for _, e := range entriesFor(stolen) {
		assert.NotEqual(t, engine.ActionApprove, e.Result.Action)
	}

	// The named cluster's own node is approved: the tenant holds nothing up.
	owner := nodeClient(t, "system:node:owner-1", "system:nodes")
	good := submit(t, owner, "owner-good", csrgen.Request{Subject: csrgen.NodeSubject("owner-1"), IPs: []net.IP{net.ParseIP("10.28.0.2")}})
	c := decided(t, good)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
}

// smuggledNames is a subjectAltName extension whose SEQUENCE of the node's
// own name is followed by another SEQUENCE naming someone else.
func smuggledNames(t *testing.T) pkix.Extension {
	t.Helper()
	seq := func(name string) []byte {
		dns, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte(name)})
		require.NoError(t, err)
		b, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: dns})
		require.NoError(t, err)
		return b
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: append(seq("deny-1"), seq("kubernetes.default.svc")...)}
}

// metricValue is the value of the suite's counter or gauge name with the
// labels (others may be set too), and whether there is one.
func metricValue(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := metricsRegistry.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			has := map[string]string{}
			for _, l := range m.GetLabel() {
				has[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range labels {
				match = match && has[k] == v
			}
			switch {
			case !match:
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			default:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// heldMachine starts a node whose watch never syncs, so that a decision
// reads it directly, registers its machine, and holds the node's answers
// until the returned release; it returns the node too.
func (f *fixture) heldMachine(name, ip string) (*harness.TalosNode, func()) {
	f.t.Helper()
	node, err := env.StartTalosNode(f.ctx, harness.NodeOptions{Name: name, Addresses: []netip.Addr{netip.MustParseAddr(ip)}})
	require.NoError(f.t, err)
	f.t.Cleanup(node.Stop)
	node.SetWatchesMuted(true)
	f.addMachine(name, node.Endpoint())
	release := node.Hold()
	f.t.Cleanup(release)
	return node, release
}

// readIsHeld submits the node's own request for its name and address and
// waits until its decision's read has reached the node, which holds it.
func readIsHeld(t *testing.T, node *harness.TalosNode, ip string) string {
	t.Helper()
	before := node.Calls(talosapi.MethodStateGet)
	name := submit(t, nodeClient(t, "system:node:"+node.Name, "system:nodes"), node.Name,
		csrgen.Request{Subject: csrgen.NodeSubject(node.Name), DNSNames: []string{node.Name}, IPs: []net.IP{net.ParseIP(ip)}})
	require.Eventually(t, func() bool { return node.Calls(talosapi.MethodStateGet) > before }, wait, 10*time.Millisecond,
		"the decision of %s did not read the node", name)
	return name
}

// A machine deleted while its node is read (directly: the read may take the
// Talos timeout) is not approved on that read. Made again, its request is
// decided anew: its only verdict comes after (review 211 F2; before, it was
// approved at the read's end, its machine gone).
func TestAMachineDeletedDuringItsNodesReadIsNotApproved(t *testing.T) {
	f := newFixture(t, false)
	node, release := f.heldMachine("deleted-1", "10.47.0.2")
	name := readIsHeld(t, node, "10.47.0.2")
	dropped := droppedVerdicts(t, "machine")

	key := types.NamespacedName{Namespace: f.ns, Name: "deleted-1"}
	require.NoError(t, env.Client.Delete(f.ctx, &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}))
	inTheCache(t, "the machine's deletion", func() bool {
		return apierrors.IsNotFound(managerCache.Get(f.ctx, key, &ichorv1alpha1.TalosMachine{}))
	})
	afterTheRead(t, name, "machine", dropped, release)

	made := time.Now()
	f.addMachine("deleted-1", node.Endpoint())
	approvedOnlyAfter(t, name, made)
}

// inTheCache waits until the manager's cache shows a change the test made,
// at most the suite's Talos timeout: the held read's own began before the
// change, so a cache later than its rest fails afterTheRead instead.
func inTheCache(t *testing.T, what string, shows func() bool) {
	t.Helper()
	require.Eventually(t, shows, 2*time.Second, time.Millisecond, "the manager's cache did not show %s before the held read's timeout", what)
}

// afterTheRead lets the node's held read go, waits until the decision it
// was for is dropped for the change (a kind of
// ichor_kubelet_serving_verdicts_dropped_total, which no other test of the
// suite makes, counted dropped before the change), and checks that no
// verdict was reached on it.
func afterTheRead(t *testing.T, name, change string, dropped float64, release func()) {
	t.Helper()
	release()
	require.Eventually(t, func() bool { return droppedVerdicts(t, change) > dropped }, wait, 10*time.Millisecond,
		"the decision on the held read was not dropped (or the read outlived the suite's Talos timeout)")
	// Meanwhile the other clusters of this API server leave the request
	// pending: no machine of a cluster that judges it answers to its name.
	assert.Empty(t, verdictTimes(name), "decided on the read")
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "decided on the read")
}

// droppedVerdicts is ichor_kubelet_serving_verdicts_dropped_total of the
// change.
func droppedVerdicts(t *testing.T, change string) float64 {
	t.Helper()
	v, _ := metricValue(t, "ichor_kubelet_serving_verdicts_dropped_total", map[string]string{"change": change})
	return v
}

// approvedOnlyAfter waits until the request is decided and checks that it
// was approved once, not before since.
func approvedOnlyAfter(t *testing.T, name string, since time.Time) {
	t.Helper()
	c := decided(t, name)
	require.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
	approved := verdictTimes(name)
	require.Len(t, approved, 1)
	assert.False(t, approved[0].Before(since), "approved at %s, before %s", approved[0], since)
	for _, e := range entriesFor(name) {
		assert.NotContains(t, e.Result.Reasons.Codes(), "NodeUnreadable", "the read was not held through the change: the test proves nothing")
	}
}

// A cluster whose kubelet serving certificates are turned off while a node
// is read approves nothing on that read. Turned on again, the request is
// decided anew: its only verdict comes after (review 211 F2; before, it was
// approved at the read's end, the cluster off).
func TestAClusterTurnedOffDuringANodesReadApprovesNothing(t *testing.T) {
	f := newFixture(t, false)
	node, release := f.heldMachine("off-1", "10.47.0.3")
	name := readIsHeld(t, node, "10.47.0.3")
	dropped := droppedVerdicts(t, "cluster_off")

	key := types.NamespacedName{Namespace: f.ns, Name: f.cluster}
	turn := func(on bool) {
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c := f.get()
			c.Spec.Security.KubeletServingCertificates.Enabled = on
			return env.Client.Update(f.ctx, c)
		}))
	}
	turn(false)
	inTheCache(t, "the cluster turned off", func() bool {
		var c ichorv1alpha1.TalosCluster
		return managerCache.Get(f.ctx, key, &c) == nil && !c.Spec.Security.KubeletServingCertificates.Enabled
	})
	afterTheRead(t, name, "cluster_off", dropped, release)

	on := time.Now()
	turn(true)
	approvedOnlyAfter(t, name, on)
}

// TestAClusterBeingDeletedApprovesNothing: a TalosCluster deleted while
// another controller's finalizer keeps it is no longer served (review 220
// F3): Ready says Deleting, and a request its machine makes afterwards is
// neither approved nor denied, while another cluster's request, made after
// it, is approved.
func TestAClusterBeingDeletedApprovesNothing(t *testing.T) {
	f := newFixture(t, false)
	f.machine("deleting-1", "10.48.0.2")
	node := nodeClient(t, "system:node:deleting-1", "system:nodes")
	request := func(name string) string {
		return submit(t, node, name, csrgen.Request{Subject: csrgen.NodeSubject("deleting-1"), IPs: []net.IP{net.ParseIP("10.48.0.2")}})
	}
	require.Equal(t, certificatesv1.CertificateApproved, decided(t, request("deleting-before")).Type, "served before")

	env.DeleteTalosClusterHeld(t, types.NamespacedName{Namespace: f.ns, Name: f.cluster})
	// kstatus calls a resource being deleted Terminating whatever its
	// conditions say: Ready alone is waited for.
	var ready *metav1.Condition
	require.Eventually(t, func() bool {
		ready = meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionReady)
		return ready != nil && ready.Reason == ichorv1alpha1.ReasonDeleting
	}, wait, 100*time.Millisecond, "Ready never said Deleting")
	assert.Equal(t, metav1.ConditionTrue, ready.Status)
	assert.Equal(t, "the cluster is being deleted: nothing is approved for it", ready.Message)

	after := request("deleting-after")
	t.Run("another cluster", func(t *testing.T) {
		other := newFixture(t, false)
		other.machine("deleting-other-1", "10.48.1.2")
		cs := nodeClient(t, "system:node:deleting-other-1", "system:nodes")
		name := submit(t, cs, "deleting-other", csrgen.Request{Subject: csrgen.NodeSubject("deleting-other-1"), IPs: []net.IP{net.ParseIP("10.48.1.2")}})
		require.Equal(t, certificatesv1.CertificateApproved, decided(t, name).Type)
	})
	// The other local clusters may log it pending as of no machine of
	// theirs, as for a cluster turned off: nothing approves or denies it.
	assert.Nil(t, harness.Verdict(env.GetCSR(t, after)), "a request of a cluster being deleted was decided")
	assert.Empty(t, verdictTimes(after), "a verdict was reached for a request of a cluster being deleted")
}

// verdictTimes are the times of the approvals and denials logged for the
// CSR, oldest first.
func verdictTimes(csr string) []time.Time {
	var out []time.Time
	for _, e := range entriesFor(csr) {
		if e.Result.Action == engine.ActionApprove || e.Result.Action == engine.ActionDeny {
			out = append(out, e.Timestamp)
		}
	}
	return out
}
