package kubeletclient_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletclient"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// One control plane and one manager serve every test of the package; each
// test has its own namespace, node names and users.
//
// The manager's bundle is the default one with require_managed_machine on
// (off by default). The Go side gathers the machine either way, so this runs
// every path of it: each test registers the machines of the nodes it expects
// approved, and TestUnknownMachine proves the lookup and its watch.
var (
	env         *harness.Env
	decisionLog = &harness.DecisionLog{}
	// local are the clusters named as judges of this API server
	// (--local-clusters).
	local = &cluster.Local{}
	// odd answers for the machines a test names (TestAnOddAnswer...).
	odd = &enginetest.Answers[engine.CSRDecision]{}
	// managerCache is what the manager reads: a test waits on it to know
	// the manager has seen a change.
	managerCache cache.Cache
)

const (
	wait = 60 * time.Second
	// recheck is the manager's first re-check of a pending request; short,
	// so that proving the re-check takes seconds.
	recheck    = time.Second
	maxRecheck = 4 * time.Second
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Options{}, func(ctx context.Context, e *harness.Env) (func(), error) {
		env = e
		if err := setupRBAC(ctx); err != nil {
			return nil, fmt.Errorf("test RBAC: %w", err)
		}
		return startManager(ctx)
	}))
}

// startManager runs the approver; stop ends the manager, waits for it, and
// then stops the engine (which removes its bundle directory).
func startManager(ctx context.Context) (stop func(), _ error) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	b, err := bundles.Default()
	if err != nil {
		return nil, err
	}
	cfg := b.Data["ichor"].(map[string]any)["kubelet_client"].(map[string]any)["config"].(map[string]any)
	cfg["require_managed_machine"] = true
	b.Manifest.Revision = bundles.Digest(b)
	eng, err := engine.New(ctx, engine.Options{Bundle: b, DecisionLog: decisionLog, Log: os.Stderr})
	if err != nil {
		return nil, err
	}
	mgr, err := env.NewManager(env.Config, nil)
	if err != nil {
		eng.Stop(ctx)
		return nil, err
	}
	managerCache = mgr.GetCache()
	r := &kubeletclient.Reconciler{
		Client:    mgr.GetClient(),
		Clientset: env.Clientset,
		Engine: &enginetest.Engine{Engine: eng, KubeletClientFunc: func(_ context.Context, in csrinput.KubeletClient) (engine.CSRDecision, error) {
			if in.Machine == nil {
				return engine.CSRDecision{}, enginetest.ErrPass
			}
			return odd.Answer(in.Machine.Name)
		}},
		RecheckInterval:    recheck,
		MaxRecheckInterval: maxRecheck,
		LocalClusters:      local,
		Recorder:           mgr.GetEventRecorder("ichor-kubelet-client"),
	}
	// The serving approver does not run here, so this one registers the index.
	if err := r.SetupWithManager(ctx, mgr, kubeletclient.SetupOptions{NodeNameIndexRegistered: false}); err != nil {
		eng.Stop(ctx)
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := harness.RunManager(ctx, mgr, "manager")
	return func() {
		cancel()
		<-done
		eng.Stop(context.Background())
	}, nil
}

// The test's own ClusterRoles, each with exactly the rule of its built-in
// namesake (system:certificates.k8s.io:certificatesigningrequests:nodeclient
// and …:selfnodeclient), bound per user so one test's grant is no other's.
const (
	roleNodeClient     = "test:certificatesigningrequests:nodeclient"
	roleSelfNodeClient = "test:certificatesigningrequests:selfnodeclient"
	// roleBootstrapper lets a bootstrap token create and watch CSRs, as
	// kubeadm binds system:node-bootstrapper to system:bootstrappers.
	roleBootstrapper = "system:node-bootstrapper"
)

func setupRBAC(ctx context.Context) error {
	for name, sub := range map[string]string{roleNodeClient: "nodeclient", roleSelfNodeClient: "selfnodeclient"} {
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{certificatesv1.GroupName},
				Resources: []string{"certificatesigningrequests/" + sub},
				Verbs:     []string{"create"},
			}},
		}
		if err := env.Client.Create(ctx, role); err != nil {
			return err
		}
	}
	return nil
}

// bind binds the ClusterRole to the user and waits until the authorizer says
// so, so that what a test sees next follows from the binding.
func bind(t *testing.T, user string, groups []string, role string) {
	t.Helper()
	name := "test:" + strings.ReplaceAll(user, ":", "-") + ":" + strings.ReplaceAll(role, ":", "-")
	require.NoError(t, env.Client.Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}))
	subresource := map[string]string{roleNodeClient: "nodeclient", roleSelfNodeClient: "selfnodeclient"}[role]
	require.Eventually(t, func() bool {
		got, err := env.Clientset.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Group: certificatesv1.GroupName, Resource: "certificatesigningrequests", Subresource: subresource, Verb: "create",
				},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		return got.Status.Allowed
	}, wait, 50*time.Millisecond, "binding %s not in effect", name)
}

// fixture is one test's namespace and local cluster.
type fixture struct {
	t       *testing.T
	ctx     context.Context
	ns      string
	cluster string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	ns = strings.Trim(ns, "-")
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	f := &fixture{t: t, ctx: ctx, ns: ns, cluster: "demo"}
	f.addCluster(ns, f.cluster, nil)
	return f
}

func (f *fixture) addCluster(ns, name string, kubeconfig *ichorv1alpha1.KubeconfigReference) {
	f.t.Helper()
	// The operator names every cluster of these tests that judges this API
	// server (--local-clusters); TestMachineOfAClusterTheOperatorDidNotName
	// makes one it did not.
	if kubeconfig == nil {
		local.Add(types.NamespacedName{Namespace: ns, Name: name})
	}
	require.NoError(f.t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion:  "v1.14",
			SecretsRef:    ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			KubeconfigRef: kubeconfig,
		},
	}))
}

// machine registers a TalosMachine of the fixture's cluster answering to node.
func (f *fixture) machine(node string) {
	f.t.Helper()
	f.machineIn(f.ns, f.cluster, node)
}

func (f *fixture) machineIn(ns, cluster, node string) {
	f.t.Helper()
	require.NoError(f.t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node},
		Spec: ichorv1alpha1.TalosMachineSpec{
			ClusterName: cluster, Hostname: node, Endpoint: "127.0.0.1:1", Role: ichorv1alpha1.MachineRoleWorker,
		},
	}))
}

// userClient is a client authenticated as user in groups.
func userClient(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg, err := env.UserConfig(user, groups...)
	require.NoError(t, err)
	return clientFor(t, cfg)
}

func clientFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return cs
}

// clientUsages are what a kubelet with an ECDSA key asks for.
var clientUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}

// submit creates a kubelet client CSR as the client's user.
func submit(t *testing.T, cs kubernetes.Interface, name string, r csrgen.Request, usages ...certificatesv1.KeyUsage) string {
	t.Helper()
	if usages == nil {
		usages = clientUsages
	}
	pemBytes, err := csrgen.PEM(r)
	require.NoError(t, err)
	obj := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pemBytes,
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     usages,
		},
	}
	return env.SubmitCSR(t, cs, obj)
}

// requireApproved waits for the CSR to be approved as kind by this
// controller and signed, checks what the condition, the certificate, the
// Event and the decision log say, and returns the certificate.
func requireApproved(t *testing.T, name, node, kind string) *x509.Certificate {
	t.Helper()
	var csr *certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		csr = env.GetCSR(t, name)
		return harness.Verdict(csr) != nil
	}, wait, 50*time.Millisecond, "CSR %s was not decided", name)
	c := harness.Verdict(csr)
	require.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
	assert.Equal(t, kubeletclient.ApprovalReason, c.Reason)
	assert.Contains(t, c.Message, fmt.Sprintf(`IchorKubeletClient: kubelet client certificate for node %q approved as %s: `, node, kind))
	assert.Contains(t, c.Message, "(decision ")
	assert.Contains(t, c.Message, ", policy revision sha256:")

	// kube-controller-manager signs what was approved.
	require.Eventually(t, func() bool {
		csr = env.GetCSR(t, name)
		return len(csr.Status.Certificate) > 0
	}, wait, 50*time.Millisecond, "CSR %s was approved but not signed", name)
	block, _ := pem.Decode(csr.Status.Certificate)
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.Equal(t, "system:node:"+node, cert.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, cert.Subject.Organization)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	caPEM, _ := env.KubernetesCA()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)

	// The verdict is in the decision log, with the id the condition names.
	entries := entriesFor(name)
	require.NotEmpty(t, entries)
	last := entries[len(entries)-1]
	assert.Equal(t, engine.ActionApprove, last.Result.Action)
	assert.Equal(t, kind, last.Result.Kind)
	assert.Equal(t, node, last.Result.Node)
	assert.Equal(t, []string{"IchorKubeletClient"}, codesOf(last))
	assert.Contains(t, c.Message, "(decision "+last.DecisionID+",")
	assert.NotEmpty(t, last.Bundles["ichor"].Revision)
	assert.True(t, last.Input.Authorization[kind].Allowed, "the input holds the review that allowed it")
	require.NotNil(t, last.Input.Machine, "the input holds the machine")
	assert.Equal(t, node, last.Input.Machine.Name)
	return cert
}

// requirePending waits until the CSR's newest verdict in the decision log is
// pending with exactly these codes (all of them, in the rule's order), checks
// that the CSR is still undecided, and returns that entry. An earlier verdict
// may have other codes: a request can be decided before the manager's cache
// holds its machine (MachineUnknown), and is decided again once it does.
func requirePending(t *testing.T, name string, codes ...string) logEntry {
	t.Helper()
	var got logEntry
	deadline := time.Now().Add(wait)
	for {
		entries := entriesFor(name)
		if len(entries) > 0 {
			got = entries[len(entries)-1]
			if got.Result.Action == engine.ActionPending && slices.Equal(codesOf(got), codes) {
				break
			}
		}
		require.False(t, time.Now().After(deadline), "the newest verdict logged for %s is not pending with codes %v: %+v", name, codes, got.Result)
		time.Sleep(50 * time.Millisecond)
	}
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "CSR %s must stay pending", name)
	return got
}

// requirePendingEvent waits for the one Warning Event KubeletClientPending
// on the request name, and returns it.
func requirePendingEvent(t *testing.T, name string) eventsv1.Event {
	t.Helper()
	var pending []eventsv1.Event
	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)))
		pending = slices.DeleteFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name != name || e.Reason != kubeletclient.ReasonPending
		})
		return len(pending) > 0
	}, wait, 100*time.Millisecond, "no %s Event on %s", kubeletclient.ReasonPending, name)
	require.Len(t, pending, 1)
	assert.Equal(t, corev1.EventTypeWarning, pending[0].Type)
	return pending[0]
}

func codesOf(e logEntry) []string {
	out := []string{}
	for _, r := range e.Result.Reasons {
		out = append(out, r.Code)
	}
	return out
}

// startKubelet runs a kubelet's client certificate manager (what the kubelet
// runs to bootstrap and rotate its client certificate) as user in groups.
func startKubelet(t *testing.T, node, user string, groups []string, key func() (crypto.Signer, error)) *harness.Kubelet {
	t.Helper()
	k, err := env.StartKubelet(t.Context(), harness.KubeletOptions{
		NodeName:    node,
		SignerName:  certificatesv1.KubeAPIServerClientKubeletSignerName,
		Username:    user,
		Groups:      groups,
		GenerateKey: key,
	})
	require.NoError(t, err)
	t.Cleanup(k.Stop)
	return k
}

// kubeletCSR waits for the kubelet's request, decided or not: one the
// approver decides at once may never be seen pending.
func kubeletCSR(t *testing.T, k *harness.Kubelet) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	csr, err := k.WaitForCSR(ctx, func(*certificatesv1.CertificateSigningRequest) bool { return true })
	require.NoError(t, err)
	return csr.Name
}

func TestBootstrapTokenIsApprovedAsNodeClientAndTheNodeThenRenewsAsItself(t *testing.T) {
	f := newFixture(t)
	f.machine("boot-1")
	token := "system:bootstrap:b00t01"
	groups := []string{"system:bootstrappers"}
	bind(t, token, groups, roleBootstrapper)
	bind(t, token, groups, roleNodeClient)

	kubelet := startKubelet(t, "boot-1", token, groups, nil)
	name := kubeletCSR(t, kubelet)
	cert := requireApproved(t, name, "boot-1", "nodeclient")
	assert.Equal(t, token, env.GetCSR(t, name).Spec.Username)

	ctx, cancel := context.WithTimeout(f.ctx, wait)
	defer cancel()
	held, err := kubelet.WaitForCertificate(ctx)
	require.NoError(t, err)
	assert.Equal(t, cert.SerialNumber, held.SerialNumber, "the kubelet holds what was signed")

	// The certificate authenticates the node as itself: it renews with it,
	// and with the self-node-client permission that is approved as self.
	node := "system:node:boot-1"
	bind(t, node, []string{"system:nodes"}, roleSelfNodeClient)
	current := kubelet.Current()
	keyDER, err := x509.MarshalPKCS8PrivateKey(current.PrivateKey)
	require.NoError(t, err)
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.CertData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: current.Certificate[0]})
	cfg.KeyData = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	renewal := submit(t, clientFor(t, cfg), "boot-1-renewal", csrgen.Request{Subject: csrgen.NodeSubject("boot-1")})
	requireApproved(t, renewal, "boot-1", "selfnodeclient")
	assert.Equal(t, node, env.GetCSR(t, renewal).Spec.Username)
	assert.Contains(t, env.GetCSR(t, renewal).Spec.Groups, "system:nodes")
}

func TestNodeRenewingItsOwnCertificateIsApprovedAsSelf(t *testing.T) {
	f := newFixture(t)
	f.machine("renew-1")
	bind(t, "system:node:renew-1", []string{"system:nodes"}, roleSelfNodeClient)

	// An RSA key: the kubelet then asks for key encipherment too.
	rsaKey := func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 2048) }
	kubelet := startKubelet(t, "renew-1", "", nil, rsaKey)
	name := kubeletCSR(t, kubelet)
	requireApproved(t, name, "renew-1", "selfnodeclient")
	assert.ElementsMatch(t, []certificatesv1.KeyUsage{"digital signature", "key encipherment", "client auth"}, env.GetCSR(t, name).Spec.Usages)

	ctx, cancel := context.WithTimeout(f.ctx, wait)
	defer cancel()
	_, err := kubelet.WaitForCertificate(ctx)
	require.NoError(t, err)
}

// Without the permission a request stays pending; it is decided again on
// the re-check timer, not in a loop, and approved once the binding exists,
// although nothing about the request changed.
func TestWithoutPermissionPendingUntilTheBindingIsAdded(t *testing.T) {
	f := newFixture(t)
	f.machine("perm-1")
	f.machine("perm-2")
	token := "system:bootstrap:perm01"
	groups := []string{"system:bootstrappers"}
	bind(t, token, groups, roleBootstrapper)

	bootstrap := startKubelet(t, "perm-1", token, groups, nil)
	self := startKubelet(t, "perm-2", "", nil, nil)
	bootstrapCSR, selfCSR := kubeletCSR(t, bootstrap), kubeletCSR(t, self)

	e := requirePending(t, bootstrapCSR, "NodeClientNotAuthorized")
	assert.Equal(t, "nodeclient", e.Result.Kind)
	assert.False(t, e.Input.Authorization["nodeclient"].Allowed)
	assert.Contains(t, e.Result.Reasons[0].Message, `"system:bootstrap:perm01" may not create certificatesigningrequests/nodeclient`)
	e = requirePending(t, selfCSR, "NodeClientNotAuthorized", "SelfNodeClientNotAuthorized")
	assert.Equal(t, "selfnodeclient", e.Result.Kind)

	// Re-checked on the timer, with backoff: no two decisions of the same
	// unchanged request closer than the first interval.
	// The gaps are counted from the first decision that had the machine: one
	// made before the manager's cache held it is rightly decided again at
	// once when it does.
	withMachine := func() []logEntry {
		entries := entriesFor(selfCSR)
		for i, e := range entries {
			if e.Input.Machine != nil {
				return entries[i:]
			}
		}
		return nil
	}
	require.Eventually(t, func() bool { return len(withMachine()) >= 3 }, wait, 100*time.Millisecond)
	entries := withMachine()
	for i := 1; i < len(entries); i++ {
		gap := entries[i].Timestamp.Sub(entries[i-1].Timestamp)
		assert.GreaterOrEqual(t, gap, recheck*9/10, "decisions %d and %d of an unchanged request %s apart", i-1, i, gap)
		assert.Equal(t, engine.ActionPending, entries[i].Result.Action)
	}
	assert.Nil(t, harness.Verdict(env.GetCSR(t, selfCSR)))
	// Why it is pending is on the request, once for its verdict however
	// often it was decided again (review 225 F2).
	for name, code := range map[string]string{bootstrapCSR: "NodeClientNotAuthorized", selfCSR: "SelfNodeClientNotAuthorized"} {
		pending := requirePendingEvent(t, name)
		assert.Contains(t, pending.Note, code)
		if series := pending.Series; series != nil {
			assert.LessOrEqual(t, series.Count, int32(1), "%s: the Event was written again for the same verdict", name)
		}
	}

	bind(t, token, groups, roleNodeClient)
	bind(t, "system:node:perm-2", []string{"system:nodes"}, roleSelfNodeClient)
	requireApproved(t, bootstrapCSR, "perm-1", "nodeclient")
	requireApproved(t, selfCSR, "perm-2", "selfnodeclient")
}

// A request relabelled in a loop (whoever may update requests, on a tenant's
// API server anyone the tenant likes) is not decided and logged again at each
// write: a change of nothing the rule reads wakes nothing, and the request is
// looked at again on its own timer (review of 2026-12-05; before, every write
// was a decision, two SubjectAccessReviews and a log entry).
func TestARequestRelabelledInALoopIsNotDecidedAtEachWrite(t *testing.T) {
	f := newFixture(t)
	f.machine("relabel-1")
	token := "system:bootstrap:relab1"
	groups := []string{"system:bootstrappers"}
	bind(t, token, groups, roleBootstrapper)
	name := kubeletCSR(t, startKubelet(t, "relabel-1", token, groups, nil))
	requirePending(t, name, "NodeClientNotAuthorized")

	before := len(entriesFor(name))
	writes := 0
	for start := time.Now(); time.Since(start) < 2*time.Second; writes++ {
		csr := env.GetCSR(t, name)
		if csr.Labels == nil {
			csr.Labels = map[string]string{}
		}
		csr.Labels["loop"] = strconv.Itoa(writes)
		_, err := env.Clientset.CertificatesV1().CertificateSigningRequests().Update(t.Context(), csr, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	require.Greater(t, writes, 20)
	// In two seconds the timer (1 s, then 2 s) asks at most twice, and a
	// decision already under way once more.
	assert.LessOrEqual(t, len(entriesFor(name))-before, 3, "decisions while the request was relabelled %d times", writes)

	// Nor at each write of a condition of its own to its status, which no
	// rule reads either (review 165; a tenant's server sends such updates
	// without any write).
	before = len(entriesFor(name))
	writes = env.ChurnStatus(t, name, 2*time.Second)
	require.Greater(t, writes, 20)
	assert.LessOrEqual(t, len(entriesFor(name))-before, 3, "decisions while the request's status was written %d times", writes)
}

// A request of the wrong shape stays pending whatever its requester may do:
// the requester here holds both permissions, and the control case is approved.
func TestRequestsOfTheWrongShapeStayPending(t *testing.T) {
	f := newFixture(t)
	f.machine("shape-1")
	user := "system:node:shape-1"
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	bind(t, user, []string{"system:nodes"}, roleNodeClient)
	node := userClient(t, user, "system:nodes")
	good := csrgen.Request{Subject: csrgen.NodeSubject("shape-1")}
	withSubject := func(s pkix.Name) csrgen.Request { r := good; r.Subject = s; return r }
	uri, err := url.Parse("spiffe://cluster.local/shape-1")
	require.NoError(t, err)

	cases := []struct {
		name    string
		request csrgen.Request
		usages  []certificatesv1.KeyUsage
		codes   []string
		message string
	}{
		{name: "wrong-organization", request: withSubject(pkix.Name{CommonName: user, Organization: []string{"acme"}}),
			codes: []string{"OrganizationNotNodes", "PrivilegedSubject"}, message: `organizations are ["acme"]`},
		{name: "no-organization", request: withSubject(pkix.Name{CommonName: user}),
			codes: []string{"OrganizationNotNodes"}},
		{name: "extra-organization", request: withSubject(pkix.Name{CommonName: user, Organization: []string{"system:nodes", "acme"}}),
			// DER sorts the values of one attribute, and the rule sees them as the request carries them.
			codes: []string{"OrganizationNotNodes", "PrivilegedSubject"}, message: `organizations are ["acme", "system:nodes"]`},
		{name: "system-masters", request: withSubject(pkix.Name{CommonName: user, Organization: []string{"system:nodes", "system:masters"}}),
			codes: []string{"OrganizationNotNodes", "PrivilegedSubject"}, message: "O=system:masters"},
		{name: "common-name-without-prefix", request: withSubject(pkix.Name{CommonName: "shape-1", Organization: []string{"system:nodes"}}),
			// No node name, so no machine either.
			codes: []string{"CommonNameNotNode", "MachineUnknown"}},
		{name: "common-name-prefix-only", request: withSubject(pkix.Name{CommonName: "system:node:", Organization: []string{"system:nodes"}}),
			codes: []string{"CommonNameNotNode", "MachineUnknown"}},
		{name: "san-dns", request: func() csrgen.Request { r := good; r.DNSNames = []string{"shape-1"}; return r }(),
			codes: []string{"SANPresent"}, message: "of type dns"},
		{name: "san-ip", request: func() csrgen.Request { r := good; r.IPs = []net.IP{net.ParseIP("10.30.0.2")}; return r }(),
			codes: []string{"SANPresent"}, message: `"10.30.0.2" of type ip`},
		{name: "san-email", request: func() csrgen.Request { r := good; r.Emails = []string{"root@shape-1"}; return r }(),
			codes: []string{"SANPresent"}, message: "of type email"},
		{name: "san-uri", request: func() csrgen.Request { r := good; r.URIs = []*url.URL{uri}; return r }(),
			codes: []string{"SANPresent"}, message: "of type uri"},
		{name: "san-other-name", request: withSAN(t, good, otherName(t)),
			codes: []string{"SANPresent"}, message: "of type other_name"},
		{name: "san-registered-id", request: withSAN(t, good, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 8, Bytes: []byte{0x2a, 0x03}}),
			codes: []string{"SANPresent"}, message: "of type registered_id"},
		{name: "usage-more", request: good, usages: []certificatesv1.KeyUsage{"digital signature", "client auth", "server auth"},
			codes: []string{"UsagesNotAllowed"}},
		{name: "usage-more-rsa-set", request: good, usages: []certificatesv1.KeyUsage{"digital signature", "key encipherment", "client auth", "server auth"},
			codes: []string{"UsagesNotAllowed"}},
		{name: "usage-less", request: good, usages: []certificatesv1.KeyUsage{"client auth"},
			codes: []string{"UsagesNotAllowed"}},
		{name: "usage-less-rsa-set", request: good, usages: []certificatesv1.KeyUsage{"key encipherment", "client auth"},
			codes: []string{"UsagesNotAllowed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := submit(t, node, "shape-"+tc.name, tc.request, tc.usages...)
			e := requirePending(t, name, tc.codes...)
			if tc.message != "" {
				assert.Contains(t, e.Result.Reasons[0].Message+" "+e.Result.Reasons[len(e.Result.Reasons)-1].Message, tc.message)
			}
		})
	}
	t.Run("control", func(t *testing.T) {
		requireApproved(t, submit(t, node, "shape-control", good), "shape-1", "selfnodeclient")
	})
}

// A request whose PEM does not parse, or whose signature does not verify,
// never reaches the approver: the API server refuses to create it. The rule
// still leaves such a request pending (MalformedRequest, InvalidSignature;
// its own tests prove it), in case one ever arrives from elsewhere.
func TestAPIServerRefusesUnverifiableRequests(t *testing.T) {
	user := "system:node:forged-1"
	node := userClient(t, user, "system:nodes")
	good, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("forged-1")})
	require.NoError(t, err)
	tampered, err := csrgen.TamperSignature(good)
	require.NoError(t, err)
	for name, request := range map[string][]byte{
		"forged-1-tampered": tampered,
		"forged-1-garbage":  []byte("-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgcmVxdWVzdA==\n-----END CERTIFICATE REQUEST-----\n"),
	} {
		_, err := node.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request: request, SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName, Usages: clientUsages,
			},
		}, metav1.CreateOptions{})
		require.Error(t, err, name)
		assert.True(t, apierrors.IsInvalid(err), "%s: %v", name, err)
	}
}

// A node asking for another node's certificate is not a self request,
// whatever its self-node-client permission; without the node-client
// permission it is not approved at all, and with it, as nodeclient only.
func TestRequestForAnotherNodeIsNotSelf(t *testing.T) {
	f := newFixture(t)
	f.machine("other-b")
	user := "system:node:other-a"
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	name := submit(t, userClient(t, user, "system:nodes"), "other-a-for-b", csrgen.Request{Subject: csrgen.NodeSubject("other-b")})

	e := requirePending(t, name, "NodeClientNotAuthorized")
	assert.Equal(t, "nodeclient", e.Result.Kind)
	assert.True(t, e.Input.Authorization["selfnodeclient"].Allowed, "the self permission is there and does not count")
	assert.Contains(t, e.Result.Reasons[0].Message,
		`not selfnodeclient: spec.username "system:node:other-a" is not the common name "system:node:other-b"`)

	bind(t, user, []string{"system:nodes"}, roleNodeClient)
	requireApproved(t, name, "other-b", "nodeclient")
}

// With require_managed_machine, a node no local machine answers to stays
// pending, a machine of a cluster judged in another API server does not
// count, and a local machine that appears is found.
func TestUnknownMachineIsPendingUntilALocalMachineAppears(t *testing.T) {
	f := newFixture(t)
	user := "system:node:lost-1"
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	// The same node name in a remote cluster.
	f.addCluster(f.ns, "remote", &ichorv1alpha1.KubeconfigReference{Name: "remote-kubeconfig"})
	f.machineIn(f.ns, "remote", "lost-1")
	name := submit(t, userClient(t, user, "system:nodes"), "lost-1", csrgen.Request{Subject: csrgen.NodeSubject("lost-1")})

	e := requirePending(t, name, "MachineUnknown")
	assert.Nil(t, e.Input.Machine)
	assert.True(t, e.Input.Authorization["selfnodeclient"].Allowed)

	// A local machine, under another object name, answering to the node
	// name by its hostname.
	require.NoError(t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "lost-1-local"},
		Spec: ichorv1alpha1.TalosMachineSpec{
			ClusterName: f.cluster, Hostname: "lost-1", Endpoint: "127.0.0.1:1", Role: ichorv1alpha1.MachineRoleWorker,
		},
	}))
	var csr *certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		csr = env.GetCSR(t, name)
		return harness.Verdict(csr) != nil
	}, wait, 50*time.Millisecond)
	assert.Equal(t, certificatesv1.CertificateApproved, harness.Verdict(csr).Type)
	entries := entriesFor(name)
	last := entries[len(entries)-1]
	require.NotNil(t, last.Input.Machine)
	assert.Equal(t, "lost-1-local", last.Input.Machine.Name)
	assert.Equal(t, f.cluster, last.Input.Machine.Cluster)
}

// To this approver a machine answers to its hostname only until its node
// name is recorded: one that joined as another name vouches for no request
// in its hostname's (review 225 F3), and for those in its node name's.
func TestAMachineAnswersToItsHostnameOnlyUntilItsNodeNameIsKnown(t *testing.T) {
	f := newFixture(t)
	f.machine("host-1")
	var m ichorv1alpha1.TalosMachine
	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "host-1"}, &m))
	m.Status.NodeName = "joined-1"
	require.NoError(t, env.Client.Status().Update(f.ctx, &m))
	require.Eventually(t, func() bool {
		var seen ichorv1alpha1.TalosMachine
		return managerCache.Get(f.ctx, client.ObjectKeyFromObject(&m), &seen) == nil && seen.Status.NodeName == "joined-1"
	}, wait, 50*time.Millisecond, "the manager never saw the node name")

	for _, node := range []string{"host-1", "joined-1"} {
		bind(t, "system:node:"+node, []string{"system:nodes"}, roleSelfNodeClient)
	}
	byHostname := submit(t, userClient(t, "system:node:host-1", "system:nodes"), "host-1", csrgen.Request{Subject: csrgen.NodeSubject("host-1")})
	e := requirePending(t, byHostname, "MachineUnknown")
	assert.Nil(t, e.Input.Machine, "a hostname the machine did not join as is no name of it")

	byNodeName := submit(t, userClient(t, "system:node:joined-1", "system:nodes"), "joined-1", csrgen.Request{Subject: csrgen.NodeSubject("joined-1")})
	var csr *certificatesv1.CertificateSigningRequest
	require.Eventually(t, func() bool {
		csr = env.GetCSR(t, byNodeName)
		return harness.Verdict(csr) != nil
	}, wait, 50*time.Millisecond)
	assert.Equal(t, certificatesv1.CertificateApproved, harness.Verdict(csr).Type)
	entries := entriesFor(byNodeName)
	require.NotNil(t, entries[len(entries)-1].Input.Machine)
	assert.Equal(t, "host-1", entries[len(entries)-1].Input.Machine.Name, "the machine vouches under its node name")
}

func TestMachineOfAClusterTheOperatorDidNotNameVouchesForNothing(t *testing.T) {
	f := newFixture(t)
	user := "system:node:tenant-1"
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	// A tenant's cluster without kubeconfigRef, which the operator did not
	// name as a judge of this API server, manages a machine of that name.
	require.NoError(t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "tenant"},
		Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"}},
	}))
	f.machineIn(f.ns, "tenant", "tenant-1")
	name := submit(t, userClient(t, user, "system:nodes"), "tenant-1", csrgen.Request{Subject: csrgen.NodeSubject("tenant-1")})

	e := requirePending(t, name, "MachineUnknown")
	assert.Nil(t, e.Input.Machine, "an unnamed cluster's machine is not this API server's node")
	assert.True(t, e.Input.Authorization["selfnodeclient"].Allowed)
}

// A machine being deleted, or one of a cluster being deleted, each held by
// another controller's finalizer, vouches for nothing: the operator is
// taking that node away (reviews 224 F2, 225 F3).
func TestADeletingMachineOrClusterVouchesForNothing(t *testing.T) {
	for name, deleted := range map[string]func(f *fixture, node string) client.Object{
		"cluster": func(f *fixture, _ string) client.Object {
			return &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: f.cluster}}
		},
		"machine": func(f *fixture, node string) client.Object {
			return &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: node}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			node := "leaving-" + name
			user := "system:node:" + node
			bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
			f.machine(node)
			obj := deleted(f, node)
			env.DeleteHeld(t, obj)
			require.Eventually(t, func() bool {
				seen := obj.DeepCopyObject().(client.Object)
				return managerCache.Get(f.ctx, client.ObjectKeyFromObject(obj), seen) == nil && seen.GetDeletionTimestamp() != nil
			}, wait, 50*time.Millisecond, "the manager never saw the deletion")

			csr := submit(t, userClient(t, user, "system:nodes"), node, csrgen.Request{Subject: csrgen.NodeSubject(node)})
			e := requirePending(t, csr, "MachineUnknown")
			assert.Nil(t, e.Input.Machine, "a machine being deleted, or of a cluster being deleted, is no node of this API server")
		})
	}
}

// Another signer's request, even for a node, is never looked at.
func TestAnotherSignerIsUntouched(t *testing.T) {
	f := newFixture(t)
	f.machine("serving-1")
	user := "system:node:serving-1"
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	node := userClient(t, user, "system:nodes")
	pemBytes, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("serving-1")})
	require.NoError(t, err)
	obj := csrgen.ServingObject("serving-1-serving", "serving-1", pemBytes, clientUsages...)
	obj.Spec.Username, obj.Spec.Groups = "", nil
	_, err = node.CertificatesV1().CertificateSigningRequests().Create(f.ctx, obj, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.Clientset.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), obj.Name, metav1.DeleteOptions{})
	})
	// A client request made after it is approved; by then the other one
	// has been through the controller's event handler.
	requireApproved(t, submit(t, node, "serving-1-client", csrgen.Request{Subject: csrgen.NodeSubject("serving-1")}), "serving-1", "selfnodeclient")

	assert.Nil(t, harness.Verdict(env.GetCSR(t, obj.Name)))
	assert.Empty(t, entriesFor(obj.Name))
}

// A request decided by someone else first is left as it is.
func TestRequestDeniedByAPersonIsLeftAlone(t *testing.T) {
	f := newFixture(t)
	f.machine("denied-1")
	user := "system:node:denied-1"
	node := userClient(t, user, "system:nodes")
	name := submit(t, node, "denied-1", csrgen.Request{Subject: csrgen.NodeSubject("denied-1")})
	requirePending(t, name, "NodeClientNotAuthorized", "SelfNodeClientNotAuthorized")

	csr := env.GetCSR(t, name)
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "ByHand", Message: "not this one",
	})
	_, err := env.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(f.ctx, name, csr, metav1.UpdateOptions{})
	require.NoError(t, err)
	logged := len(entriesFor(name))

	// Now the permission is there, and a later request of the same node is
	// approved; the denied one is not decided again.
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	requireApproved(t, submit(t, node, "denied-1-again", csrgen.Request{Subject: csrgen.NodeSubject("denied-1")}), "denied-1", "selfnodeclient")
	c := harness.Verdict(env.GetCSR(t, name))
	require.NotNil(t, c)
	assert.Equal(t, certificatesv1.CertificateDenied, c.Type)
	assert.Equal(t, "ByHand", c.Reason)
	assert.LessOrEqual(t, len(entriesFor(name)), logged+1, "at most a re-check already under way")
}

func withSAN(t *testing.T, r csrgen.Request, names ...asn1.RawValue) csrgen.Request {
	t.Helper()
	var body []byte
	for _, n := range names {
		b, err := asn1.Marshal(n)
		require.NoError(t, err)
		body = append(body, b...)
	}
	value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: body})
	require.NoError(t, err)
	r.Extensions = append(r.Extensions, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: value})
	return r
}

// otherName is a Microsoft UPN otherName, a type crypto/x509 does not decode.
func otherName(t *testing.T) asn1.RawValue {
	t.Helper()
	oid, err := asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3})
	require.NoError(t, err)
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: oid}
}

type logEntry struct {
	DecisionID string    `json:"decision_id"`
	Path       string    `json:"path"`
	Timestamp  time.Time `json:"timestamp"`
	Input      struct {
		CSR struct {
			Name string `json:"name"`
		} `json:"csr"`
		Authorization map[string]struct {
			Allowed bool `json:"allowed"`
		} `json:"authorization"`
		Machine *struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
			Cluster   string `json:"cluster"`
		} `json:"machine"`
	} `json:"input"`
	Result  engine.CSRDecision `json:"result"`
	Bundles map[string]struct {
		Revision string `json:"revision"`
	} `json:"bundles"`
}

// entriesFor is the kubelet-client decisions logged for the CSR, oldest first.
func entriesFor(csr string) []logEntry {
	return harness.Decisions(decisionLog, func(e logEntry) bool {
		return e.Input.CSR.Name == csr && strings.Contains(e.Path, "kubelet_client")
	})
}

// The rule never denies, and the engine refuses a bundle whose rule does; an
// answer that is not an approval, or a decision that failed, leaves the
// request pending, asked again on the re-check timer, and it is approved once
// the bundle answers properly again.
func TestAnOddAnswerOfTheBundleNeverDeniesAndLeavesTheRequestPending(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		node   string
		answer func() (engine.CSRDecision, error)
	}{
		{"odd-deny", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{Action: engine.ActionDeny, Reasons: engine.Reasons{{Code: "X", Message: "x"}}, DecisionID: "d-deny"}, nil
		}},
		{"odd-error", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{}, errors.New("evaluate ichor/kubelet_client/decision: builtin error")
		}},
		{"odd-approve", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{Action: engine.ActionApprove, DecisionID: "d-approve"}, nil
		}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			odd.Set(tc.node, tc.answer)
			t.Cleanup(func() { odd.Set(tc.node, nil) })
			f.machine(tc.node)
			user := "system:node:" + tc.node
			bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
			name := submit(t, userClient(t, user, "system:nodes"), "csr-"+tc.node, csrgen.Request{Subject: csrgen.NodeSubject(tc.node)})

			require.Eventually(t, func() bool { return odd.Asked(tc.node) >= 2 }, wait, 50*time.Millisecond)
			assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "neither denied nor approved on an odd answer")

			odd.Set(tc.node, nil)
			requireApproved(t, name, tc.node, "selfnodeclient")
		})
	}
}

// A request for a weak key (an RSA key that can be factored, a weak curve)
// is not recognized, however well it names the node and whatever the
// requester may do: it stays pending, with the key named.
// A kubelet's renewal for a weak key, which kube-controller-manager would
// approve, is recognized as it and left pending, and the operator is told
// why on the request: it was taken for no kubelet's, and nothing said why
// the node never renewed (review 238 F1).
func TestAWeakKeyIsLeftPendingAndSaid(t *testing.T) {
	f := newFixture(t)
	f.machine("weak-1")
	user := "system:node:weak-1"
	bind(t, user, []string{"system:nodes"}, roleSelfNodeClient)
	weak, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	name := submit(t, userClient(t, user, "system:nodes"), "weak-1", csrgen.Request{Subject: csrgen.NodeSubject("weak-1"), Key: weak})

	e := requirePending(t, name, "PublicKeyNotAllowed")
	assert.Contains(t, e.Result.Reasons[0].Message, `public key "ECDSA P-224 224-bit" is not allowed`)
	assert.Equal(t, "selfnodeclient", e.Result.Kind)
	assert.Contains(t, requirePendingEvent(t, name).Note, "PublicKeyNotAllowed")
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)))
}

// ownEngine is an engine of the embedded bundle beside the suite's, for a
// test's second approver, logging to log.
func ownEngine(t *testing.T, log *harness.DecisionLog) *engine.Engine {
	t.Helper()
	b, err := bundles.Default()
	require.NoError(t, err)
	eng, err := engine.New(t.Context(), engine.Options{Bundle: b, DecisionLog: log, Log: os.Stderr})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Stop(context.Background()) })
	return eng
}

// A new bundle decides the requests the last one left pending at once, not
// at their recheck (an hour here), and once; and those the last one gave no
// decision on, which nothing else would bring back. An approver of its own,
// beside the suite's, with its own decision log and an engine whose active
// revision the test says.
func TestANewBundleDecidesAPendingRequestAtOnce(t *testing.T) {
	f := newFixture(t)
	f.machine("rebundle-1")
	f.machine("rebundle-2")
	f.machine("rebundle-3")
	token := "system:bootstrap:rebund"
	groups := []string{"system:bootstrappers"}
	bind(t, token, groups, roleBootstrapper)

	log := &harness.DecisionLog{}
	eng := ownEngine(t, log)
	var revision atomic.Pointer[string]
	active := eng.Revision()
	revision.Store(&active)
	// The first bundle governs no request of rebundle-2; the first decision
	// on rebundle-3's is made as a bundle is activated, its wake gone by.
	var ungoverned atomic.Int32
	var midway atomic.Bool
	mid := "activated-midway"
	noDecision := func(_ context.Context, in csrinput.KubeletClient) (engine.CSRDecision, error) {
		switch {
		case in.Machine == nil:
		case in.Machine.Name == "rebundle-2" && *revision.Load() == active:
			ungoverned.Add(1)
			return engine.CSRDecision{}, engine.ErrNoDecision
		case in.Machine.Name == "rebundle-3" && midway.CompareAndSwap(false, true):
			revision.Store(&mid)
		}
		return engine.CSRDecision{}, enginetest.ErrPass
	}
	r := besideTheSuites(t, "rebundle",
		&enginetest.Engine{Engine: eng, KubeletClientFunc: noDecision, RevisionFunc: func() string { return *revision.Load() }},
		time.Hour, time.Hour)

	pendingOf := func(csr string) int {
		return len(harness.Decisions(log, func(e logEntry) bool {
			return e.Input.CSR.Name == csr && e.Result.Action == engine.ActionPending && e.Input.Machine != nil
		}))
	}
	pending := func() int { return pendingOf("rebundle-1") }
	name := submit(t, userClient(t, token, groups...), "rebundle-1", csrgen.Request{Subject: csrgen.NodeSubject("rebundle-1")})
	require.Equal(t, "rebundle-1", name)
	require.Eventually(t, func() bool { return pending() > 0 }, wait, 50*time.Millisecond, "left pending: the token may not ask for a node client")
	before := pending()
	other := submit(t, userClient(t, token, groups...), "rebundle-2", csrgen.Request{Subject: csrgen.NodeSubject("rebundle-2")})
	require.Eventually(t, func() bool { return ungoverned.Load() > 0 }, wait, 50*time.Millisecond)
	assert.Zero(t, pendingOf(other), "no decision under the first bundle")

	// The suite's approver, rechecking every few seconds, logs elsewhere.
	next := "another-bundle"
	revision.Store(&next)
	r.BundleActivated(next)
	require.Eventually(t, func() bool { return pending() > before }, wait, 50*time.Millisecond, "decided again under the new bundle")
	require.Eventually(t, func() bool { return pendingOf(other) > 0 }, wait, 50*time.Millisecond, "decided under the new bundle, which governs it")
	assert.Equal(t, int32(1), ungoverned.Load(), "asked once under the first bundle")
	r.BundleActivated(next)
	r.BundleActivated(active)
	// Told of the old bundle while the new one serves: a wake, and the
	// request, decided under the new one already, is not decided again.
	// Its look is over once a request made after it is decided: the wake
	// is listed as it is told, well before the later request's event
	// comes, and the approver's one worker takes them in turn. (Were the
	// event first, this check would pass without having seen the look.)
	later := submit(t, userClient(t, token, groups...), "rebundle-1-later", csrgen.Request{Subject: csrgen.NodeSubject("rebundle-1")})
	require.Eventually(t, func() bool {
		return len(harness.Decisions(log, func(e logEntry) bool { return e.Input.CSR.Name == later })) > 0
	}, wait, 50*time.Millisecond)
	assert.Equal(t, before+1, pending(), "decided once under the new bundle")
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)))

	// Its verdict, reached as the bundle changed, is reached again at once
	// under the new one, not at its recheck.
	third := submit(t, userClient(t, token, groups...), "rebundle-3", csrgen.Request{Subject: csrgen.NodeSubject("rebundle-3")})
	require.Eventually(t, func() bool { return pendingOf(third) >= 2 }, wait, 50*time.Millisecond, "decided again under the bundle activated during its first decision")
}

// A request the rule gives no decision on is asked again on a pending
// request's recheck, not only when something the memo keys on changes: the
// rule may leave it out on what it does not key on (the
// SubjectAccessReviews, which RBAC changes).
func TestARequestTheRuleDoesNotGovernIsAskedAgainOnItsRecheck(t *testing.T) {
	f := newFixture(t)
	f.machine("ungoverned-1")
	token := "system:bootstrap:ungove"
	groups := []string{"system:bootstrappers"}
	bind(t, token, groups, roleBootstrapper)

	eng := ownEngine(t, &harness.DecisionLog{})
	var asked atomic.Int32
	noDecision := func(_ context.Context, in csrinput.KubeletClient) (engine.CSRDecision, error) {
		if in.Machine != nil && in.Machine.Name == "ungoverned-1" {
			asked.Add(1)
			return engine.CSRDecision{}, engine.ErrNoDecision
		}
		return engine.CSRDecision{}, enginetest.ErrPass
	}
	besideTheSuites(t, "ungoverned", &enginetest.Engine{Engine: eng, KubeletClientFunc: noDecision}, 200*time.Millisecond, time.Second)

	submit(t, userClient(t, token, groups...), "ungoverned-1", csrgen.Request{Subject: csrgen.NodeSubject("ungoverned-1")})
	require.Eventually(t, func() bool { return asked.Load() >= 3 }, wait, 50*time.Millisecond,
		"a request no rule governs was not asked again on its recheck")
}

// A request the rule does not recognize (kind "") is rechecked only every
// 24 longest rechecks: nothing but the request itself, its machine or the
// bundle, each of which wakes it, can make it recognized, and each recheck
// cost two SubjectAccessReviews and a decision-log entry, for as long as
// kube-controller-manager keeps the request (a day). A flood of such
// requests from a bootstrap token made that a worker's whole time (review
// 158). A request recognized but not authorized still is rechecked at the
// usual pace, for its permission may come.
func TestAnUnrecognizedRequestIsRecheckedOnlySeldom(t *testing.T) {
	f := newFixture(t)
	f.machine("unrec-1")
	f.machine("unrec-2")
	f.machine("unrec-3")
	token := "system:bootstrap:unrec1"
	groups := []string{"system:bootstrappers"}
	bind(t, token, groups, roleBootstrapper)

	eng := ownEngine(t, &harness.DecisionLog{})
	var unrecognized, unauthorized, weak atomic.Int32
	count := func(_ context.Context, in csrinput.KubeletClient) (engine.CSRDecision, error) {
		if in.Machine != nil {
			switch in.Machine.Name {
			case "unrec-1":
				unrecognized.Add(1)
			case "unrec-2":
				unauthorized.Add(1)
			case "unrec-3":
				weak.Add(1)
			}
		}
		return engine.CSRDecision{}, enginetest.ErrPass
	}
	besideTheSuites(t, "unrecognized", &enginetest.Engine{Engine: eng, KubeletClientFunc: count}, 200*time.Millisecond, 400*time.Millisecond)

	requester := userClient(t, token, groups...)
	submit(t, requester, "unrec-1", csrgen.Request{Subject: pkix.Name{CommonName: "system:node:unrec-1", Organization: []string{"acme"}}})
	submit(t, requester, "unrec-2", csrgen.Request{Subject: csrgen.NodeSubject("unrec-2")})
	// Recognized, authorized (the token may create nodeclient requests),
	// held by its key alone, which no binding lifts (review 243 F4).
	weakKey, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	submit(t, requester, "unrec-3", csrgen.Request{Subject: csrgen.NodeSubject("unrec-3"), Key: weakKey})
	// The unauthorized one is asked again and again meanwhile: long enough
	// for several rechecks of the others, had they any.
	require.Eventually(t, func() bool { return unauthorized.Load() >= 5 }, wait, 50*time.Millisecond,
		"a request recognized but not authorized was not rechecked")
	assert.Equal(t, int32(1), unrecognized.Load(), "a request not recognized was decided again with nothing changed")
	assert.Equal(t, int32(1), weak.Load(), "a request held by its key was decided again with nothing changed")
	// And still rechecked, at 24 longest rechecks (9.6 s here), in case a
	// bundle's kind reads the reviews after all (review 160).
	require.Eventually(t, func() bool { return unrecognized.Load() >= 2 }, wait, 100*time.Millisecond,
		"a request not recognized was never rechecked")
}

// besideTheSuites runs, until the test ends, another approver beside the
// suite's (of the same name, in a manager of its own) deciding through e,
// with the rechecks given.
func besideTheSuites(t *testing.T, name string, e kubeletclient.Decider, recheck, maxRecheck time.Duration) *kubeletclient.Reconciler {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	r := &kubeletclient.Reconciler{
		Client: mgr.GetClient(), Clientset: env.Clientset, LocalClusters: local, Engine: e,
		RecheckInterval: recheck, MaxRecheckInterval: maxRecheck,
	}
	require.NoError(t, r.SetupWithManager(t.Context(), mgr, kubeletclient.SetupOptions{NodeNameIndexRegistered: false}))
	ctx, cancel := context.WithCancel(t.Context())
	done := harness.RunManager(ctx, mgr, name)
	t.Cleanup(func() { cancel(); <-done })
	return r
}
