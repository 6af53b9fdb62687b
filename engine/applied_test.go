package engine_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/version"
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
