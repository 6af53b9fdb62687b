package cli_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// auditEnv is a control plane with three clusters in namespace audit:
// "fine" (a machine whose certificate is current), "moved" (a machine whose
// node's IP moved after issuance) and "quiet" (a kubelet that accepts
// connections and never answers).
type auditEnv struct {
	env        *harness.Env
	kubeconfig string
	// hosts maps the nodes' addresses (10.43.x.y, not routable here) and
	// kubelet port to the harness kubelets' local listeners, as /etc/hosts
	// would; the command's context carries its Dial.
	hosts *harness.Hosts
}

const auditNS = "audit"

func TestAuditKubeletServing(t *testing.T) {
	ae := startAuditEnv(t)
	t.Run("EveryCertificateCurrentExitsZero", ae.testCurrent)
	t.Run("IPMovedAfterIssuanceExitsDrifted", ae.testMoved)
	t.Run("SilentKubeletIsUnjudgedWithinTheTimeout", ae.testQuiet)
}

func TestAuditKubeletServingUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	code := cli.Run(t.Context(), []string{"audit", "kubelet-serving", "-o", "xml"}, nil, &out, &errOut)
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, errOut.String(), `unable to match a printer suitable for the output format "xml", allowed formats are: json,jsonpath,jsonpath-as-json,jsonpath-file,kyaml,name,table,wide,yaml`)
}

func startAuditEnv(t *testing.T) *auditEnv {
	t.Helper()
	ctx := t.Context()
	env := harness.StartForTest(t, harness.Options{})
	ae := &auditEnv{env: env, kubeconfig: filepath.Join(t.TempDir(), "kubeconfig"), hosts: &harness.Hosts{}}
	require.NoError(t, os.WriteFile(ae.kubeconfig, env.AdminKubeconfig, 0o600))
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: auditNS}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(auditNS, "talos-secrets")))
	for _, name := range []string{"fine", "moved", "quiet"} {
		require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: auditNS, Name: name},
			Spec: ichorv1alpha1.TalosClusterSpec{
				TalosVersion: "v1.14",
				SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
				Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
					Enabled: true,
				}},
			},
		}))
	}
	return ae
}

// machine starts a node of cluster with its kubelet at addr, approves the
// kubelet's certificate and maps addr's kubelet port to the kubelet.
func (ae *auditEnv) machine(t *testing.T, cluster, name, addr string) (*harness.TalosNode, *harness.Kubelet) {
	t.Helper()
	ctx := t.Context()
	node, err := ae.env.StartTalosNode(ctx, harness.NodeOptions{Name: name, Addresses: []netip.Addr{netip.MustParseAddr(addr)}})
	require.NoError(t, err)
	t.Cleanup(node.Stop)
	require.NoError(t, ae.env.Client.Create(ctx, &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: auditNS, Name: name},
		Spec: ichorv1alpha1.TalosMachineSpec{
			ClusterName: cluster, Hostname: name, Endpoint: node.Endpoint(), Role: ichorv1alpha1.MachineRoleWorker,
		},
	}))
	kubelet, err := ae.env.StartKubelet(ctx, harness.KubeletOptions{NodeName: name, DNSNames: []string{name}, IPs: []net.IP{net.ParseIP(addr)}})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)
	_, err = kubelet.ApproveServing(ctx)
	require.NoError(t, err)
	ae.hosts.Map(net.JoinHostPort(addr, "10250"), kubelet.ServingAddress())
	return node, kubelet
}

func (ae *auditEnv) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx := servingcert.WithDial(t.Context(), ae.hosts.Dial)
	// The test's Talos APIs answer on loopback, which the audit denies by
	// default; a test's own flag can deny again.
	args = append([]string{"audit", "kubelet-serving", "--kubeconfig", ae.kubeconfig, "-n", auditNS, "--node-denied-networks="}, args...)
	code = cli.Run(ctx, args, nil, &out, &errOut)
	return code, out.String(), errOut.String()
}

type auditRow struct {
	Machine    string `json:"machine"`
	Node       string `json:"node"`
	Address    string `json:"address"`
	Status     string `json:"status"`
	Expires    string `json:"expires"`
	DecisionID string `json:"decision_id"`
	Reasons    []struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"reasons"`
}

func (ae *auditEnv) testCurrent(t *testing.T) {
	ae.machine(t, "fine", "fine-1", "10.43.0.2")
	code, out, errOut := ae.run(t, "--cluster", "fine")
	require.Equal(t, cli.ExitOK, code, errOut)
	assert.Regexp(t, `MACHINE\s+NODE\s+STATUS\s+EXPIRES\s+REASON`, out)
	assert.Regexp(t, `fine/fine-1\s+fine-1\s+current\s+20\d\d-\d\d-\d\dT\S+Z\s+CertificateCurrent`, out)
}

func (ae *auditEnv) testMoved(t *testing.T) {
	node, kubelet := ae.machine(t, "moved", "moved-1", "10.43.0.3")
	// Talos now gives the kubelet another address; the kubelet still serves
	// the certificate issued for the old one, reached at the new.
	require.NoError(t, node.SetIdentity(t.Context(), talosapi.Identity{
		Nodename: "moved-1", Hostname: "moved-1", Addresses: []netip.Addr{netip.MustParseAddr("10.43.0.33")},
	}))
	ae.hosts.Map("10.43.0.33:10250", kubelet.ServingAddress())
	log := filepath.Join(t.TempDir(), "decisions.log")

	code, out, errOut := ae.run(t, "--cluster", "moved", "-o", "json", "--decision-log", log)

	require.Equal(t, cli.ExitDrifted, code, errOut)
	assert.Contains(t, errOut, "1 of 1 kubelet serving certificates drifted")
	rows := auditRows(t, out)
	require.Len(t, rows, 1)
	assert.Equal(t, "moved-1", rows[0].Machine)
	assert.Equal(t, "10.43.0.33:10250", rows[0].Address)
	assert.Equal(t, "drifted", rows[0].Status)
	require.Len(t, rows[0].Reasons, 1)
	assert.Equal(t, "CertificateNamesNotNode", rows[0].Reasons[0].Code)
	assert.Contains(t, rows[0].Reasons[0].Message, `IP address 10.43.0.3 is not one of the node's addresses ["10.43.0.33"]`)
	logged, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Contains(t, string(logged), rows[0].DecisionID, "the audit's decision is in its decision log")

	// The table says the same, with the reasons below it.
	code, out, _ = ae.run(t, "--cluster", "moved")
	require.Equal(t, cli.ExitDrifted, code)
	assert.Regexp(t, `moved/moved-1\s+moved-1\s+drifted\s+\S+\s+CertificateNamesNotNode`, out)
	assert.Contains(t, out, "  CertificateNamesNotNode: the kubelet serving certificate of machine \"moved-1\"")
	assert.NotContains(t, out, "10.43.0.33:10250", "the address only in the wide table")

	code, out, _ = ae.run(t, "--cluster", "moved", "-o", "wide")
	require.Equal(t, cli.ExitDrifted, code)
	assert.Regexp(t, `MACHINE\s+NODE\s+STATUS\s+EXPIRES\s+REASON\s+ADDRESS\s+DECISION`, out)
	assert.Regexp(t, `moved/moved-1\s+moved-1\s+drifted\s+\S+\s+CertificateNamesNotNode\s+10\.43\.0\.33:10250\s+[0-9a-f-]{36}\n`, out, "each audit is a decision of its own")

	code, out, _ = ae.run(t, "--cluster", "moved", "-o", "name")
	require.Equal(t, cli.ExitDrifted, code, "the exit status says the same in every format")
	assert.Equal(t, "kubeletservingaudit.cli.ichor.dev/moved-1\n", out)
}

// auditRows are the items of the List that -o json prints.
func auditRows(t *testing.T, out string) []auditRow {
	t.Helper()
	var list struct {
		Kind  string
		Items []auditRow
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	assert.Equal(t, "List", list.Kind)
	return list.Items
}

func (ae *auditEnv) testQuiet(t *testing.T) {
	_, kubelet := ae.machine(t, "quiet", "quiet-1", "10.43.0.4")
	kubelet.SetSilent(true)
	start := time.Now()

	code, out, errOut := ae.run(t, "--cluster", "quiet", "--timeout", "1s", "-o", "json")

	assert.Less(t, time.Since(start), 20*time.Second, "a silent kubelet costs its timeout")
	require.Equal(t, cli.ExitUnjudged, code, errOut)
	rows := auditRows(t, out)
	require.Len(t, rows, 1)
	assert.Equal(t, "unknown", rows[0].Status)
	assert.Equal(t, "CertificateUnreadable", rows[0].Reasons[0].Code)
	assert.Contains(t, rows[0].Reasons[0].Message, "TLS handshake with 10.43.0.4:10250")
}
