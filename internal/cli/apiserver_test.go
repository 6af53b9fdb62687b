package cli_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/termsafe/termsafetest"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// apiEnv is a real API server with requests in it, for the commands that
// read or write CSRs in the cluster.
type apiEnv struct {
	env *harness.Env
	dir string
	// admin is the harness's admin kubeconfig; nobody's is a user with no
	// rights at all.
	admin, nobody string
	good, forged  string
	// node submits requests as worker-1's kubelet.
	node kubernetes.Interface
}

func startAPIEnv(t *testing.T) *apiEnv {
	t.Helper()
	env := harness.StartForTest(t, harness.Options{})
	ae := &apiEnv{env: env, dir: t.TempDir()}
	ae.admin = filepath.Join(ae.dir, "admin.kubeconfig")
	require.NoError(t, os.WriteFile(ae.admin, env.AdminKubeconfig, 0o600))
	nobody, err := env.UserConfig("nobody")
	require.NoError(t, err)
	ae.nobody = writeKubeconfig(t, ae.dir, "nobody", nobody)

	// worker-1's kubelet asks, so the API server records it as the requester.
	nodeCfg, err := env.UserConfig("system:node:worker-1", harness.NodesGroup)
	require.NoError(t, err)
	node, err := kubernetes.NewForConfig(nodeCfg)
	require.NoError(t, err)
	ae.node = node
	ae.good = env.SubmitCSR(t, node, csrgen.ServingObject("csr-good", "worker-1",
		request(t, csrgen.Request{DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}})))
	ae.forged = env.SubmitCSR(t, node, csrgen.ServingObject("csr-forged", "worker-1",
		request(t, csrgen.Request{IPs: []net.IP{net.ParseIP("10.5.0.3")}})))
	return ae
}

// TestCommandsOnTheAPIServer runs the commands that speak to the cluster
// against a real API server, one control plane for all.
func TestCommandsOnTheAPIServer(t *testing.T) {
	ae := startAPIEnv(t)
	t.Run("check-csr NAME", ae.testCheckCSRByName)
	t.Run("approve and deny", ae.testManualDecision)
	t.Run("approve a request decided in other words", ae.testManualDecisionOfARequestDecidedInOtherWords)
	t.Run("completion", ae.testCompletion)
}

// testCompletion: the names of CSRs and TalosClusters are completed from
// the cluster with the command line's kubeconfig flags; approve and deny
// offer only what they accept.
func (ae *apiEnv) testCompletion(t *testing.T) {
	ctx := t.Context()
	require.NoError(t, ae.env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-c"}}))
	for _, name := range []string{"prod", "staging"} {
		require.NoError(t, ae.env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-c", Name: name},
			Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "s"}},
		}))
	}
	pending := ae.env.SubmitCSR(t, ae.node, csrgen.ServingObject("csr-complete-me", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})))
	// Kubernetes does not check a request's name: a tab would be a
	// description to the shell, an escape would reach the terminal.
	hostile := ae.env.SubmitCSR(t, ae.node, csrgen.ServingObject("csr-complete-tab\tapproved\x1b[2J", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})))
	code, _, stderr := run(t, "", "approve", ae.good, "--message", "for the test", "--kubeconfig", ae.admin)
	require.Equal(t, cli.ExitOK, code, stderr)

	for _, tc := range []struct {
		name      string
		args      []string
		want, not []string
	}{
		{"check-csr", []string{"policy", "check-csr", "--kubeconfig", ae.admin, "csr-"}, []string{ae.good, ae.forged, pending}, nil},
		{"check-csr after a name", []string{"policy", "check-csr", "--kubeconfig", ae.admin, ae.good, "csr-"}, []string{ae.forged}, []string{ae.good}},
		{"approve: only the pending", []string{"approve", "--kubeconfig", ae.admin, "csr-"}, []string{ae.forged, pending}, []string{ae.good}},
		{"deny: a prefix", []string{"deny", "--kubeconfig", ae.admin, "csr-complete"}, []string{pending}, []string{ae.forged}},
		{"cluster talosconfig", []string{"cluster", "talosconfig", "--kubeconfig", ae.admin, "-n", "team-c", ""}, []string{"prod", "staging"}, nil},
		{"cluster kubeconfig", []string{"cluster", "kubeconfig", "--kubeconfig", ae.admin, "-n", "team-c", "st"}, []string{"staging"}, []string{"prod"}},
		{"render kubelet-serving", []string{"render", "kubelet-serving", "--kubeconfig", ae.admin, "-n", "team-c", ""}, []string{"prod", "staging"}, nil},
		{"audit --cluster", []string{"audit", "kubelet-serving", "--kubeconfig", ae.admin, "-n", "team-c", "--cluster", "p"}, []string{"prod"}, nil},
		{"without rights: nothing", []string{"policy", "check-csr", "--kubeconfig", ae.nobody, ""}, nil, []string{ae.good}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := complete(t, tc.args...)
			for _, w := range tc.want {
				assert.Contains(t, got, w)
			}
			for _, n := range tc.not {
				assert.NotContains(t, got, n)
			}
			for _, g := range got {
				assert.False(t, strings.HasPrefix(g, "csr-complete-tab"), "a name the shell or the terminal would misread was offered: %q (%q)", g, hostile)
			}
		})
	}
}

// testManualDecision: ichor approve|deny write a person's decision on a
// request Ichor left pending, through the approval subresource with the
// person's own rights, and refuse anything else without writing.
func (ae *apiEnv) testManualDecision(t *testing.T) {
	submit := func(name, signer string) string {
		obj := csrgen.ServingObject(name, "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}}))
		if signer != "" {
			obj.Spec.SignerName = signer
		}
		return ae.env.SubmitCSR(t, ae.node, obj)
	}
	toApprove, toDeny, other := submit("csr-manual-1", ""), submit("csr-manual-2", ""), submit("csr-other", "example.com/other")
	noRights := submit("csr-manual-3", "")
	for _, tc := range []struct {
		name string
		args []string
		code int
		// csr is the request to look at after, and condition what it
		// should then carry ("" for none).
		csr, condition, reason string
		stderr                 string
	}{
		{name: "approve", args: []string{"approve", toApprove, "--message", "checked with talosctl"}, csr: toApprove, condition: "Approved", reason: cli.ManualApprovalReason},
		{name: "approve again", args: []string{"approve", toApprove, "--message", "again"}, code: cli.ExitError, csr: toApprove, condition: "Approved", reason: cli.ManualApprovalReason, stderr: "not a request Ichor left pending: it is Approved already"},
		{name: "deny what is approved", args: []string{"deny", toApprove, "--message", "no"}, code: cli.ExitError, csr: toApprove, condition: "Approved", reason: cli.ManualApprovalReason, stderr: "it is Approved already"},
		{name: "deny with a reason", args: []string{"deny", toDeny, "--reason", "NodeRetired", "--message", "worker-1 is gone"}, csr: toDeny, condition: "Denied", reason: "NodeRetired"},
		{name: "another signer", args: []string{"approve", other, "--message", "x"}, code: cli.ExitError, csr: other, stderr: `its signer "example.com/other" is not one Ichor decides`},
		{name: "without rights", args: []string{"approve", noRights, "--message", "x", "--as", "nobody"}, code: cli.ExitError, csr: noRights, stderr: "forbidden"},
		{name: "no message", args: []string{"approve", noRights}, code: cli.ExitUsage, csr: noRights, stderr: "--message is required"},
		{name: "a reason that is a sentence", args: []string{"approve", noRights, "--message", "x", "--reason", "looks fine"}, code: cli.ExitUsage, csr: noRights, stderr: "give a CamelCase code"},
		{name: "not there", args: []string{"approve", "csr-none", "--message", "x"}, code: cli.ExitError, stderr: "not found"},
		{name: "the approver's own reason", args: []string{"approve", noRights, "--message", "x", "--reason", "IchorKubeletServing"}, code: cli.ExitUsage, csr: noRights, stderr: "reasons that begin with Ichor are the approvers' own"},
		{name: "the other verb's reason", args: []string{"deny", noRights, "--message", "x", "--reason", cli.ManualApprovalReason}, code: cli.ExitUsage, csr: noRights, stderr: "or the other verb's"},
		// Review 29 L1: the message is read by whoever describes the request.
		{name: "a message with control characters", args: []string{"approve", noRights, "--message", "ok\x1b]0;owned\a\x1b[2J"}, code: cli.ExitUsage, csr: noRights, stderr: "write one line of plain text"},
		{name: "a message of two lines", args: []string{"approve", noRights, "--message", "ok\r\nApproved by: root"}, code: cli.ExitUsage, csr: noRights, stderr: "write one line of plain text"},
		{name: "a message with a bidi override", args: []string{"deny", noRights, "--message", "ok \u202e toor"}, code: cli.ExitUsage, csr: noRights, stderr: "write one line of plain text"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", append(tc.args, "--kubeconfig", ae.admin)...)
			require.Equal(t, tc.code, code, stdout+stderr)
			assert.Contains(t, stderr, tc.stderr)
			if tc.code == cli.ExitOK {
				assert.Contains(t, stdout, "certificatesigningrequest/"+tc.csr+" ")
			}
			if tc.csr == "" {
				return
			}
			verdict := harness.Verdict(ae.env.GetCSR(t, tc.csr))
			if tc.condition == "" {
				assert.Nil(t, verdict, "nothing is written")
				return
			}
			require.NotNil(t, verdict)
			assert.Equal(t, tc.condition, string(verdict.Type))
			assert.Equal(t, tc.reason, verdict.Reason)
			assert.Contains(t, verdict.Message, "by hand with ichor: ")
		})
	}
}

// testManualDecisionOfARequestDecidedInOtherWords: the reason of the
// verdict a request already carries is whoever wrote it's (the API server
// does not hold a CSR condition's reason to a form): the refusal keeps it to
// its line, so that it cannot print a line of its own (review 22 of the CLI's
// output: a forged "approved" line under the refusal).
func (ae *apiEnv) testManualDecisionOfARequestDecidedInOtherWords(t *testing.T) {
	ctx := t.Context()
	name := ae.env.SubmitCSR(t, ae.node, csrgen.ServingObject("csr-manual-forged", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})))
	csr := ae.env.GetCSR(t, name)
	reason := "Retired\n\nichor: certificatesigningrequest/csr-other approved by admin\u001b[2J"
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: reason, Message: "m",
	})
	_, err := ae.env.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, csr, metav1.UpdateOptions{})
	require.NoError(t, err, "the API server took the reason as it is")

	code, stdout, stderr := run(t, "", "approve", name, "--message", "x", "--kubeconfig", ae.admin)
	require.Equal(t, cli.ExitError, code, stdout+stderr)
	termsafetest.AssertInert(t, stderr)
	assert.NotContains(t, stderr, "\nichor: certificatesigningrequest/", "the reason printed a line of its own: %q", stderr)
	assert.Contains(t, stderr, "it is Denied already (Retired\\n\\nichor: certificatesigningrequest/csr-other approved by admin^[[2J)")
}

// testCheckCSRByName: check-csr NAME reads the request from the cluster, as
// kubectl get csr NAME does, and decides it as -f decides what kubectl prints.
func (ae *apiEnv) testCheckCSRByName(t *testing.T) {
	forged := ae.env.GetCSR(t, ae.forged)
	forged.TypeMeta = metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "CertificateSigningRequest"}
	asFile := manifest(t, forged, false)
	for _, tc := range []struct {
		name string
		args []string
		code int
		// want are the names and actions decided, one JSON line each;
		// wantOne the single request's action.
		want    []string
		wantOne string
		stderr  string
	}{
		{name: "one request", args: []string{ae.good, "--kubeconfig", ae.admin}, wantOne: engine.ActionApprove},
		{name: "the same as -f", args: []string{"-f", asFile, "--kubeconfig", ae.admin}, wantOne: engine.ActionDeny},
		{name: "several", args: []string{ae.good, ae.forged, "--kubeconfig", ae.admin}, want: []string{"csr-good approve", "csr-forged deny"}},
		{name: "kubectl's flags: --as", args: []string{ae.good, "--kubeconfig", ae.admin, "--as", "nobody"}, code: cli.ExitError, stderr: `User "nobody" cannot get resource "certificatesigningrequests"`},
		{name: "a person without get", args: []string{ae.good, "--kubeconfig", ae.nobody}, code: cli.ExitError, stderr: "forbidden"},
		{name: "a request that is not there", args: []string{"csr-none", "--kubeconfig", ae.admin}, code: cli.ExitError, stderr: `certificatesigningrequests.certificates.k8s.io "csr-none" not found`},
		{name: "NAME and -f", args: []string{ae.good, "-f", asFile, "--kubeconfig", ae.admin}, code: cli.ExitUsage, stderr: "not both"},
		{name: "neither", args: []string{"--kubeconfig", ae.admin}, code: cli.ExitUsage, stderr: "give the requests' NAMEs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", append(append([]string{"policy", "check-csr", "-o", "json"}, tc.args...), identity...)...)
			require.Equal(t, tc.code, code, stderr)
			assert.Contains(t, stderr, tc.stderr)
			switch {
			case tc.wantOne != "":
				var d engine.CSRDecision
				require.NoError(t, json.Unmarshal([]byte(stdout), &d), stdout)
				assert.Equal(t, tc.wantOne, d.Action, stdout)
			case tc.code != cli.ExitOK:
				assert.Empty(t, stdout)
			default:
				var got []string
				for _, l := range checkLines(t, stdout) {
					got = append(got, l.CSR+" "+l.Action)
				}
				assert.Equal(t, tc.want, got)
			}
		})
	}

	t.Run("check-client-csr NAME", func(t *testing.T) {
		code, stdout, stderr := run(t, "", "policy", "check-client-csr", "-o", "json", ae.good, "--kubeconfig", ae.admin)
		assert.Equal(t, cli.ExitError, code, stderr)
		assert.Contains(t, stderr, "the kubelet-client rule governs signer "+certificatesv1.KubeAPIServerClientKubeletSignerName+" only")
		assert.Empty(t, stdout)
	})
}
