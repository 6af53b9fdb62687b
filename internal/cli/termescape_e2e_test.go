package cli

import (
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/termsafe/termsafetest"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// The attack end to end: a requester who can create CSRs puts
// control sequences in a common name and in an organization; the real
// `ichor manager` process decides them against the real API server and
// writes its decision log and its own log; an operator reads them with
// `ichor decisions list`, `show` and `replay`, and reads the CSR's condition
// and Event. No control character reaches any of those outputs; the escaped
// form is what the operator sees; the JSON outputs decode to the very
// strings the requester wrote.
func TestHostileCommonNameThroughTheRealManager(t *testing.T) {
	// An organizational unit whose line break would start a row of its own
	// under kubectl describe's Events, one that reads as Ichor's approval.
	const (
		forgedRow        = "x\n  Normal  Approved  1s  ichor-policy  approved\tby policy"
		forgedRowEscaped = `x\n  Normal  Approved  1s  ichor-policy  approved\tby policy`
	)

	ctx := t.Context()
	const ns = "termescape"
	w := startWorker(t, ns)
	env, ichor, dir, kubeconfig := w.env, w.ichor, w.dir, w.kubeconfig

	m, err := harness.StartManager(harness.ManagerOptions{
		Binary: ichor, Dir: dir, Name: "manager", Kubeconfig: kubeconfig,
		Args: []string{"--webhook=false", "--metrics-bind-address=0", "--health-probe-bind-address=0", "--local-clusters=" + ns + "/demo"},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = m.Stop(15 * time.Second)
		if t.Failed() {
			t.Logf("manager log:\n%s", m.TailLog(40))
		}
	})

	// The requester is a node whose name is the hostile string, as the
	// API server authenticated it, asking for that name.
	unknown := submitAs(t, env, "system:node:"+termsafetest.Node, csrgen.Request{
		Subject: csrgen.NodeSubject(termsafetest.Node), DNSNames: []string{"evil\x1b[2J.example"}, IPs: []net.IP{net.ParseIP("10.5.0.9")},
	})
	// worker-1, known, asks with an organization that the denial quotes.
	denied := submitAs(t, env, "system:node:worker-1", csrgen.Request{
		Subject: pkix.Name{CommonName: "system:node:worker-1", Organization: []string{hostileOrg}, OrganizationalUnit: []string{forgedRow}},
		IPs:     []net.IP{net.ParseIP("10.5.0.2")},
	})

	// The denial's condition, and both decisions in the manager's log.
	var condition *certificatesv1.CertificateSigningRequestCondition
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		condition = harness.Verdict(env.GetCSR(t, denied))
		return condition != nil, nil
	}), "worker-1's request is never decided")
	require.Equal(t, certificatesv1.CertificateDenied, condition.Type)
	termsafetest.AssertInert(t, condition.Message)
	assert.Contains(t, condition.Message, `O=system:nodes^[]0;owned\u0007^[[2J`)
	assert.NotContains(t, condition.Message, "\n", "a line of its own would read as another field")
	assert.Contains(t, condition.Message, forgedRowEscaped)

	var ids map[string]string
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		ids = decided(t, m.DecisionLog, unknown, denied)
		return len(ids) == 2, nil
	}), "the decisions are never in the log")

	// The Event of the denial, on the request.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := env.Clientset.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Regarding.Name == denied {
				termsafetest.AssertInert(t, e.Note)
				assert.Contains(t, e.Note, `^[]0;owned\u0007`)
				assert.NotContains(t, e.Note, "\n", "a line of its own would read as another Event under kubectl describe")
				assert.Contains(t, e.Note, forgedRowEscaped)
				return true, nil
			}
		}
		return false, nil
	}), "the denial's Event is never written")

	// What the manager wrote, read as kubectl logs would show it.
	for _, path := range []string{m.DecisionLog, m.Log} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		termsafetest.AssertInert(t, string(b))
	}
	log, err := os.ReadFile(m.DecisionLog)
	require.NoError(t, err)
	assert.Contains(t, string(log), `\u202e`, "the bidi override is written as JSON's escape")

	candidate := policyWithMachineUnknownRenamed(t)
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"list", []string{"decisions", "list", m.DecisionLog}, []string{termsafetest.NodeEscaped}},
		{"show", []string{"decisions", "show", ids[unknown], m.DecisionLog}, []string{"Node:      " + termsafetest.NodeEscaped + "\n", `"evil\u001b[2J.example"`}},
		{"show the denial", []string{"decisions", "show", ids[denied], m.DecisionLog}, []string{`O=system:nodes^[]0;owned\u0007^[[2J`}},
		{"replay", []string{"decisions", "replay", "--bundle", candidate, m.DecisionLog}, []string{termsafetest.NodeEscaped}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", c.args...)
			require.Equal(t, ExitOK, code, stderr)
			termsafetest.AssertInert(t, stdout)
			termsafetest.AssertInert(t, stderr)
			for _, w := range c.want {
				assert.Contains(t, stdout, w)
			}
		})
	}

	// -o json is the logged strings, exactly.
	code, stdout, stderr := run(t, "", "decisions", "show", ids[unknown], m.DecisionLog, "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	termsafetest.AssertInert(t, stdout)
	var d struct {
		Entry struct {
			Result struct{ Node string } `json:"result"`
			Input  struct {
				CSR struct {
					Username string `json:"username"`
				} `json:"csr"`
			} `json:"input"`
		} `json:"entry"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	assert.Equal(t, termsafetest.Node, d.Entry.Result.Node)
	assert.Equal(t, "system:node:"+termsafetest.Node, d.Entry.Input.CSR.Username)
}

// submitAs creates a kubelet-serving CSR as user, in the nodes' group, and
// returns its name.
// worker is a control plane with the local cluster NS/demo (named by the
// test to the manager) and its one machine, worker-1 (10.5.0.2), whose
// Talos API answers on loopback; and the ichor binary and admin kubeconfig
// to run a manager with.
type worker struct {
	env                    *harness.Env
	ichor, dir, kubeconfig string
	node                   *harness.TalosNode
}

func startWorker(t *testing.T, ns string) worker {
	t.Helper()
	ctx := t.Context()
	w := worker{env: harness.StartForTest(t, harness.Options{}), dir: t.TempDir()}
	var err error
	w.ichor, err = harness.BuildIchor(w.dir)
	require.NoError(t, err)
	w.kubeconfig = filepath.Join(w.dir, "admin.kubeconfig")
	require.NoError(t, os.WriteFile(w.kubeconfig, w.env.AdminKubeconfig, 0o600))

	require.NoError(t, w.env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, w.env.Client.Create(ctx, w.env.SecretsBundleSecret(ns, "talos-secrets")))
	require.NoError(t, w.env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{Enabled: true}},
		},
	}))
	w.node, err = w.env.StartTalosNode(ctx, harness.NodeOptions{Name: "worker-1", Addresses: []netip.Addr{netip.MustParseAddr("10.5.0.2")}})
	require.NoError(t, err)
	t.Cleanup(w.node.Stop)
	machine := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-1"},
		Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Hostname: "worker-1", Endpoint: w.node.Endpoint(), Role: ichorv1alpha1.MachineRoleWorker},
	}
	require.NoError(t, w.env.Client.Create(ctx, machine))
	machine.Status.NodeName = "worker-1"
	require.NoError(t, w.env.Client.Status().Update(ctx, machine))
	return w
}

func submitAs(t *testing.T, env *harness.Env, user string, r csrgen.Request) string {
	t.Helper()
	pemBytes, err := csrgen.PEM(r)
	require.NoError(t, err)
	cfg, err := env.UserConfig(user, harness.NodesGroup)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	obj := csrgen.ServingObject("", "", pemBytes)
	obj.GenerateName = "termescape-"
	obj.Spec.Username, obj.Spec.Groups = "", nil
	created, err := cs.CertificatesV1().CertificateSigningRequests().Create(t.Context(), obj, metav1.CreateOptions{})
	require.NoError(t, err)
	return created.Name
}

// decided maps the names of the requests decided in the decision log at
// path to their decision ids.
func decided(t *testing.T, path string, names ...string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	entries, _, err := decisionlog.Read(f)
	if err != nil {
		return nil // nothing logged yet
	}
	ids := map[string]string{}
	for _, e := range decisionlog.InEffect(entries) {
		for _, n := range names {
			// The verdict, whichever entrypoint gave it (the flood guard's
			// rejection or the decision).
			if e.Object() == "csr/"+n && slices.Contains([]string{"approve", "deny", "pending"}, e.Action()) {
				ids[n] = e.DecisionID
			}
		}
	}
	return ids
}
