package engine_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/version"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// The record that a decision was carried out is a decision-log entry like
// any other: its own id, the labels, the time, the bundle's revision, the
// input Go gave and the rule's result; the reader takes it for a record.
func TestRecordAppliedLogsTheRecord(t *testing.T) {
	e, log := newEngine(t)
	def, err := bundles.Default()
	require.NoError(t, err)

	require.NoError(t, e.RecordApplied(context.Background(), "d-1", "csr/csr-worker-1", engine.ActionApprove))

	entries := harness.Decisions[map[string]any](log, nil)
	require.Len(t, entries, 1)
	entry := entries[0]
	assert.Equal(t, "Decision Log", entry["msg"])
	assert.Equal(t, engine.PathApplied, entry["path"])
	assert.NotEmpty(t, entry["decision_id"])
	assert.NotEqual(t, "d-1", entry["decision_id"])
	assert.NotEmpty(t, entry["timestamp"])
	assert.Equal(t, def.Manifest.Revision, entry["bundles"].(map[string]any)["ichor"].(map[string]any)["revision"])
	labels := entry["labels"].(map[string]any)
	assert.Equal(t, "ichor-policy", labels["app"])
	assert.Equal(t, "test", labels["id"])
	assert.Equal(t, version.Get().Version, labels["ichor_version"])
	assert.Equal(t, map[string]any{"decision_id": "d-1", "object": "csr/csr-worker-1", "action": "approve"}, entry["input"])
	assert.Equal(t, map[string]any{"applied": "d-1", "object": "csr/csr-worker-1", "action": "approve"}, entry["result"])

	read, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, read, 1)
	assert.Equal(t, decisionlog.PathApplied, read[0].Path)
	assert.Empty(t, decisionlog.InEffect(read), "a record is not a verdict")
}

// TestTheDecisionCounterTellsRecordsFromDecisions: a record that a verdict
// was applied is counted by ichor_policy_decisions_total with
// kind="record", apart from the verdict (kind="decision"): a rate of
// approvals over kind="decision" counts each approval once, not twice.
func TestTheDecisionCounterTellsRecordsFromDecisions(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics, err := engine.NewMetrics(reg)
	require.NoError(t, err)
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Metrics: metrics, ID: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
	require.NoError(t, err)
	require.Equal(t, engine.ActionApprove, d.Action)
	require.NoError(t, e.RecordApplied(context.Background(), d.DecisionID, "csr/csr-worker-1", d.Action))

	got, err := testutil.GatherAndCount(reg, "ichor_policy_decisions_total")
	require.NoError(t, err)
	assert.Equal(t, 2, got, "one series for the verdict, one for its record")
	kinds := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != "ichor_policy_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			kinds[labels["kind"]+" "+labels["policy"]+" "+labels["action"]] += m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, map[string]float64{
		"decision " + engine.PathKubeletServing + " approve": 1,
		"record " + engine.PathApplied + " approve":          1,
	}, kinds)
	assert.Equal(t, engine.KindRecord, engine.KindOf(engine.PathApplied))
	assert.Equal(t, engine.KindDecision, engine.KindOf(engine.PathKubeletServing))
}
