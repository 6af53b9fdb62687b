package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

func auditInput(ips ...string) servingcert.Audit {
	sans := []csrinput.SAN{{Type: "dns", Value: "worker-1"}}
	for _, ip := range ips {
		sans = append(sans, csrinput.SAN{Type: "ip", Value: ip})
	}
	return servingcert.Audit{
		Machine: csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"},
		Node:    csrinput.Node{Readable: true, Nodename: "worker-1", Hostname: "worker-1", Addresses: []string{"10.5.0.2"}},
		Certificate: servingcert.Certificate{
			Address: "10.5.0.2:10250", Read: true,
			Subject:         []csrinput.Attribute{{OID: "2.5.4.10", Name: "O", Value: "system:nodes"}, {OID: "2.5.4.3", Name: "CN", Value: "system:node:worker-1"}},
			SubjectAltNames: sans, Serial: "01", Issuer: "CN=kubernetes",
			NotBefore: "2026-01-01T00:00:00Z", NotAfter: "2027-01-01T00:00:00Z",
			NotBeforeUnix: 1767225600, NotAfterUnix: 1798761600,
			ExtKeyUsages: []string{"server auth"}, IssuedByClusterCA: true,
		},
		Now: "2026-06-01T00:00:00Z", NowUnix: 1780272000,
	}
}

func TestKubeletServingAuditJudgesAndLogs(t *testing.T) {
	e, log := newEngine(t)

	current, err := e.KubeletServingAudit(context.Background(), auditInput("10.5.0.2"))
	require.NoError(t, err)
	assert.Equal(t, engine.AuditCurrent, current.Status)
	assert.Equal(t, []string{"CertificateCurrent"}, current.Reasons.Codes())

	moved, err := e.KubeletServingAudit(context.Background(), auditInput("10.5.0.3"))
	require.NoError(t, err)
	assert.Equal(t, engine.AuditDrifted, moved.Status)
	assert.Equal(t, []string{"CertificateNamesNotNode"}, moved.Reasons.Codes())
	assert.Contains(t, moved.Message(), "IP address 10.5.0.3 is not one of the node's addresses")
	assert.Contains(t, moved.Message(), moved.DecisionID)

	entry := harness.FindDecision[map[string]any](t, log, moved.DecisionID)
	assert.Equal(t, engine.PathKubeletServingAudit, entry["path"])
	assert.Equal(t, "drifted", entry["result"].(map[string]any)["status"])
	assert.Equal(t, engine.Outcome{Action: engine.AuditDrifted, Node: "worker-1", Reasons: moved.Reasons},
		engine.OutcomeOf(mustJSON(t, entry["result"]), nil))
}

// RFC 5280's "no expiry": the engine's builtins are strict, so a rule that
// parsed this time (beyond OPA's 2262) would fail the decision; judged in
// Unix seconds, the certificate is current.
func TestKubeletServingAuditOfANoExpiryCertificateIsCurrent(t *testing.T) {
	e, _ := newEngine(t)
	in := auditInput("10.5.0.2")
	in.Certificate.NotAfter, in.Certificate.NotAfterUnix = "9999-12-31T23:59:59Z", 253402300799
	d, err := e.KubeletServingAudit(context.Background(), in)
	require.NoError(t, err)
	assert.Equal(t, engine.AuditCurrent, d.Status)
	assert.Equal(t, []string{"CertificateCurrent"}, d.Reasons.Codes())
}

func TestAnAuditRuleWithAnUnknownStatusIsRefusedByTheEngine(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "ichor", "kubelet_serving"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ichor", "kubelet_serving", "broken.rego"), []byte(`package ichor.kubelet_serving

audit := {"status": "fine", "reasons": [{"code": "Broken", "message": "a status nobody knows"}], "node": "worker-1"}
`), 0o600))
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	e, err := engine.New(context.Background(), engine.Options{Bundle: b, DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	d, err := e.KubeletServingAudit(context.Background(), auditInput("10.5.0.2"))
	require.ErrorContains(t, err, `unknown status "fine"`)
	assert.Empty(t, d.Status, "nothing to act on")
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return data
}
