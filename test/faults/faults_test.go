// Package faults_test runs the real `ichor manager` process against a real
// control plane and Talos API test servers, and breaks things around it: nodes
// that hang or go away, a request of a megabyte, a SIGTERM or a SIGKILL in a
// burst, two managers at once, an API server that answers 409 or 504, bundles
// refused for different causes. Each test asserts the figure the fault must
// not move.
package faults_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

var (
	env        *harness.Env
	ichor      string
	kubeconfig string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ichor-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := harness.Main(m, harness.Options{}, func(_ context.Context, e *harness.Env) (func(), error) {
		env = e
		if ichor, err = harness.BuildIchor(dir); err != nil {
			return nil, err
		}
		kubeconfig = filepath.Join(dir, "admin.kubeconfig")
		return nil, os.WriteFile(kubeconfig, env.AdminKubeconfig, 0o600)
	})
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is one test's namespace and cluster demo, with kubelet serving
// certificates enabled.
type fixture struct {
	t   *testing.T
	ctx context.Context
	ns  string
	dir string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ns := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	if len(ns) > 40 {
		ns = ns[:40]
	}
	ns = strings.Trim(strings.NewReplacer("/", "-", "_", "-").Replace(ns), "-")
	f := &fixture{t: t, ctx: t.Context(), ns: ns, dir: t.TempDir()}
	require.NoError(t, env.Client.Create(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(f.ctx, env.SecretsBundleSecret(ns, "talos-secrets")))
	require.NoError(t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{Enabled: true}},
		},
	}))
	return f
}

// node starts a Talos API test server reporting name and ip, and registers
// its TalosMachine.
func (f *fixture) node(name, ip string) *harness.TalosNode {
	f.t.Helper()
	n, err := env.StartTalosNode(f.ctx, harness.NodeOptions{Name: name, Addresses: []netip.Addr{netip.MustParseAddr(ip)}})
	require.NoError(f.t, err)
	f.t.Cleanup(n.Stop)
	m := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Hostname: name, Endpoint: n.Endpoint(), Role: ichorv1alpha1.MachineRoleWorker},
	}
	require.NoError(f.t, env.Client.Create(f.ctx, m))
	m.Status.NodeName = name
	require.NoError(f.t, env.Client.Status().Update(f.ctx, m))
	return n
}

// manager starts `ichor manager` judging the fixture's cluster, stopped with
// the test; its log is shown when the test fails.
func (f *fixture) manager(name string, args []string, extraEnv ...string) *harness.ManagerProcess {
	f.t.Helper()
	m, err := harness.StartManager(harness.ManagerOptions{
		Binary: ichor, Dir: f.dir, Name: name, Kubeconfig: kubeconfig,
		Args: append([]string{"--webhook=false", "--metrics-bind-address=0", "--health-probe-bind-address=0",
			"--local-clusters=" + f.ns + "/demo"}, args...),
		Env: extraEnv,
	})
	require.NoError(f.t, err)
	f.t.Cleanup(func() {
		_ = m.Stop(15 * time.Second)
		if f.t.Failed() {
			f.t.Logf("%s log:\n%s", name, m.TailLog(40))
		}
	})
	return m
}

// submit creates a kubelet-serving CSR as the node, for its IP, and returns
// its name.
func (f *fixture) submit(node, ip string, r *csrgen.Request) string {
	f.t.Helper()
	req := csrgen.Request{Subject: csrgen.NodeSubject(node), IPs: []net.IP{net.ParseIP(ip)}}
	if r != nil {
		req = *r
	}
	pemBytes, err := csrgen.PEM(req)
	require.NoError(f.t, err)
	cfg, err := env.UserConfig("system:node:"+node, harness.NodesGroup)
	require.NoError(f.t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(f.t, err)
	obj := csrgen.ServingObject("", node, pemBytes)
	obj.GenerateName = f.ns + "-" + node + "-"
	obj.Name, obj.Spec.Username, obj.Spec.Groups = "", "", nil
	created, err := cs.CertificatesV1().CertificateSigningRequests().Create(f.ctx, obj, metav1.CreateOptions{})
	require.NoError(f.t, err)
	f.t.Cleanup(func() {
		_ = env.Clientset.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created.Name
}

// decisions are the requests' conditions of type Approved or Denied, by name.
func decisions(ctx context.Context, t *testing.T, names []string) map[string][]certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	list, err := env.Clientset.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string][]certificatesv1.CertificateSigningRequestCondition{}
	for _, csr := range list.Items {
		if !want[csr.Name] {
			continue
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
				out[csr.Name] = append(out[csr.Name], c)
			}
		}
	}
	return out
}

// waitDecided waits until every request is decided, and returns when each
// was first seen decided, after start.
func waitDecided(ctx context.Context, t *testing.T, names []string, deadline time.Duration) map[string]time.Duration {
	t.Helper()
	start := time.Now()
	seen := map[string]time.Duration{}
	for time.Since(start) < deadline {
		for name := range decisions(ctx, t, names) {
			if _, ok := seen[name]; !ok {
				seen[name] = time.Since(start)
			}
		}
		if len(seen) == len(names) {
			return seen
		}
		time.Sleep(50 * time.Millisecond)
	}
	var missing []string
	for _, n := range names {
		if _, ok := seen[n]; !ok {
			missing = append(missing, n)
		}
	}
	t.Fatalf("%d of %d requests not decided within %s: %v", len(missing), len(names), deadline, missing)
	return nil
}

// entries reads a manager's decision log.
func entries(t *testing.T, m *harness.ManagerProcess) []decisionlog.Entry {
	t.Helper()
	f, err := os.Open(m.DecisionLog)
	require.NoError(t, err)
	defer f.Close()
	out, _, err := decisionlog.Read(f)
	require.NoError(t, err)
	return out
}

// entriesFor are the decisions of a request in the logs.
func entriesFor(t *testing.T, name string, managers ...*harness.ManagerProcess) []decisionlog.Entry {
	t.Helper()
	var out []decisionlog.Entry
	for _, m := range managers {
		for _, e := range entries(t, m) {
			if e.Object() == "csr/"+name {
				out = append(out, e)
			}
		}
	}
	return out
}
