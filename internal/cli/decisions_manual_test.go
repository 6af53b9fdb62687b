package cli

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
)

// conditionWritten is the digest of the condition Ada wrote, as
// manualact.ConditionDigest makes it: the sha256 of the JSON
// ["Approved","IchorManualApproval","by ada, by hand with ichor: moved"].
const conditionWritten = "dfc6c4b6f9f0dd8e4679952e0da4018753f31bb9ee26c28d802883b9acb418d4"

// withActs is the fixture's log and two records of a person's acts, as the
// manager logs them (internal/manualact): Ada approved a request by hand,
// and someone the manager did not see revoked Bob's admin binding.
func (f decisionsFixture) withActs(t *testing.T) (log, approval, revocation string) {
	t.Helper()
	ctx := context.Background()
	sink := &decisionsSink{}
	e, err := engine.New(ctx, engine.Options{DecisionLog: sink, ID: "test"})
	require.NoError(t, err)
	defer e.Stop(ctx)
	a, err := e.RecordManual(ctx, engine.ManualActInput{
		Act: engine.ActCSRDecision, SeenBy: engine.SeenByWatch,
		CertificateRequest: &engine.ManualCSRFacts{
			Name: "csr-worker-9", SignerName: "kubernetes.io/kubelet-serving", Username: "system:node:worker-9",
			Conditions:         []engine.ManualCondition{{Type: "Approved", Status: "True", Reason: "IchorManualApproval", Message: "by ada, by hand with ichor: moved"}},
			PreviousConditions: []engine.ManualCondition{},
			// The digest of the condition stored, and of the one Ada's
			// attempt wrote (manualact.ConditionDigest): hers.
			VerdictConditionSHA256: conditionWritten,
		},
		Attempts: []engine.ManualAttempt{{Verdict: "Approved", ConditionSHA256: conditionWritten, Username: "ada"}},
	})
	require.NoError(t, err)
	r, err := e.RecordManual(ctx, engine.ManualActInput{
		Act: engine.ActAdminBindingDeletion, SeenBy: engine.SeenByWatch,
		Binding: &engine.ManualBindingFacts{
			Name: "ichor-admin:u:bob:0123456789", Username: "bob", Identity: "ichor-admin:u:bob",
			RoleRef: engine.RoleRefFacts{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		},
	})
	require.NoError(t, err)
	return f.log + sink.buf.String(), a.DecisionID, r.DecisionID
}

// TestDecisionsListShowsAPersonsActsAndReplayLeavesThemOut: list shows a
// person's acts among the decisions, with who acted and on whom; --user
// finds a person's; replay, which replays what Ichor decided, leaves them
// out and says how many, and does not fail on them.
func TestDecisionsListShowsAPersonsActsAndReplayLeavesThemOut(t *testing.T) {
	f := newDecisionsFixture(t)
	content, approval, revocation := f.withActs(t)
	log := f.file(t, content)

	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", log, "--policy", "manual")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{approval, revocation}, column(t, stdout, "ID"))
	assert.Equal(t, []string{"approve", "revoke"}, column(t, stdout, "ACTION"))
	assert.Equal(t, []string{"ManualApproval", "AdminRevoked"}, column(t, stdout, "CODES"))
	assert.Contains(t, stdout, "ada→system:node:worker-9")
	assert.Contains(t, stdout, "unknown→bob")

	_, _, stderr, _ = decisionsRun(t, "", "decisions", "list", f.file(t, "not an entry\n"+content))
	assert.Contains(t, stderr, "read 4 decisions and 2 records of a person's acts;")

	code, stdout, _, _ = decisionsRun(t, "", "decisions", "list", log, "--user", "ada", "-o", "name")
	require.Equal(t, ExitOK, code)
	assert.Equal(t, "decision.cli.ichor.dev/"+approval+"\n", stdout)
	code, stdout, _, _ = decisionsRun(t, "", "decisions", "list", log, "--action", "revoke", "-o", "name")
	require.Equal(t, ExitOK, code)
	assert.Equal(t, "decision.cli.ichor.dev/"+revocation+"\n", stdout)

	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log)
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Replayed 4 decisions logged under ")
	assert.Regexp(t, `(?m)^not replayed: records of a person's acts \(not decisions\)\s+2$`, stdout)

	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log, "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var rep struct {
		NotReplayed notReplayed `json:"not_replayed"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.Equal(t, 2, rep.NotReplayed.Manual)

	// A log of a person's acts alone has nothing Ichor decided to replay.
	acts, _, _ := decisionsFixture{}.withActs(t)
	code, _, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", f.file(t, acts))
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "no decision to replay: 0 decisions read")
}
