package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/version"
	"github.com/ichor-dev/ichor-policy/policy"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// applied is the record of an approval the manager wrote on csr-worker-1.
func applied(decisionID string) engine.Applied {
	return engine.Applied{
		DecisionID: decisionID, Object: "csr/csr-worker-1", UID: "6f1c0d3e-2b4a-4e8f-9c7d-1a2b3c4d5e6f",
		Action: engine.ActionApprove, Outcome: engine.AppliedWritten,
	}
}

// The record that a decision was carried out is a plain decision-log entry:
// its own id, the labels, the time, the active bundle's revision, and the
// facts of the write Go gave (which decision, on which object and uid, by
// what action, how the write went) as its input; no result, since no rule
// made it. The reader takes it for a record and reads its facts back.
func TestRecordAppliedIsAPlainEntry(t *testing.T) {
	e, log := newEngine(t)
	def, err := bundles.Default()
	require.NoError(t, err)

	require.NoError(t, e.RecordApplied(context.Background(), applied("d-1")))

	entries := harness.Decisions[map[string]any](log, nil)
	require.Len(t, entries, 1)
	entry := entries[0]
	assert.Equal(t, "Decision Log", entry["msg"])
	assert.Equal(t, "openpolicyagent.org/decision_logs", entry["type"])
	assert.Equal(t, engine.PathApplied, entry["path"])
	assert.NotEmpty(t, entry["decision_id"])
	assert.NotEqual(t, "d-1", entry["decision_id"])
	assert.NotEmpty(t, entry["timestamp"])
	assert.Equal(t, def.Manifest.Revision, entry["bundles"].(map[string]any)["ichor"].(map[string]any)["revision"])
	labels := entry["labels"].(map[string]any)
	assert.Equal(t, "ichor-policy", labels["app"])
	assert.Equal(t, "test", labels["id"])
	assert.Equal(t, version.Get().Version, labels["ichor_version"])
	assert.Equal(t, map[string]any{
		"decision_id": "d-1", "object": "csr/csr-worker-1", "uid": "6f1c0d3e-2b4a-4e8f-9c7d-1a2b3c4d5e6f",
		"action": "approve", "outcome": "written", "adopted": false,
	}, entry["input"])
	assert.NotContains(t, entry, "result", "no rule made it")
	assert.NotContains(t, entry, "error")

	read, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, read, 1)
	assert.Equal(t, decisionlog.PathApplied, read[0].Path)
	got, ok := read[0].Applied()
	require.True(t, ok)
	assert.Equal(t, applied("d-1"), got)
	assert.Equal(t, engine.ActionApprove, read[0].Action())
	assert.Empty(t, decisionlog.InEffect(read), "a record is not a verdict")
}

// No rule is evaluated for a record: a bundle without the former record rule
// (policy/system/applied) logs the same entry, where the evaluated record
// was an undefined decision with an error and no facts of the write.
func TestRecordAppliedEvaluatesNoRule(t *testing.T) {
	e, log := loggingEngine(t, func(dir string) { require.NoError(t, os.RemoveAll(filepath.Join(dir, "system", "applied"))) })

	require.NoError(t, e.RecordApplied(context.Background(), applied("d-1")))

	read, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, read, 1)
	assert.Nil(t, read[0].Error, "no rule, so nothing undefined")
	got, ok := read[0].Applied()
	require.True(t, ok)
	assert.Equal(t, applied("d-1"), got)
}

// A record goes to every sink a decision goes to, the same entry in each:
// the console, the file and the decision-log service.
func TestRecordAppliedReachesEverySink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	svc := &harness.LogService{}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	console := &harness.DecisionLog{}
	e, err := engine.New(context.Background(), engine.Options{
		DecisionLog: console, Log: io.Discard, ID: "test", DecisionLogFile: path, DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true,
	})
	require.NoError(t, err)

	require.NoError(t, e.RecordApplied(context.Background(), applied("d-1")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.Stop(ctx)

	fromConsole, _, err := decisionlog.Read(strings.NewReader(console.String()))
	require.NoError(t, err)
	require.Len(t, fromConsole, 1)
	id := fromConsole[0].DecisionID
	assert.True(t, svc.Has(id), "the service received the record")
	file, err := os.Open(path)
	require.NoError(t, err)
	defer file.Close()
	fromFile, _, err := decisionlog.Read(file)
	require.NoError(t, err)
	require.Len(t, fromFile, 1)
	assert.Equal(t, id, fromFile[0].DecisionID)
	assert.JSONEq(t, string(fromConsole[0].Input), string(fromFile[0].Input))
	for _, body := range svc.Bodies() {
		fromService, _, err := decisionlog.Read(strings.NewReader(string(body)))
		require.NoError(t, err)
		require.Len(t, fromService, 1)
		assert.JSONEq(t, string(fromConsole[0].Input), string(fromService[0].Input))
		assert.Equal(t, fromConsole[0].Revision, fromService[0].Revision)
	}
}

// A record says how the manager knows the verdict was applied; one that
// says nothing of it is not written.
func TestRecordAppliedNeedsItsOutcome(t *testing.T) {
	e, log := newEngine(t)
	a := applied("d-1")
	a.Outcome = ""
	require.ErrorContains(t, e.RecordApplied(context.Background(), a), `outcome "" is not "written" or "observed"`)
	assert.Empty(t, log.String())
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
	require.NoError(t, e.RecordApplied(context.Background(), applied(d.DecisionID)))

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
			kinds[labels["kind"]+" "+labels["policy"]+" "+labels["action"]+" "+labels["reason"]] += m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, map[string]float64{
		"decision " + engine.PathKubeletServing + " approve IchorKubeletServing": 1,
		"record " + engine.PathApplied + " approve ":                             1,
	}, kinds, "the record's series is the one the evaluated record had")
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Decisions(engine.PathApplied, engine.ActionApprove, "")))
	assert.Equal(t, engine.KindRecord, engine.KindOf(engine.PathApplied))
	assert.Equal(t, engine.KindDecision, engine.KindOf(engine.PathKubeletServing))
}

// A person's act is counted by how the record knows who acted, so that an
// alert can say when acts are recorded that name nobody: a CSR approved by
// hand while the webhook saw no attempt (actor_source unknown), and an admin
// binding deleted as the API server told the webhook (admission).
func TestAPersonsActsAreCountedByHowTheActorIsKnown(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics, err := engine.NewMetrics(reg)
	require.NoError(t, err)
	ctx := context.Background()
	e, err := engine.New(ctx, engine.Options{DecisionLog: io.Discard, Metrics: metrics, ID: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(ctx) })

	unseen, err := e.RecordManual(ctx, engine.ManualActInput{
		Act: engine.ActCSRDecision, SeenBy: engine.SeenByWatch,
		CertificateRequest: &engine.ManualCSRFacts{
			Name: "csr-worker-9", SignerName: "kubernetes.io/kubelet-serving", Username: "system:node:worker-9",
			Conditions:         []engine.ManualCondition{{Type: "Approved", Status: "True", Reason: "ByHand", Message: "ok"}},
			PreviousConditions: []engine.ManualCondition{},
		},
	})
	require.NoError(t, err)
	require.Equal(t, engine.ActorSourceUnknown, unseen.ActorSource)
	seen, err := e.RecordManual(ctx, engine.ManualActInput{
		Act: engine.ActAdminBindingDeletion, SeenBy: engine.SeenByAdmission,
		User: &engine.CredentialUser{Username: "ada", UID: "u-ada"},
		Binding: &engine.ManualBindingFacts{
			Name: "ichor-admin:u:bob:0123456789", Username: "bob", Identity: "ichor-admin:u:bob",
			RoleRef: engine.RoleRefFacts{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		},
	})
	require.NoError(t, err)
	require.Equal(t, engine.ActorSourceAdmission, seen.ActorSource)

	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.ManualActs(engine.ManualKindDecision, engine.ActionApprove, engine.ActorSourceUnknown)))
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.ManualActs(engine.ManualKindRevocation, engine.ActionRevoke, engine.ActorSourceAdmission)))
	got, err := testutil.GatherAndCount(reg, "ichor_policy_manual_acts_total")
	require.NoError(t, err)
	assert.Equal(t, 2, got)
}

// A CSR's name is as long as its creator likes (Kubernetes checks none): the
// record names it, and its UID, cut as the mask cuts them in the decision,
// so that the record stays small and names the object as the decision does:
// of two verdicts on such a request, the one applied is in effect and the
// other not (review of 2026-12-06; before, the record named the name whole,
// never matched the decision's cut name, and both were listed in effect).
func TestTheRecordOfALongNamedRequestNamesItAsItsDecisionDoes(t *testing.T) {
	e, log := newEngine(t)
	long := strings.Repeat("n", 3000) + "é"
	uid := strings.Repeat("u", 2000)
	in := servingInput(t, csrgen.ECDSA, "10.5.0.2")
	in.CSR.Name, in.CSR.ObjectUID = long, uid
	first, err := e.KubeletServing(context.Background(), in)
	require.NoError(t, err)
	second, err := e.KubeletServing(context.Background(), in)
	require.NoError(t, err)
	rec := applied(second.DecisionID)
	rec.Object, rec.UID = "csr/"+long, uid
	require.NoError(t, e.RecordApplied(context.Background(), rec))

	read, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, read, 3)
	got, ok := read[2].Applied()
	require.True(t, ok)
	assert.Equal(t, "csr/"+strings.Repeat("n", engine.MaxLoggedValue)+"... (3001 bytes)", got.Object)
	assert.Equal(t, read[1].Object(), got.Object, "the record names the object as the decision's input does")
	assert.Equal(t, strings.Repeat("u", engine.MaxLoggedValue)+"... (2000 bytes)", got.UID)
	var ids []string
	for _, entry := range decisionlog.InEffect(read) {
		ids = append(ids, entry.DecisionID)
	}
	assert.Equal(t, []string{second.DecisionID}, ids, "the verdict not applied (%s) is in effect", first.DecisionID)

	// A record written before records were cut names the name whole, and
	// is read as naming the cut one.
	whole := strings.Replace(log.String(), got.Object, "csr/"+long, 1)
	read, _, err = decisionlog.Read(strings.NewReader(whole))
	require.NoError(t, err)
	ids = nil
	for _, entry := range decisionlog.InEffect(read) {
		ids = append(ids, entry.DecisionID)
	}
	assert.Equal(t, []string{second.DecisionID}, ids)

	// Another request whose name is cut alike (the same first characters,
	// the same length) is told apart by its UID: its verdict stays in
	// effect (the review of 2026-12-06).
	twin := servingInput(t, csrgen.ECDSA, "10.5.0.2")
	twin.CSR.Name, twin.CSR.ObjectUID = strings.Repeat("n", 3000)+"è", "twin-uid"
	other, err := e.KubeletServing(context.Background(), twin)
	require.NoError(t, err)
	read, _, err = decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	ids = nil
	for _, entry := range decisionlog.InEffect(read) {
		ids = append(ids, entry.DecisionID)
	}
	assert.Equal(t, []string{second.DecisionID, other.DecisionID}, ids)
}

// MaxLoggedValue is the mask's bound, which the policy's data sets.
func TestMaxLoggedValueIsTheMasks(t *testing.T) {
	data, err := fs.ReadFile(policy.FS, "system/log/data.json")
	require.NoError(t, err)
	var d struct {
		Config struct {
			MaxLoggedValueLength int `json:"max_logged_value_length"`
		} `json:"config"`
	}
	require.NoError(t, json.Unmarshal(data, &d))
	assert.Equal(t, d.Config.MaxLoggedValueLength, engine.MaxLoggedValue)
}
