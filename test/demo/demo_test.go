package demo_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/test/demo"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// TestDemoTellsTheStory runs `make demo`'s scenario non-interactively: the
// honest kubelets get certificates, the compromised one is denied, the
// stranger stays pending, and the node whose Talos API was down is approved
// once it answers.
func TestDemoTellsTheStory(t *testing.T) {
	bin, err := harness.BuildIchor(t.TempDir())
	require.NoError(t, err)

	var story bytes.Buffer
	res, err := demo.Run(t.Context(), demo.Options{
		Out: &story, Ichor: bin, WorkDir: t.TempDir(), Timeout: 4 * time.Minute,
	})
	t.Log(story.String())
	require.NoError(t, err)

	assert.Equal(t, []string{"cp-1", "worker-1", "worker-3"}, res.Certified)
	assert.Contains(t, res.Verdicts["worker-2"], "deny")
	assert.NotContains(t, res.Verdicts["worker-2"], "approve")
	require.NotEmpty(t, res.Verdicts["stranger-1"])
	for _, v := range res.Verdicts["stranger-1"] {
		assert.Equal(t, "pending", v, "a request for an unmanaged node is never decided")
	}
	assert.Equal(t, "pending", res.Verdicts["worker-3"][0])
	assert.Contains(t, story.String(), "IPNotNode: IP address 10.5.0.3 is not one of the node's addresses")

	// Run non-interactively, the control plane is gone when the story ends:
	// no kubeconfig to explore it with is offered; the files that stay are.
	assert.NotContains(t, story.String(), "Explore")
	assert.NotContains(t, story.String(), "export KUBECONFIG")
	assert.Contains(t, story.String(), "decisions show ID "+res.DecisionLog)

	// The operator got a read-only talosconfig; the viewer was refused.
	assert.FileExists(t, res.Talosconfig)
	assert.Contains(t, story.String(), "an os:reader talosconfig was requested by alice (lifetime 1h0m0s)")
	assert.Contains(t, story.String(), "download")

	// The manager's metrics, with their labels.
	for _, want := range []string{
		`ichor_policy_decisions_total{action="deny",kind="decision",policy="ichor/kubelet_serving/decision",reason="IPNotNode"} 1`,
		`ichor_policy_decisions_total{action="approve",kind="decision",policy="ichor/kubelet_serving/decision",reason="IchorKubeletServing"}`,
		`ichor_policy_decisions_total{action="pending",kind="decision",policy="ichor/kubelet_serving/decision",reason="MachineUnknown"}`,
		`ichor_policy_decisions_total{action="approve",kind="record",policy="system/applied/record",reason=""}`,
		`ichor_policy_decision_duration_seconds_bucket{policy="ichor/kubelet_serving/decision"`,
		`ichor_policy_bundle_info{revision="sha256:`,
		`ichor_policy_bundle_load_failures_total 0`,
		`ichor_talos_identity_read_duration_seconds_count{result="ok"}`,
		`ichor_talos_identity_read_errors_total`,
		`ichor_kubelet_serving_pending_csrs{cluster="demo",namespace="demo"}`,
	} {
		assert.Contains(t, res.Metrics, want)
	}
}
