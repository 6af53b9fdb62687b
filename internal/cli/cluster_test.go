package cli_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	talosclient "github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	clusterfacts "github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
	"github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// clusterEnv is the world of the ichor cluster commands: a real API server
// with the shipped roles, the credential webhook and controller running in a
// manager with exactly the rights of their RBAC markers, a TalosCluster
// "demo" in namespace team-a with one control-plane machine served by a
// Talos API test server, and people bound to the shipped roles.
type clusterEnv struct {
	env  *harness.Env
	node *harness.TalosNode
	dir  string
	// kubeconfigs of ichor:ada (ichor-admin), ichor:otto (ichor-operator),
	// ichor:vera (ichor-viewer) and ichor:walt (ichor-viewer, and create on
	// taloscredentialrequests).
	kubeconfig map[string]string
	// talosconfig is the current talosconfig ($TALOSCONFIG), which must never
	// be overwritten.
	talosconfig string
}

const (
	teamNS         = "team-a"
	managerUser    = "ichor-test:manager"
	testRetention  = 5 * time.Second
	currentTalosEP = "10.9.9.9"
)

// TestClusterCommands runs every flow on one control plane (starting one
// costs seconds; the flows do not interfere: each writes its own files).
func TestClusterCommands(t *testing.T) {
	started := time.Now()
	ce := startClusterEnv(t)
	t.Logf("control plane, webhook and controller ready in %s", time.Since(started).Round(time.Millisecond))

	t.Run("OperatorGetsAReaderTalosconfig", ce.testOperatorTalosconfig)
	t.Run("AdminGetsAReaderTalosconfig", ce.testAdminTalosconfig)
	t.Run("RefusesToOverwrite", ce.testRefusesToOverwrite)
	t.Run("RefusesThirteenHoursBeforeSending", ce.testRefusesThirteenHours)
	t.Run("ViewerIsRefused", ce.testViewerIsRefused)
	t.Run("EndpointsFallBack", ce.testEndpointsFallBack)
	t.Run("KubectlFlagsImpersonate", ce.testKubectlFlagsImpersonate)
	t.Run("TalosconfigMerge", ce.testTalosconfigMerge)
	t.Run("RenderFromTheAPIServer", ce.testRenderFromTheAPIServer)
	t.Run("AdminKubeconfigWorksUntilRevoked", ce.testAdminKubeconfig)
	t.Run("BreakGlassKubeconfig", ce.testBreakGlassKubeconfig)
	t.Run("ExecCredentialPlugin", ce.testExecCredentialPlugin) // cluster_exec_test.go
	t.Run("AnsweredRequestsAreDeleted", ce.testAnsweredRequestsAreDeleted)
}

func startClusterEnv(t *testing.T) *clusterEnv {
	t.Helper()
	ctx := t.Context()
	env := harness.StartForTest(t, harness.Options{})
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))

	roles, err := webhooktest.ShippedRoles()
	require.NoError(t, err)
	for i := range roles {
		require.NoError(t, env.Client.Create(ctx, &roles[i]))
	}

	// The manager's rights: the markers of the webhook and the controller.
	var rules []rbacv1.PolicyRule
	for _, pkg := range []string{"webhook", "controllers/credentials"} {
		r, err := webhooktest.MarkerRules(pkg)
		require.NoError(t, err)
		rules = append(rules, r...)
	}
	require.NoError(t, env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: managerUser}, Rules: rules}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: managerUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: managerUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: managerUser}},
	}))
	keyRules, err := webhooktest.NamespacedMarkerRules("internal/facts/credential")
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: harness.ManagerNamespace, Name: managerUser}, Rules: keyRules}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: harness.ManagerNamespace, Name: managerUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: managerUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: managerUser}},
	}))
	waitAllowed(t, env, managerUser, authorizationv1.ResourceAttributes{Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "cluster-admin", Verb: "bind"})
	waitAllowed(t, env, managerUser, authorizationv1.ResourceAttributes{Namespace: harness.ManagerNamespace, Resource: "secrets", Name: credential.DefaultKeySecretName, Verb: "update"})
	require.NoError(t, webhooktest.InstallAdmissionPolicies(ctx, env.Client, "default"))

	eng, err := engine.New(ctx, engine.Options{DecisionLog: &bytes.Buffer{}, Log: os.Stderr, ID: "cli-test"})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Stop(context.Background()) })
	install, err := webhooktest.Install(env.Config)
	require.NoError(t, err)
	t.Cleanup(func() { _ = install.Cleanup() })
	managerCfg, err := env.UserConfig(managerUser)
	require.NoError(t, err)
	mgr, err := ctrl.NewManager(managerCfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          crwebhook.NewServer(webhooktest.ServerOptions(install)),
	})
	require.NoError(t, err)
	keyClient, err := client.New(managerCfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	keys := env.AdmissionKeys(keyClient)
	local, err := clusterfacts.ParseLocal([]string{teamNS + "/demo", teamNS + "/bare"})
	require.NoError(t, err)
	require.NoError(t, (&webhook.CredentialRequestValidator{Engine: eng, Instance: "cli-test", Keys: keys, LocalClusters: local}).SetupWithManager(mgr))
	require.NoError(t, (&credentials.Reconciler{Engine: eng, Keys: keys, AdminKubeconfigs: true, Retention: testRetention, LocalClusters: local}).SetupWithManager(mgr))
	require.NoError(t, (&credentials.AdminBindings{Engine: eng, Recorder: mgr.GetEventRecorder("ichor-credentials"), AdminKubeconfigs: true}).SetupWithManager(mgr))
	mgrDone := make(chan struct{})
	go func() {
		defer close(mgrDone)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { <-mgrDone }) // t.Context() ends before the cleanups run
	startedCheck := mgr.GetWebhookServer().StartedChecker()
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return startedCheck(nil) == nil, nil
	}))

	// The cluster, its secrets and one control-plane machine.
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamNS}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(teamNS, "talos-secrets")))
	for _, name := range []string{"demo", "bare"} {
		require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: name},
			Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"}},
		}))
	}
	node, err := env.StartTalosNode(ctx, harness.NodeOptions{Name: "cp-1"})
	require.NoError(t, err)
	for _, m := range []struct {
		name, endpoint string
		role           ichorv1alpha1.MachineRole
	}{
		{"cp-1", node.Endpoint(), ichorv1alpha1.MachineRoleControlPlane},
		// A worker's endpoint is not a talosconfig endpoint.
		{"worker-1", "10.7.7.7:50000", ichorv1alpha1.MachineRoleWorker},
	} {
		require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: m.name},
			Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Hostname: m.name, Endpoint: m.endpoint, Role: m.role},
		}))
	}

	ce := &clusterEnv{env: env, node: node, dir: t.TempDir(), kubeconfig: map[string]string{}}
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "ask-for-credentials"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"}}},
	}))
	// The break-glass grant no shipped role holds, bound by hand for one
	// cluster.
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "break-glass-demo"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"ichor.dev"}, Resources: []string{"talosclusters/kubeconfig-super-admin"}, ResourceNames: []string{"demo"}, Verbs: []string{"download"},
		}},
	}))
	for user, roleRefs := range map[string][]rbacv1.RoleRef{
		"ada":  {{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-admin"}},
		"otto": {{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-operator"}},
		"vera": {{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-viewer"}},
		"walt": {{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-viewer"}, {APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ask-for-credentials"}},
		"bea":  {{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-admin"}, {APIGroup: rbacv1.GroupName, Kind: "Role", Name: "break-glass-demo"}},
	} {
		name := "ichor:" + user
		for _, ref := range roleRefs {
			require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: user + "-" + ref.Name},
				RoleRef:    ref,
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
			}))
		}
		waitAllowed(t, env, name, authorizationv1.ResourceAttributes{Namespace: teamNS, Group: "ichor.dev", Resource: "talosclusters", Verb: "get"})
		cfg, err := env.UserConfig(name)
		require.NoError(t, err)
		ce.kubeconfig[user] = writeKubeconfig(t, ce.dir, user, cfg)
	}
	waitAllowed(t, env, "ichor:walt", authorizationv1.ResourceAttributes{Namespace: teamNS, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"})
	// Rita may revoke admins, and nothing else: list and delete on
	// clusterrolebindings (no bind: she cannot grant cluster-admin), list
	// on taloscredentialrequests (the person's requests in flight), create
	// Events in default, and a SelfSubjectReview (everyone may).
	require.NoError(t, env.Client.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "revoke-admins"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterrolebindings"}, Verbs: []string{"list", "delete"}},
			{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"list"}},
		},
	}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "rita-revoke-admins"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "revoke-admins"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:rita"}},
	}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "revocation-events"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}}},
	}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "rita-revocation-events"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "revocation-events"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:rita"}},
	}))
	waitAllowed(t, env, "ichor:rita", authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "clusterrolebindings", Verb: "delete"})
	waitAllowed(t, env, "ichor:rita", authorizationv1.ResourceAttributes{Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "list"})
	waitAllowed(t, env, "ichor:rita", authorizationv1.ResourceAttributes{Namespace: metav1.NamespaceDefault, Group: "events.k8s.io", Resource: "events", Verb: "create"})
	ritaCfg, err := env.UserConfig("ichor:rita")
	require.NoError(t, err)
	ce.kubeconfig["rita"] = writeKubeconfig(t, ce.dir, "rita", ritaCfg)
	waitAllowed(t, env, "ichor:bea", authorizationv1.ResourceAttributes{Namespace: teamNS, Group: "ichor.dev", Resource: "talosclusters", Subresource: "kubeconfig-super-admin", Name: "demo", Verb: "download"})

	// The person's current talosconfig, pointing elsewhere.
	ce.talosconfig = filepath.Join(ce.dir, "talos", "config")
	require.NoError(t, os.MkdirAll(filepath.Dir(ce.talosconfig), 0o700))
	current := &clientconfig.Config{Context: "prod", Contexts: map[string]*clientconfig.Context{"prod": {Endpoints: []string{currentTalosEP}}}}
	require.NoError(t, current.Save(ce.talosconfig))
	t.Setenv("TALOSCONFIG", ce.talosconfig)
	return ce
}

func waitAllowed(t *testing.T, env *harness.Env, user string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
		if err := env.Client.Create(ctx, sar); err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	}), "RBAC never allowed %s to %+v", user, attrs)
}

// writeKubeconfig writes cfg as a person's kubeconfig, in namespace team-a.
func writeKubeconfig(t *testing.T, dir, user string, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts[user] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user, Namespace: teamNS}
	kc.CurrentContext = user
	path := filepath.Join(dir, user+".kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// ichor runs the command line in-process.
func (ce *clusterEnv) ichor(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := cli.Run(ctx, args, strings.NewReader(""), &out, &errOut)
	t.Logf("$ ichor %s\n%s%s(exit %d)", strings.Join(args, " "), out.String(), errOut.String(), code)
	return code, out.String(), errOut.String()
}

func (ce *clusterEnv) events(t *testing.T, reason string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	require.NoError(t, ce.env.Client.List(t.Context(), &list, client.InNamespace(teamNS)))
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// requestUIDs are the requests there are now. Answered requests are deleted
// after testRetention, so whether a command sent one is told by a UID not
// seen before, not by the count.
func (ce *clusterEnv) requestUIDs(t *testing.T) map[types.UID]bool {
	t.Helper()
	var list ichorv1alpha1.TalosCredentialRequestList
	require.NoError(t, ce.env.Client.List(t.Context(), &list, client.InNamespace(teamNS)))
	uids := make(map[types.UID]bool, len(list.Items))
	for _, r := range list.Items {
		uids[r.UID] = true
	}
	return uids
}

// assertNoNewRequest checks that no request was made since before.
func (ce *clusterEnv) assertNoNewRequest(t *testing.T, before map[types.UID]bool, msgAndArgs ...any) {
	t.Helper()
	for uid := range ce.requestUIDs(t) {
		assert.True(t, before[uid], msgAndArgs...)
	}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	return info.Mode().Perm()
}

// readTalosconfig checks a written talosconfig: mode 0600, one context whose
// certificate is exactly os:reader and verifies against its CA, and the
// endpoints.
func readTalosconfig(t *testing.T, path string) (*clientconfig.Config, *x509.Certificate) {
	t.Helper()
	assert.Equal(t, os.FileMode(0o600), mode(t, path))
	cfg, err := clientconfig.Open(path)
	require.NoError(t, err)
	require.Len(t, cfg.Contexts, 1)
	tc := cfg.Contexts[cfg.Context]
	require.NotNil(t, tc)
	crt, err := base64.StdEncoding.DecodeString(tc.Crt)
	require.NoError(t, err)
	block, _ := pem.Decode(crt)
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.Equal(t, []string{"os:reader"}, cert.Subject.Organization)
	ca, err := base64.StdEncoding.DecodeString(tc.CA)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca))
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	return cfg, cert
}

// assertReads uses the talosconfig as talosctl would: it reads the node and
// is refused Reboot, which needs os:operator.
func (ce *clusterEnv) assertReads(t *testing.T, path string) {
	t.Helper()
	cfg, err := clientconfig.Open(path)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := talosclient.New(ctx, talosclient.WithConfig(cfg))
	require.NoError(t, err)
	defer c.Close() //nolint:errcheck

	version, err := c.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, "v1.14.1", version.GetMessages()[0].GetVersion().GetTag())

	reboots := ce.node.Reboots()
	denied := ce.node.Denied(talosapi.MethodReboot)
	err = c.Reboot(ctx)
	require.Error(t, err)
	t.Logf("reboot with the os:reader talosconfig: %v", err)
	assert.Contains(t, err.Error(), "PermissionDenied")
	assert.Equal(t, reboots, ce.node.Reboots(), "an os:reader talosconfig rebooted the node")
	assert.Equal(t, denied+1, ce.node.Denied(talosapi.MethodReboot))
}

func (ce *clusterEnv) testOperatorTalosconfig(t *testing.T) {
	before := len(ce.events(t, "TalosconfigReader"))
	code, stdout, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"])
	require.Equal(t, cli.ExitOK, code, stderr)

	out := ce.talosconfig + ".ichor-reader"
	assert.Contains(t, stdout, "Wrote an os:reader talosconfig for team-a/demo to "+out)
	assert.Contains(t, stderr, "waiting for the controller")
	assert.Contains(t, stderr, "answered after")
	cfg, cert := readTalosconfig(t, out)
	assert.Equal(t, []string{ce.node.Endpoint()}, cfg.Contexts[cfg.Context].Endpoints, "the control-plane machine, not the worker nor the current talosconfig")
	assert.WithinDuration(t, time.Now().Add(time.Hour), cert.NotAfter, time.Minute)
	ce.assertReads(t, out)

	// The current talosconfig is untouched.
	current, err := clientconfig.Open(ce.talosconfig)
	require.NoError(t, err)
	assert.Equal(t, []string{currentTalosEP}, current.Contexts["prod"].Endpoints)

	events := ce.events(t, "TalosconfigReader")
	require.Len(t, events, before+1)
	assert.Contains(t, eventMessages(events), "an os:reader talosconfig was requested by ichor:otto (lifetime 1h0m0s)")
}

func (ce *clusterEnv) testAdminTalosconfig(t *testing.T) {
	out := filepath.Join(ce.dir, "ada-reader.yaml")
	code, _, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["ada"], "--ttl", "4h", "--out", out)
	require.Equal(t, cli.ExitOK, code, stderr)
	_, cert := readTalosconfig(t, out)
	assert.Equal(t, 4*time.Hour, cert.NotAfter.Sub(cert.NotBefore))
	ce.assertReads(t, out)
	assert.Contains(t, eventMessages(ce.events(t, "TalosconfigReader")), "an os:reader talosconfig was requested by ichor:ada (lifetime 4h0m0s)")
}

func (ce *clusterEnv) testRefusesToOverwrite(t *testing.T) {
	out := filepath.Join(ce.dir, "existing.yaml")
	require.NoError(t, os.WriteFile(out, []byte("keep me\n"), 0o600))
	currentBefore, err := os.ReadFile(ce.talosconfig)
	require.NoError(t, err)
	link := filepath.Join(ce.dir, "link-to-current")
	require.NoError(t, os.Symlink(ce.talosconfig, link))
	requests := ce.requestUIDs(t)

	code, _, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--out", out)
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "refusing to overwrite "+out+": it exists; pass --force to replace it")
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "keep me\n", string(data))

	// The current talosconfig, by name or through a link, even with --force.
	for _, target := range []string{ce.talosconfig, link} {
		code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--out", target, "--force")
		assert.Equal(t, cli.ExitUsage, code)
		assert.Contains(t, stderr, "it is the file you use now")
	}
	after, err := os.ReadFile(ce.talosconfig)
	require.NoError(t, err)
	assert.Equal(t, currentBefore, after)
	ce.assertNoNewRequest(t, requests, "a refused command sent a request")

	// --force replaces another file, with mode 0600 whatever it had.
	require.NoError(t, os.Chmod(out, 0o644))
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--out", out, "--force")
	require.Equal(t, cli.ExitOK, code, stderr)
	readTalosconfig(t, out)
}

func (ce *clusterEnv) testRefusesThirteenHours(t *testing.T) {
	requests, events := ce.requestUIDs(t), len(ce.events(t, "TalosconfigReader"))
	out := filepath.Join(ce.dir, "thirteen.yaml")
	code, _, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--ttl", "13h", "--out", out)
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, `refused by the policy before anything was sent: LifetimeTooLong: the lifetime 13h0m0s is above the cap of 12h0m0s for purpose "talosconfig-reader"`)
	assert.NoFileExists(t, out)
	ce.assertNoNewRequest(t, requests)
	assert.Len(t, ce.events(t, "TalosconfigReader"), events)

	// Twelve hours is the cap, and allowed.
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--ttl", "12h", "--out", out)
	require.Equal(t, cli.ExitOK, code, stderr)
	_, cert := readTalosconfig(t, out)
	assert.Equal(t, 12*time.Hour, cert.NotAfter.Sub(cert.NotBefore))
}

func (ce *clusterEnv) testViewerIsRefused(t *testing.T) {
	events := len(ce.events(t, "TalosconfigReader"))

	// ichor-viewer alone may not even create a request: the API server's
	// RBAC refuses before the webhook; the command adds what the policy
	// requires.
	out := filepath.Join(ce.dir, "vera.yaml")
	code, _, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["vera"], "--out", out)
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, `User "ichor:vera" cannot create resource "taloscredentialrequests"`)
	assert.Contains(t, stderr, `the credential needs download on talosclusters.ichor.dev/talosconfig-reader "demo", in namespace "team-a"`)
	assert.NoFileExists(t, out)

	// A viewer who may create requests is refused by the webhook, which
	// names the verb the viewer lacks.
	out = filepath.Join(ce.dir, "walt.yaml")
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["walt"], "--out", out)
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, `admission webhook "vtaloscredentialrequest.ichor.dev" denied the request: NotAuthorized: user "ichor:walt" may not download talosclusters/talosconfig-reader "demo" in namespace "team-a"`)
	assert.NoFileExists(t, out)
	assert.Len(t, ce.events(t, "TalosconfigReader"), events)

	// The operator may not have the admin kubeconfig, and is told which verb.
	code, _, stderr = ce.ichor(t, "cluster", "kubeconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--out", filepath.Join(ce.dir, "otto-admin"))
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, `NotAuthorized: user "ichor:otto" may not download talosclusters/kubeconfig-admin "demo"`)
}

func (ce *clusterEnv) testEndpointsFallBack(t *testing.T) {
	// No machines: the current talosconfig's endpoints.
	out := filepath.Join(ce.dir, "bare-current.yaml")
	code, _, stderr := ce.ichor(t, "cluster", "talosconfig", "bare", "--kubeconfig", ce.kubeconfig["otto"], "--out", out)
	require.Equal(t, cli.ExitOK, code, stderr)
	cfg, _ := readTalosconfig(t, out)
	assert.Equal(t, []string{currentTalosEP}, cfg.Contexts[cfg.Context].Endpoints)

	// No machines and the flag: the flag.
	out = filepath.Join(ce.dir, "bare-flag.yaml")
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "bare", "--kubeconfig", ce.kubeconfig["otto"], "--out", out, "--talos-endpoints", "10.1.1.1,10.1.1.2")
	require.Equal(t, cli.ExitOK, code, stderr)
	cfg, _ = readTalosconfig(t, out)
	assert.Equal(t, []string{"10.1.1.1", "10.1.1.2"}, cfg.Contexts[cfg.Context].Endpoints)

	// Machines and the flag: the operator's flag, not what whoever may
	// write a TalosMachine named (the hostile review of 2026-12-05).
	out = filepath.Join(ce.dir, "demo-flag.yaml")
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--out", out, "--talos-endpoints", "10.1.1.3")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stderr, "--talos-endpoints")
	cfg, _ = readTalosconfig(t, out)
	assert.Equal(t, []string{"10.1.1.3"}, cfg.Contexts[cfg.Context].Endpoints)
}

// testKubectlFlagsImpersonate: kubectl's flags reach the API server. The
// test's admin, impersonating the operator with --as, is issued the
// operator's credential (the request, its Event and the requester pinned by
// admission all name the operator), and impersonating the viewer is refused
// as the viewer.
func (ce *clusterEnv) testKubectlFlagsImpersonate(t *testing.T) {
	admin := filepath.Join(ce.dir, "admin.kubeconfig")
	require.NoError(t, os.WriteFile(admin, ce.env.AdminKubeconfig, 0o600))
	out := filepath.Join(ce.dir, "as-otto.yaml")
	code, _, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", admin, "-n", teamNS,
		"--as", "ichor:otto", "--as-group", "system:authenticated", "--request-timeout", "30s", "--ttl", "2h", "--out", out)
	require.Equal(t, cli.ExitOK, code, stderr)
	readTalosconfig(t, out)
	assert.Contains(t, eventMessages(ce.events(t, "TalosconfigReader")), "an os:reader talosconfig was requested by ichor:otto (lifetime 2h0m0s)")

	out = filepath.Join(ce.dir, "as-vera.yaml")
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", admin, "-n", teamNS, "--as", "ichor:vera", "--out", out)
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, `User "ichor:vera" cannot create resource "taloscredentialrequests"`)
	assert.NoFileExists(t, out)
}

// testTalosconfigMerge: --merge merges into the talosconfig talosctl uses,
// as talosctl config merge does: ~/.talos/config without $TALOSCONFIG, the
// file $TALOSCONFIG names (through a link) with it; existing contexts are
// kept, a second merge is renamed, and the merged context is the current one.
func (ce *clusterEnv) testTalosconfigMerge(t *testing.T) {
	home := filepath.Join(ce.dir, "merge-home")
	t.Setenv("HOME", home)
	for _, v := range []string{"TALOSCONFIG", "TALOS_HOME"} {
		t.Setenv(v, "")
		require.NoError(t, os.Unsetenv(v))
	}
	talosconfig := filepath.Join(home, ".talos", "config")
	require.NoError(t, os.MkdirAll(filepath.Dir(talosconfig), 0o700))
	prod := &clientconfig.Config{Context: "prod", Contexts: map[string]*clientconfig.Context{"prod": {Endpoints: []string{currentTalosEP}}}}
	require.NoError(t, prod.Save(talosconfig))

	code, stdout, stderr := ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--merge")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, "Wrote an os:reader talosconfig for team-a/demo as context demo-reader (now the current one) to "+talosconfig)
	assert.Contains(t, stdout, "Use it with: talosctl version")
	assert.NotContains(t, stderr, "renamed")
	code, stdout, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--merge")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stderr, `renamed talosconfig context "demo-reader" -> "demo-reader-1"`)
	assert.Contains(t, stdout, "as context demo-reader-1 (now the current one)")

	assert.Equal(t, os.FileMode(0o600), mode(t, talosconfig))
	merged, err := clientconfig.Open(talosconfig)
	require.NoError(t, err)
	assert.Equal(t, "demo-reader-1", merged.Context)
	require.Len(t, merged.Contexts, 3)
	assert.Equal(t, []string{currentTalosEP}, merged.Contexts["prod"].Endpoints, "an existing context is kept")
	first, second := merged.Contexts["demo-reader"], merged.Contexts["demo-reader-1"]
	require.NotNil(t, first)
	require.NotNil(t, second)
	assert.NotEqual(t, first.Crt, second.Crt, "the second merge renamed its own context, not replaced the first")
	// talosctl with the merged file uses the merged context, and reads.
	ce.assertReads(t, talosconfig)

	// $TALOSCONFIG, through a link: the file it names gets the context, the
	// link stays a link, and ~/.talos/config is not touched.
	target := filepath.Join(ce.dir, "merge-elsewhere", "talosconfig")
	require.NoError(t, os.MkdirAll(filepath.Dir(target), 0o700))
	require.NoError(t, prod.Save(target))
	link := filepath.Join(ce.dir, "merge-link")
	require.NoError(t, os.Symlink(target, link))
	t.Setenv("TALOSCONFIG", link)
	before, err := os.ReadFile(talosconfig)
	require.NoError(t, err)
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--merge")
	require.Equal(t, cli.ExitOK, code, stderr)
	info, err := os.Lstat(link)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSymlink, info.Mode().Type())
	elsewhere, err := clientconfig.Open(target)
	require.NoError(t, err)
	assert.Equal(t, "demo-reader", elsewhere.Context)
	assert.Len(t, elsewhere.Contexts, 2)
	after, err := os.ReadFile(talosconfig)
	require.NoError(t, err)
	assert.Equal(t, before, after)

	// --merge with --out is a usage error, and nothing is asked for.
	requests := ce.requestUIDs(t)
	code, _, stderr = ce.ichor(t, "cluster", "talosconfig", "demo", "--kubeconfig", ce.kubeconfig["otto"], "--merge", "--out", filepath.Join(ce.dir, "both"))
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "--merge writes into your talosconfig")
	ce.assertNoNewRequest(t, requests)
}

func (ce *clusterEnv) testAdminKubeconfig(t *testing.T) {
	// Nobody holds an admin binding yet.
	code, stdout, stderr := ce.ichor(t, "cluster", "admins", "list", "--kubeconfig", ce.kubeconfig["rita"])
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, "No admin bindings")

	code, stdout, stderr = ce.ichor(t, "cluster", "kubeconfig", "demo", "--kubeconfig", ce.kubeconfig["ada"])
	require.Equal(t, cli.ExitOK, code, stderr)
	out := ce.kubeconfig["ada"] + ".ichor-admin"
	assert.Contains(t, stdout, "Wrote an admin kubeconfig for")
	assert.Equal(t, os.FileMode(0o600), mode(t, out))
	assert.Contains(t, eventMessages(ce.events(t, "KubeconfigAdmin")),
		"a cluster-admin kubeconfig (CN=ichor-admin:u:ichor:ada, O=their own group, bound to cluster-admin) was requested by ichor:ada (lifetime 8760h0m0s)")

	cfg, err := clientcmd.BuildConfigFromFlags("", out)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "ichor-admin:u:ichor:ada", review.Status.UserInfo.Username)
	assert.True(t, slices.ContainsFunc(review.Status.UserInfo.Groups, func(g string) bool { return strings.HasPrefix(g, "ichor-admin:u:ichor:ada:") }),
		"no group of Ada's own: %v", review.Status.UserInfo.Groups)
	require.Eventually(t, func() bool {
		_, err := cs.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)

	// It never overwrites the caller's kubeconfig.
	code, _, stderr = ce.ichor(t, "cluster", "kubeconfig", "demo", "--kubeconfig", ce.kubeconfig["ada"], "--out", ce.kubeconfig["ada"], "--force")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "it is the file you use now")

	// Rita lists who holds a binding, then revokes Ada with her own rights.
	code, stdout, stderr = ce.ichor(t, "cluster", "admins", "list", "--kubeconfig", ce.kubeconfig["rita"])
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Regexp(t, `(?m)^ichor:ada\s+ichor-admin:u:ichor:ada\s+ichor-admin:u:ichor:ada:[a-z0-9]{10}\s+\S+Z\s+\S+Z\s+cluster-admin$`, stdout)

	code, stdout, stderr = ce.ichor(t, "cluster", "admins", "revoke", "ichor:ada", "--kubeconfig", ce.kubeconfig["rita"])
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, "Revoked ichor:ada: deleted ClusterRoleBinding ichor-admin:u:ichor:ada:")
	require.Eventually(t, func() bool {
		_, err := cs.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
		return apierrors.IsForbidden(err)
	}, 30*time.Second, 100*time.Millisecond, "the admin kubeconfig still works after it was revoked")
	_, err = cs.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
	t.Logf("after the binding was revoked: %v", err)

	// Rita's Event names who revoked whom; the manager's names whom, and
	// where the revoker is recorded.
	for _, want := range []string{
		`Revoked the admin binding of "ichor:ada" (ichor-admin:u:ichor:ada) by "ichor:rita", with ichor cluster admins revoke`,
		`Revoked the admin binding of "ichor:ada" (ichor-admin:u:ichor:ada) by "` + credentials.RevokedByUnknown + `"`,
	} {
		require.Eventually(t, func() bool {
			var list corev1.EventList
			require.NoError(t, ce.env.Client.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)))
			for _, e := range list.Items {
				if e.Reason == credentials.ReasonAdminRevoked && strings.Contains(e.Message, want) {
					return true
				}
			}
			return false
		}, 30*time.Second, 100*time.Millisecond, "no AdminRevoked Event says %s", want)
	}

	// Nothing left to revoke.
	code, _, stderr = ce.ichor(t, "cluster", "admins", "revoke", "ichor:ada", "--kubeconfig", ce.kubeconfig["rita"])
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, `no admin binding of user "ichor:ada"`)
}

func (ce *clusterEnv) testBreakGlassKubeconfig(t *testing.T) {
	// Its cap is an hour, checked before anything is sent.
	code, _, stderr := ce.ichor(t, "cluster", "kubeconfig", "demo", "--break-glass", "--ttl", "2h", "--kubeconfig", ce.kubeconfig["bea"])
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, `LifetimeTooLong: the lifetime 2h0m0s is above the cap of 1h0m0s for purpose "kubeconfig-super-admin"`)

	code, _, stderr = ce.ichor(t, "cluster", "kubeconfig", "demo", "--break-glass", "--kubeconfig", ce.kubeconfig["bea"])
	require.Equal(t, cli.ExitOK, code, stderr)
	out := ce.kubeconfig["bea"] + ".ichor-break-glass"
	assert.Equal(t, os.FileMode(0o600), mode(t, out))
	cfg, err := clientcmd.BuildConfigFromFlags("", out)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "ichor-super-admin:u:ichor:bea", review.Status.UserInfo.Username)
	assert.Contains(t, review.Status.UserInfo.Groups, "system:masters")
	// No binding was made for it: system:masters needs none.
	var bindings rbacv1.ClusterRoleBindingList
	require.NoError(t, ce.env.Client.List(t.Context(), &bindings, client.HasLabels{credentials.LabelAdminBinding}))
	assert.Empty(t, bindings.Items, "the break-glass kubeconfig made an admin binding")

	events := ce.events(t, "KubeconfigSuperAdmin")
	require.Len(t, events, 1)
	assert.Equal(t, corev1.EventTypeWarning, events[0].Type)
	assert.Equal(t, "a break-glass kubeconfig (CN=ichor-super-admin:u:ichor:bea, O=system:masters) was requested by ichor:bea (lifetime 15m0s)", events[0].Message)
}

func (ce *clusterEnv) testAnsweredRequestsAreDeleted(t *testing.T) {
	// The manager here keeps answers testRetention instead of two minutes.
	require.Eventually(t, func() bool { return len(ce.requestUIDs(t)) == 0 }, testRetention+30*time.Second, 200*time.Millisecond,
		"answered requests were not deleted")
}

func eventMessages(events []corev1.Event) []string {
	out := make([]string, 0, len(events))
	for _, e := range events {
		out = append(out, e.Message)
	}
	return out
}
