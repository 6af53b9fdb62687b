package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The engine's console line is the line OPA's console sink writes for the
// same entry, field for field (the logger's time aside, which is the time
// of writing): readers of the manager's standard output see no change.
func TestTheConsoleLineIsOPAs(t *testing.T) {
	var opaOut bytes.Buffer
	mgr, err := plugins.New([]byte(`{"labels": {"app": "ichor-policy", "ichor_version": "v0.3.0"}}`), "test", inmem.New(),
		plugins.ConsoleLogger(jsonLogger(&opaOut, logging.Info)), plugins.Logger(logging.NewNoOpLogger()))
	require.NoError(t, err)
	config, err := logs.NewConfigBuilder().WithBytes([]byte(`{"console": true}`)).Parse()
	require.NoError(t, err)
	plugin := logs.New(config, mgr)
	require.NoError(t, plugin.Start(context.Background()))
	t.Cleanup(func() { plugin.Stop(context.Background()) })

	m := metrics.New()
	m.Timer(metrics.RegoQueryEval).Start()
	m.Timer(metrics.RegoQueryEval).Stop()
	var input any = map[string]any{"csr": map[string]any{"name": "csr-1", "usages": []any{"server auth"}, "extra": map[string]any{"k": []any{"<v&>"}}}}
	var result any = map[string]any{"action": "deny", "reasons": []any{map[string]any{"code": "IPNotNode", "message": "10.5.0.3 \u001b[2J"}}}
	var nd any
	info := &server.Info{
		DecisionID: "d-1", Path: "ichor/kubelet_serving/decision", Timestamp: time.Date(2026, 12, 1, 20, 38, 57, 349198441, time.UTC),
		Bundles: map[string]server.BundleInfo{BundleName: {Revision: "sha256:4181216f15935cd2"}},
		Input:   &input, Results: &result, NDBuiltinCache: &nd, Metrics: m, Error: errors.New("an error"),
	}
	event := logs.EventV1{
		Labels: mgr.Labels(), DecisionID: info.DecisionID, Path: info.Path, Timestamp: info.Timestamp,
		Bundles: map[string]logs.BundleInfoV1{BundleName: {Revision: "sha256:4181216f15935cd2"}},
		Input:   info.Input, Result: info.Results, NDBuiltinCache: info.NDBuiltinCache, Metrics: m.All(), Error: info.Error,
	}
	require.NoError(t, plugin.Log(context.Background(), info))
	now := time.Now()
	ours, err := consoleLine(nil, event, now)
	require.NoError(t, err)

	var want, got map[string]any
	require.NoError(t, json.Unmarshal(opaOut.Bytes(), &want), opaOut.String())
	require.NoError(t, json.Unmarshal(ours, &got), string(ours))
	assert.WithinDuration(t, now, parseTime(t, got["time"]), time.Second, "the time given, to the second")
	assert.Equal(t, len(want["time"].(string)), len(got["time"].(string)), "the logger's time, to the second")
	delete(want, "time")
	delete(got, "time")
	assert.Equal(t, want, got)
	assert.Contains(t, string(ours), `\u003cv\u0026\u003e`, "HTML characters escaped, as OPA's logger does")
}

func parseTime(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	ts, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return ts
}
