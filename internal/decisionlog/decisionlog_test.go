package decisionlog_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// serving is the input of a kubelet-serving request from node for ips, with
// the identity Talos reports for it; no machine when identity is nil.
func serving(t *testing.T, node string, identity *csrinput.Node, ips ...string) csrinput.KubeletServing {
	t.Helper()
	r := csrgen.Request{Subject: csrgen.NodeSubject(node), DNSNames: []string{node}}
	for _, ip := range ips {
		r.IPs = append(r.IPs, net.ParseIP(ip))
	}
	pemBytes, err := csrgen.PEM(r)
	require.NoError(t, err)
	in := csrinput.KubeletServing{CSR: csrinput.Build(csrgen.ServingObject("csr-"+node, node, pemBytes))}
	if identity != nil {
		in.Machine = &csrinput.Machine{Name: node, Namespace: "default", Cluster: "demo"}
		in.Node = identity
	}
	return in
}

func talos(node string, addrs ...string) *csrinput.Node {
	return &csrinput.Node{Readable: true, Nodename: node, Hostname: node, Addresses: addrs}
}

// realLog runs the engine on real inputs and returns its decision log:
// worker-1 approved, worker-1 denied (another node's IP), worker-3 pending
// (no machine), worker-2 approved, a request of another signer (no
// decision), alice admitted, bob refused (no such cluster).
func realLog(t *testing.T) (string, []string) {
	t.Helper()
	ctx := context.Background()
	log := &harness.DecisionLog{}
	e, err := engine.New(ctx, engine.Options{DecisionLog: log, ID: "test"})
	require.NoError(t, err)
	defer e.Stop(ctx)

	var ids []string
	for _, in := range []csrinput.KubeletServing{
		serving(t, "worker-1", talos("worker-1", "10.5.0.2"), "10.5.0.2"),
		serving(t, "worker-1", talos("worker-1", "10.5.0.2"), "10.5.0.3"),
		serving(t, "worker-3", nil, "10.5.0.4"),
		serving(t, "worker-2", talos("worker-2", "10.5.0.3"), "10.5.0.3"),
	} {
		d, err := e.KubeletServing(ctx, in)
		require.NoError(t, err)
		ids = append(ids, d.DecisionID)
	}
	other := serving(t, "worker-1", talos("worker-1", "10.5.0.2"), "10.5.0.2")
	other.CSR.SignerName = certificatesv1.KubeAPIServerClientSignerName
	_, err = e.KubeletServing(ctx, other)
	require.ErrorIs(t, err, engine.ErrNoDecision)
	for _, in := range []map[string]any{harness.AdmissionInput("ichor:alice", true), harness.AdmissionInput("ichor:bob", false)} {
		d, err := e.Decide(ctx, decisionlog.PathAdmission, in)
		require.NoError(t, err)
		ids = append(ids, d.ID)
	}
	return log.String(), ids
}

// interleave puts the log's lines among lines kubectl logs would also show.
func interleave(log string) string {
	var b strings.Builder
	b.WriteString(`{"level":"info","ts":"2026-05-01T12:00:00Z","logger":"manager","msg":"starting","bundle":""}` + "\n")
	for i, l := range strings.Split(strings.TrimSpace(log), "\n") {
		switch i {
		case 1:
			b.WriteString("I0501 12:00:01.000000       1 leaderelection.go:257] attempting to acquire leader lease\n")
		case 2:
			b.WriteString(`{"level":"info","msg":"approved kubelet serving certificate","csr":"csr-worker-1","decision_id":"not-a-decision"}` + "\n\n")
		case 3:
			b.WriteString("[1,2,3]\n")
			// kubectl logs --timestamps writes the time before the line.
			l = "2026-05-01T12:00:02.000000000Z " + l
		}
		b.WriteString(l + "\n")
	}
	b.WriteString(`{"level":"error","msg":"Decision Log"}` + "\n")
	return b.String()
}

func TestReadTakesEveryDecisionInOrderAndSkipsTheRest(t *testing.T) {
	log, ids := realLog(t)

	entries, skipped, err := decisionlog.Read(strings.NewReader(interleave(log)))

	require.NoError(t, err)
	// The manager's start, the klog line, the controller's line (its
	// decision_id field is not a decision), the array and the line without a
	// decision_id; the blank line is not counted.
	assert.Equal(t, decisionlog.Skipped{Lines: 5}, skipped)
	require.Len(t, entries, 7)
	def, err := bundles.Default()
	require.NoError(t, err)

	type row struct{ id, policy, action, node, user, codes string }
	var got []row
	for _, e := range entries {
		got = append(got, row{e.DecisionID, e.Policy(), e.Action(), e.Node(), e.User(), strings.Join(e.Codes(), ",")})
		assert.Equal(t, def.Manifest.Revision, e.Revision)
		assert.WithinDuration(t, time.Now(), e.Timestamp, time.Minute)
		assert.Equal(t, "openpolicyagent.org/decision_logs", e.Type)
		assert.Equal(t, "test", e.Labels["id"])
		assert.True(t, json.Valid(e.Raw))
	}
	assert.Equal(t, []row{
		{ids[0], "kubelet-serving", "approve", "worker-1", "system:node:worker-1", "IchorKubeletServing"},
		{ids[1], "kubelet-serving", "deny", "worker-1", "system:node:worker-1", "IPNotNode"},
		{ids[2], "kubelet-serving", "pending", "worker-3", "system:node:worker-3", "MachineUnknown"},
		{ids[3], "kubelet-serving", "approve", "worker-2", "system:node:worker-2", "IchorKubeletServing"},
		{entries[4].DecisionID, "kubelet-serving", "none", "worker-1", "system:node:worker-1", ""},
		{ids[4], "admission", "allowed", "", "ichor:alice", "IchorCredentialAdmitted"},
		{ids[5], "admission", "refused", "", "ichor:bob", "ClusterNotFound"},
	}, got)
	assert.Equal(t, []string{"IPNotNode"}, entries[1].Codes())
	assert.Contains(t, entries[1].Reasons()[0].Message, "10.5.0.3")
}

func TestReadReportsTheReadersError(t *testing.T) {
	boom := errors.New("boom")
	_, _, err := decisionlog.Read(&failingReader{err: boom})
	require.ErrorIs(t, err, boom)
}

type failingReader struct{ err error }

func (r *failingReader) Read([]byte) (int, error) { return 0, r.err }

func TestFilterSelectsByEachCriterion(t *testing.T) {
	log, ids := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	// One decision made yesterday, to prove --since.
	entries[0].Timestamp = time.Now().Add(-24 * time.Hour)

	idsOf := func(c decisionlog.Criteria) []string {
		var out []string
		for _, e := range decisionlog.Filter(entries, c) {
			out = append(out, e.DecisionID)
		}
		return out
	}
	serving, err := decisionlog.ResolvePolicy("kubelet-serving")
	require.NoError(t, err)
	admissionPath, err := decisionlog.ResolvePolicy("data.ichor.credentials.admission")
	require.NoError(t, err)
	since, err := decisionlog.ParseSince("1h", time.Now())
	require.NoError(t, err)

	assert.Len(t, idsOf(decisionlog.Criteria{}), 7)
	assert.Len(t, idsOf(decisionlog.Criteria{Path: serving}), 5)
	assert.Equal(t, ids[4:], idsOf(decisionlog.Criteria{Path: admissionPath}))
	assert.Equal(t, []string{ids[0], ids[3]}, idsOf(decisionlog.Criteria{Action: "approve"}))
	assert.Equal(t, []string{ids[1]}, idsOf(decisionlog.Criteria{Action: "deny"}))
	assert.Equal(t, []string{ids[2]}, idsOf(decisionlog.Criteria{Action: "pending"}))
	assert.Equal(t, []string{ids[4]}, idsOf(decisionlog.Criteria{Action: "allowed"}))
	assert.Equal(t, []string{ids[5]}, idsOf(decisionlog.Criteria{Action: "refused"}))
	assert.Equal(t, []string{entries[4].DecisionID}, idsOf(decisionlog.Criteria{Action: "none"}))
	assert.Equal(t, []string{ids[3]}, idsOf(decisionlog.Criteria{Node: "worker-2"}))
	assert.Equal(t, []string{ids[5]}, idsOf(decisionlog.Criteria{User: "ichor:bob"}))
	assert.Equal(t, []string{ids[2]}, idsOf(decisionlog.Criteria{User: "system:node:worker-3"}))
	assert.Len(t, idsOf(decisionlog.Criteria{Since: since}), 6)
	assert.NotContains(t, idsOf(decisionlog.Criteria{Since: since}), ids[0])
	assert.Len(t, idsOf(decisionlog.Criteria{Revision: entries[0].Revision[:12]}), 7)
	assert.Empty(t, idsOf(decisionlog.Criteria{Revision: "sha256:0000"}))
	assert.Equal(t, []string{ids[1]}, idsOf(decisionlog.Criteria{Path: serving, Action: "deny", Node: "worker-1", Since: since}))
}

func TestNodeMatchesWhatTalosReportedToo(t *testing.T) {
	ctx := context.Background()
	log := &harness.DecisionLog{}
	e, err := engine.New(ctx, engine.Options{DecisionLog: log})
	require.NoError(t, err)
	defer e.Stop(ctx)
	d, err := e.KubeletServing(ctx, serving(t, "worker-1", talos("worker-9", "10.5.0.2"), "10.5.0.2"))
	require.NoError(t, err)
	require.Equal(t, engine.ActionPending, d.Action)

	entries, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "worker-1", entries[0].Node())
	assert.Contains(t, entries[0].Nodes(), "worker-9")
	assert.Len(t, decisionlog.Filter(entries, decisionlog.Criteria{Node: "worker-9"}), 1)
}

func TestParsingOfPoliciesAndTimes(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]string{
		"kubelet-serving":                     "ichor/kubelet_serving/decision",
		"kubelet-client":                      "ichor/kubelet_client/decision",
		"admission":                           "ichor/credentials/admission",
		"issuance":                            "ichor/credentials/issuance",
		"/ichor/credentials/requirements":     "ichor/credentials/requirements",
		"data.ichor.kubelet_serving.decision": "ichor/kubelet_serving/decision",
		"kubelet-serving-audit":               "ichor/kubelet_serving/audit",
		"kubelet-serving-rejection":           "ichor/kubelet_serving/rejection",
	} {
		got, err := decisionlog.ResolvePolicy(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	_, err := decisionlog.ResolvePolicy("serving")
	assert.ErrorContains(t, err, "admission, credential-check, issuance, kubeconfig, kubelet-client, kubelet-serving, kubelet-serving-audit, kubelet-serving-limits, kubelet-serving-rejection, manual, requirements")

	for in, want := range map[string]time.Time{
		"90m":                       now.Add(-90 * time.Minute),
		"30d":                       now.Add(-30 * 24 * time.Hour),
		"1d12h":                     now.Add(-36 * time.Hour),
		"0d":                        now,
		"2026-04-30T08:00:00+02:00": time.Date(2026, 4, 30, 6, 0, 0, 0, time.UTC),
	} {
		got, err := decisionlog.ParseSince(in, now)
		require.NoError(t, err, in)
		assert.True(t, got.Equal(want), "%s: %v, want %v", in, got, want)
	}
	for _, bad := range []string{"yesterday", "-1h", "2026-04-30", "-1d", "+1d", "d", "1d-2h", "1dd", "1d2", "100001d", "99999999999999999999d"} {
		_, err := decisionlog.ParseSince(bad, now)
		assert.Error(t, err, bad)
	}
}

func replay(t *testing.T, dir string, entries []decisionlog.Entry) decisionlog.Report {
	t.Helper()
	ctx := context.Background()
	b, err := bundles.Load(dir)
	require.NoError(t, err)
	e, err := engine.New(ctx, engine.Options{Bundle: b, DecisionLog: &harness.DecisionLog{}})
	require.NoError(t, err)
	defer e.Stop(ctx)
	rep, err := decisionlog.Replay(ctx, e, entries)
	require.NoError(t, err)
	return rep
}

func TestReplayWithTheSamePolicyChangesNothing(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)

	rep := replay(t, "../../policy", entries)

	assert.Equal(t, 7, rep.Replayed)
	assert.Equal(t, 7, rep.Unchanged)
	assert.Empty(t, rep.Changes)
	assert.Empty(t, rep.Directions)
	assert.Equal(t, entries[0].Revision, rep.Revision)
}

// An entry whose input the mask redacted (a user's extra attributes it does
// not list: OPA names each path it wrote under "masked") is replayed, and
// said to be: a rule that reads those values may decide it otherwise, the
// same bundle too (review 255 F8). The mask's note of what it cut is no
// such value.
func TestReplaySaysWhatItReplayedOnRedactedValues(t *testing.T) {
	log, ids := realLog(t)
	lines := strings.SplitAfter(strings.TrimSpace(log), "\n")
	mark := func(line string, masked ...string) string {
		var event map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &event))
		event["masked"] = masked
		out, err := json.Marshal(event)
		require.NoError(t, err)
		return string(out) + "\n"
	}
	lines[0] = mark(lines[0], "/input/csr/extra")
	lines[1] = mark(lines[1], "/input/log_truncated", "/result/reasons")
	lines[2] = mark(lines[2], "/input/log_truncated", "/input/authorization/reason")
	entries, _, err := decisionlog.Read(strings.NewReader(strings.Join(lines, "")))
	require.NoError(t, err)

	rep := replay(t, "../../policy", entries)
	assert.Equal(t, 7, rep.Replayed)
	require.Len(t, rep.Redacted, 1)
	assert.Equal(t, ids[0], rep.Redacted[0].DecisionID)
}

func TestReplayWithoutTheIPCheckFlipsExactlyTheDenial(t *testing.T) {
	log, ids := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)

	rep := replay(t, harness.PolicyWithoutServingIPCheck(t), entries)

	assert.Equal(t, 7, rep.Replayed)
	assert.Equal(t, 6, rep.Unchanged)
	assert.Equal(t, map[string]int{"deny-to-approve": 1}, rep.Directions)
	require.Len(t, rep.Changes, 1)
	c := rep.Changes[0]
	assert.Equal(t, ids[1], c.Entry.DecisionID)
	assert.Equal(t, "deny-to-approve", c.Direction)
	assert.Equal(t, []string{"IPNotNode"}, c.Old.Reasons.Codes())
	assert.Equal(t, []string{"IchorKubeletServing"}, c.New.Reasons.Codes())
	assert.NotEqual(t, entries[0].Revision, rep.Revision)

	for pattern, want := range map[string]bool{
		"any": true, "deny-to-approve": true, "to-approve": true, "from-deny": true,
		"approve-to-deny": false, "to-deny": false, "from-pending": false, "reasons-changed": false,
	} {
		require.NoError(t, decisionlog.CheckFailOn(pattern), pattern)
		assert.Equal(t, want, c.Matches(pattern), pattern)
	}
}

// A candidate that grants more under the same action and reason code (a
// talosconfig for twelve hours where one for an hour was admitted) is a change, and one that "any" fails on: comparing the action
// and the codes alone replayed it as unchanged.
func TestReplayReportsACredentialThatGrantsMore(t *testing.T) {
	log, ids := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)

	rep := replay(t, harness.PolicyWithWiderTalosconfig(t), entries)

	assert.Equal(t, 7, rep.Replayed)
	assert.Equal(t, 5, rep.Unchanged)
	assert.Empty(t, rep.Directions)
	assert.Equal(t, map[string]int{decisionlog.NoteResultChanged: 2}, rep.Notes)
	require.Len(t, rep.Changes, 2)
	assert.Equal(t, ids[5], rep.Changes[1].Entry.DecisionID, "bob's refusal")
	assert.Equal(t, []string{"lifetime_seconds"}, rep.Changes[1].Changed, "a refusal that names another lifetime is reported too")
	c := rep.Changes[0]
	assert.Equal(t, ids[4], c.Entry.DecisionID, "alice's admission")
	assert.Equal(t, []string{"credential", "lifetime_seconds"}, c.Changed,
		"the credential and the lifetime; the Event's message names them too, but it is text")
	assert.Equal(t, c.Old.Reasons.Codes(), c.New.Reasons.Codes(), "the same reason code")
	assert.Contains(t, string(c.New.Result), `"credential":"talosconfig for a working day"`)
	for pattern, want := range map[string]bool{
		"any": true, "result-changed": true, "reasons-changed": false, "to-allowed": false, "refused-to-allowed": false,
	} {
		assert.Equal(t, want, c.Matches(pattern), pattern)
	}
}

// A result that names an action word beside "allowed" would read as that
// action (engine.Outcome), while the issuer acts on "allowed" alone: a
// candidate that answers {"allowed": true, "action": "refused", ...} for a
// refusal replayed as refused (review of 2026-12-05: a change "any" fails
// on). The engine's callers refuse such a result as a broken bundle's, and
// so does the replay now: the candidate fails there (review 255 F2).
func TestReplayReportsAGrantBehindARefusingActionWord(t *testing.T) {
	log, ids := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	bob := entries[6]
	require.Equal(t, ids[5], bob.DecisionID)

	rep, err := decisionlog.Replay(context.Background(), scripted{
		decisionlog.PathAdmission: func() (engine.Decision, error) {
			return engine.Decision{Result: json.RawMessage(`{"allowed":true,"action":"refused","credential":{"kind":"talos","talos_role":"os:admin"},` +
				`"lifetime_seconds":43200,"purpose":"talosconfig-reader","reasons":[{"code":"ClusterNotFound","message":"m"}]}`)}, nil
		},
	}, []decisionlog.Entry{bob})
	require.NoError(t, err)
	require.Len(t, rep.Changes, 1)
	c := rep.Changes[0]
	assert.Equal(t, engine.ActionError, c.New.Action, "what the webhook would make of it")
	assert.Contains(t, c.New.Error, `answers "allowed" and carries "action" too`)
	assert.Equal(t, map[string]int{"refused-to-error": 1}, rep.Directions)
	assert.True(t, c.Matches("any"))
	assert.True(t, c.Matches("to-error"))
}

// Whatever every caller of a rule would refuse of a candidate's answer (an
// action it does not know, no reason, an allowed that names nothing to
// sign) is replayed as the failure it would be, not as what it claims
// (review 255 F2).
func TestReplayReportsWhatTheCallerWouldRefuseAsAnError(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	// The denial (IPNotNode) and alice's admission.
	entries = []decisionlog.Entry{entries[1], entries[5]}
	for name, tc := range map[string]struct{ serving, admission, want string }{
		"an action no approver knows": {
			serving:   `{"action":"approved","node":"worker-1","reasons":[{"code":"C","message":"m"}]}`,
			admission: `{"allowed":true,"reasons":[],"purpose":"talosconfig-reader","lifetime_seconds":3600}`,
			want:      "has unknown action",
		},
		"no reason": {
			serving:   `{"action":"approve","node":"worker-1","reasons":[]}`,
			admission: `{"allowed":true,"reasons":[],"purpose":"talosconfig-reader","lifetime_seconds":3600}`,
			want:      "gives no reason",
		},
	} {
		t.Run(name, func(t *testing.T) {
			rep, err := decisionlog.Replay(t.Context(), scripted{
				decisionlog.PathKubeletServing: func() (engine.Decision, error) {
					return engine.Decision{Result: json.RawMessage(tc.serving)}, nil
				},
				decisionlog.PathAdmission: func() (engine.Decision, error) {
					return engine.Decision{Result: json.RawMessage(tc.admission)}, nil
				},
			}, entries)
			require.NoError(t, err)
			assert.Equal(t, map[string]int{"deny-to-error": 1, "allowed-to-error": 1}, rep.Directions)
			require.Len(t, rep.Changes, 2)
			assert.Contains(t, rep.Changes[0].New.Error, tc.want)
			assert.Contains(t, rep.Changes[1].New.Error, "gives no reason")
		})
	}
}

// Only the words changed: no change.
func TestReplayLeavesAMessageInOtherWordsUnchanged(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	alice := entries[5]
	var result map[string]any
	require.NoError(t, json.Unmarshal(alice.Result, &result))
	result["reasons"] = []any{map[string]any{"code": "IchorCredentialAdmitted", "message": "other words"}}
	result["event"].(map[string]any)["message"] = "other words"
	reworded, err := json.Marshal(result)
	require.NoError(t, err)

	rep, err := decisionlog.Replay(context.Background(), scripted{
		decisionlog.PathAdmission: func() (engine.Decision, error) { return engine.Decision{Result: reworded}, nil },
	}, []decisionlog.Entry{alice})
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Unchanged)
	assert.Empty(t, rep.Changes)
}

// scripted answers each path with a fixed decision or error.
type scripted map[string]func() (engine.Decision, error)

func (s scripted) Decide(_ context.Context, path string, _ any) (engine.Decision, error) {
	return s[path]()
}

func TestReplayReportsReasonsNoDecisionAndErrors(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	// Only the denial (IPNotNode) and bob's refusal.
	entries = []decisionlog.Entry{entries[1], entries[6]}

	rep, err := decisionlog.Replay(context.Background(), scripted{
		decisionlog.PathKubeletServing: func() (engine.Decision, error) {
			return engine.Decision{Revision: "sha256:candidate", Result: json.RawMessage(
				`{"action":"deny","node":"worker-1","reasons":[{"code":"DNSNameNotNode","message":"m"},{"code":"IPNotNode","message":"m"}]}`)}, nil
		},
		decisionlog.PathAdmission: func() (engine.Decision, error) { return engine.Decision{}, engine.ErrNoDecision },
	}, entries)
	require.NoError(t, err)
	assert.Equal(t, 0, rep.Unchanged)
	assert.Equal(t, map[string]int{"refused-to-none": 1}, rep.Directions)
	assert.Equal(t, map[string]int{decisionlog.NoteReasonsChanged: 1}, rep.Notes)
	require.Len(t, rep.Changes, 2)
	assert.Equal(t, decisionlog.NoteReasonsChanged, rep.Changes[0].Note)
	assert.True(t, rep.Changes[0].Matches("reasons-changed"))
	assert.False(t, rep.Changes[0].Matches("any"))
	assert.True(t, rep.Changes[1].Matches("to-none"))

	rep, err = decisionlog.Replay(context.Background(), scripted{
		decisionlog.PathKubeletServing: func() (engine.Decision, error) { return engine.Decision{}, errors.New("eval_conflict_error") },
		decisionlog.PathAdmission: func() (engine.Decision, error) {
			return engine.Decision{Result: json.RawMessage(
				`{"allowed":false,"lifetime_seconds":3600,"purpose":"talosconfig-reader","reasons":[{"code":"ClusterNotFound","message":"other words"}]}`)}, nil
		},
	}, entries)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Unchanged, "the same codes in other words are the same decision")
	assert.Equal(t, map[string]int{"deny-to-error": 1}, rep.Directions)
	assert.Equal(t, "eval_conflict_error", rep.Changes[0].New.Error)
}

// A logged answer the manager refused (a kubelet client "deny", which that
// rule never gives) was no verdict: held to the same check as the
// candidate's, the same answer replays unchanged rather than deny → error
// (review 257).
func TestALoggedAnswerTheManagerRefusedIsNoVerdictInAReplay(t *testing.T) {
	const answer = `{"action":"deny","kind":"nodeclient","reasons":[{"code":"C","message":"m"}]}`
	log := `{"msg":"Decision Log","decision_id":"refused","path":"ichor/kubelet_client/decision","input":{"csr":{"name":"csr-1"}},"result":` + answer + "}\n"
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	rep, err := decisionlog.Replay(t.Context(), scripted{
		"ichor/kubelet_client/decision": func() (engine.Decision, error) {
			return engine.Decision{Result: json.RawMessage(answer)}, nil
		},
	}, entries)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Unchanged)
	assert.Empty(t, rep.Directions)
}

// The authorizer's words cut by the mask leave the input the request's: the
// rules only quote them in a refusal's message, and the entry is replayed
// (review 257: a long RBAC reason kept every credential decision of its
// user out of a replay's gate). Any other cut leaves it out.
func TestAnEntryWhoseAuthorizersWordsTheLogCutIsReplayed(t *testing.T) {
	const entry = `{"msg":"Decision Log","decision_id":%q,"path":"ichor/credentials/admission","input":{"authorization":{"reason":"r... (600 bytes)"},"log_truncated":{%s}},"result":{"allowed":false,"reasons":[{"code":"C","message":"m"}]}}` + "\n"
	log := fmt.Sprintf(entry, "words", `"authorization.reason":600,"authorization.evaluation_error":700`) +
		fmt.Sprintf(entry, "groups", `"authorization.groups":1000`)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.False(t, entries[0].Truncated())
	assert.True(t, entries[1].Truncated())
}

// An entry whose input holds lists longer than any a manager logs is not
// replayed: 5,000 node addresses and as many other addresses asked for had
// the kubelet-serving rule format the whole list into each refusal, a
// quadratic the forger sizes (review of 2026-12-06). The replay fails,
// naming the entry, before the rule runs.
func TestReplayRefusesAnInputNoManagerLogs(t *testing.T) {
	addresses, sans := make([]any, 5000), make([]any, 5000)
	for i := range addresses {
		addresses[i] = fmt.Sprintf("10.%d.%d.1", i/256, i%256)
		sans[i] = map[string]any{"type": "ip", "value": fmt.Sprintf("10.%d.%d.2", i/256, i%256)}
	}
	replayForged(t, "a list of 5000 items, more than any a manager logs", func(input map[string]any) {
		input["node"].(map[string]any)["addresses"] = addresses
		input["csr"].(map[string]any)["request"].(map[string]any)["subject_alt_names"] = sans
	})
}

// Within the list bound, a forged entry's long value, quoted by the rule
// into each refusal's message, is bounded too: one address of 1 MB and
// 1,000 names asked for make a gigabyte of messages, 15 MB fifteen
// (review 172), and so do a thousand addresses of a kilobyte and a number
// of a megabyte of digits (review 174). One as large as a manager logs is
// replayed: a request's extra of five keys of 100 values, each of 512
// four-byte characters, a megabyte (review 173).
func TestReplayRefusesAnInputWithAValueNoManagerLogs(t *testing.T) {
	sans := make([]any, 1000)
	for i := range sans {
		sans[i] = map[string]any{"type": "ip", "value": fmt.Sprintf("10.%d.%d.2", i/256, i%256)}
	}
	eng, entries, ids := replayForged(t, "more than any a manager logs together", func(input map[string]any) {
		input["node"].(map[string]any)["addresses"] = []any{strings.Repeat("1", 1<<20)}
		input["csr"].(map[string]any)["request"].(map[string]any)["subject_alt_names"] = sans
	})
	// The value spread over the list the rule quotes whole, or written as
	// a number, which no string's length sees (review 174).
	spread := make([]any, 1000)
	for i := range spread {
		spread[i] = strings.Repeat("2", 1<<10)
	}
	replayForged(t, "more than any a manager logs together", func(input map[string]any) {
		input["node"].(map[string]any)["addresses"] = spread
		input["csr"].(map[string]any)["request"].(map[string]any)["subject_alt_names"] = sans
	})
	replayForged(t, "more than any a manager logs together", func(input map[string]any) {
		input["node"].(map[string]any)["addresses"] = []any{json.Number(strings.Repeat("1", 1<<20))}
		input["csr"].(map[string]any)["request"].(map[string]any)["subject_alt_names"] = sans
	})
	extra := map[string]any{}
	for k := range 5 {
		values := make([]any, 100)
		for v := range values {
			values[v] = strings.Repeat("\U0001F600", 512)
		}
		extra[fmt.Sprintf("key-%d", k)] = values
	}
	for i := range entries {
		if entries[i].DecisionID == ids[1] {
			entries[i].Input = edited(t, entries[i].Input, func(input map[string]any) { input["csr"].(map[string]any)["extra"] = extra })
			require.Greater(t, len(entries[i].Input), 1_000_000)
		}
	}
	_, err := decisionlog.Replay(context.Background(), eng, entries)
	require.NoError(t, err)
}

// An object is a collection to a rule too (some x in obj), and a path the
// manager never decides on (the RBAC invariant, whose reasons multiply two
// lists) is not evaluated on a forged input (review 175).
func TestReplayRefusesAnObjectAsLargeAsAListAndAnyOtherPath(t *testing.T) {
	sans := map[string]any{}
	for i := range 2000 {
		sans[fmt.Sprint(i)] = map[string]any{"type": "ip", "value": fmt.Sprintf("10.%d.%d.2", i/256, i%256)}
	}
	replayForged(t, "a list of 2000 items, more than any a manager logs", func(input map[string]any) {
		input["node"].(map[string]any)["addresses"] = []any{strings.Repeat("1", 1<<20)}
		input["csr"].(map[string]any)["request"].(map[string]any)["subject_alt_names"] = sans
	})

	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	other := entries[1]
	other.Path = "ichor/rbac/violations"
	called := false
	_, err = decisionlog.Replay(context.Background(), decideAny(func() { called = true }), []decisionlog.Entry{other})
	require.ErrorContains(t, err, `its path "ichor/rbac/violations" is no rule a manager decides on`)
	assert.False(t, called, "the rule at that path was evaluated")
}

// The changes a replay keeps hold their new results: entries each within
// the bound, whose results are large, are refused once they add up past it
// (review 175).
func TestReplayBoundsTheResultsItKeeps(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	// One result of 100 MiB, shared: a change each time.
	large := json.RawMessage(`{"action":"deny","reasons":[{"code":"X","message":"` + strings.Repeat("x", 100<<20) + `"}]}`)
	var many []decisionlog.Entry
	for range 4 {
		many = append(many, entries[1])
	}
	_, err = decisionlog.Replay(context.Background(), scripted{
		decisionlog.PathKubeletServing: func() (engine.Decision, error) {
			return engine.Decision{Revision: "sha256:candidate", Result: large}, nil
		},
	}, many)
	require.ErrorContains(t, err, "more than a replay keeps")
}

// decideAny is a Decider that notes being asked and decides nothing.
type decideAny func()

func (d decideAny) Decide(context.Context, string, any) (engine.Decision, error) {
	d()
	return engine.Decision{}, engine.ErrNoDecision
}

// replayForged replays the real log's denial with its input edited, and
// requires it refused, before the rule runs, saying want. It returns the
// engine of the shipped bundle and the real log's entries.
func replayForged(t *testing.T, want string, edit func(input map[string]any)) (*engine.Engine, []decisionlog.Entry, []string) {
	t.Helper()
	log, ids := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	var forged []decisionlog.Entry
	for _, e := range entries {
		if e.DecisionID == ids[1] {
			e.Input = edited(t, e.Input, edit)
			forged = append(forged, e)
		}
	}
	require.Len(t, forged, 1, "the denial's entry")
	ctx := context.Background()
	b, err := bundles.Load("../../policy")
	require.NoError(t, err)
	eng, err := engine.New(ctx, engine.Options{Bundle: b, DecisionLog: &harness.DecisionLog{}})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Stop(ctx) })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = decisionlog.Replay(ctx, eng, forged)
	runtime.ReadMemStats(&after)
	require.ErrorContains(t, err, want)
	assert.Contains(t, err.Error(), ids[1])
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "the rule ran")
	return eng, entries, ids
}

// edited is the JSON document raw with edit applied.
func edited(t *testing.T, raw json.RawMessage, edit func(map[string]any)) json.RawMessage {
	t.Helper()
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	edit(doc)
	out, err := json.Marshal(doc)
	require.NoError(t, err)
	return out
}

func TestReplayStopsWhenTheContextEnds(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = decisionlog.Replay(ctx, scripted{}, entries)
	require.ErrorIs(t, err, context.Canceled)
}

func TestFailOnRefusesWhatIsNoDirection(t *testing.T) {
	for _, p := range []string{"deny-approve", "approve-to-approve", "to-granted", "from-", "allowed-to-", "deny-to-approve,any", ""} {
		assert.Error(t, decisionlog.CheckFailOn(p), p)
	}
	for _, p := range []string{"allowed-to-refused", "refused-to-allowed", "pending-to-deny", "to-none", "approve-to-error", "reasons-changed"} {
		assert.NoError(t, decisionlog.CheckFailOn(p), p)
	}
	assert.Equal(t, []string{"deny-to-approve", "approve-to-deny", "refused-to-allowed", "approve-to-none", "deny-to-error"},
		decisionlog.SortedDirections(map[string]int{"deny-to-error": 1, "approve-to-none": 1, "refused-to-allowed": 1, "approve-to-deny": 1, "deny-to-approve": 1}))
	assert.Equal(t, "deny → approve", decisionlog.Arrow("deny-to-approve"))
}

func TestReadTellsNoDecisionFromAFailedOne(t *testing.T) {
	// OPA writes the error as text (console sink) or as an object with a code
	// (sdk.Error marshalled whole, as a custom decision-log plugin does).
	log := `{"msg":"Decision Log","decision_id":"a","path":"ichor/kubelet_serving/decision","error":"opa_undefined_error: ichor/kubelet_serving/decision decision was undefined"}
{"msg":"Decision Log","decision_id":"b","path":"ichor/kubelet_serving/decision","error":{"code":"opa_undefined_error","message":"ichor/kubelet_serving/decision decision was undefined"}}
{"msg":"Decision Log","decision_id":"c","path":"ichor/kubelet_serving/decision","error":{"code":"eval_conflict_error","message":"complete rules must not produce multiple outputs"}}
{"msg":"Decision Log","decision_id":"d","path":"ichor/credentials/requirements","result":{"event":{"type":"Normal"}}}
{"msg":"Decision Log","decision_id":"e","path":"ichor/kubelet_serving/decision","error":"eval_builtin_error: sprintf: node name opa_undefined_error: no"}
`
	entries, skipped, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	assert.Zero(t, skipped)
	require.Len(t, entries, 5)
	assert.Equal(t, "error", entries[4].Action(), "an error that quotes the undefined decision's code is no undefined decision")
	assert.Equal(t, "none", entries[0].Action())
	assert.Equal(t, "none", entries[1].Action())
	assert.Equal(t, "error", entries[2].Action())
	assert.Equal(t, "eval_conflict_error: complete rules must not produce multiple outputs", entries[2].Outcome().Error)
	assert.Equal(t, "", entries[3].Action(), "a rule that answers no action")
	assert.Equal(t, "requirements", entries[3].Policy())
	assert.True(t, entries[0].Timestamp.IsZero())
}

func TestAnIssuanceRefusalNamesItsRequesterAndReasons(t *testing.T) {
	log := `{"msg":"Decision Log","decision_id":"i","path":"ichor/credentials/issuance","input":{"request":{"name":"demo-x","purpose":"credentials-talos"},"requester":{"username":"ichor:mallory"},"admission":{"recorded":false,"verified":false}},"result":{"allowed":false,"purpose":"credentials-talos","reasons":[{"code":"NotAdmitted","message":"no admission of this request by Ichor's webhook is recorded"}]}}
`
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "issuance", entries[0].Policy())
	assert.Equal(t, "ichor:mallory", entries[0].User(), "the requester the issuer re-authorized")
	assert.Equal(t, []string{"NotAdmitted"}, entries[0].Codes())
	assert.Len(t, decisionlog.Filter(entries, decisionlog.Criteria{User: "ichor:mallory"}), 1, "ichor decisions list --user finds it")
}

func TestAnEntryWhoseInputTheLogCutIsNotReplayed(t *testing.T) {
	log := `{"msg":"Decision Log","decision_id":"cut","path":"ichor/kubelet_serving/decision","input":{"csr":{"signer_name":"kubernetes.io/kubelet-serving","request":{"subject_alt_names":[]}},"log_truncated":{"csr.request.subject_alt_names":10000}},"result":{"action":"deny","reasons":[{"code":"IPNotNode","message":"x"}]}}
`
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.True(t, entries[0].Truncated())
	e, err := engine.New(t.Context(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	rep, err := decisionlog.Replay(t.Context(), e, entries)
	require.NoError(t, err)
	assert.Zero(t, rep.Replayed, "a shortened list of names is not the request")
	require.Len(t, rep.Truncated, 1)
	assert.Empty(t, rep.Changes)
}

// The log cut only the result's reasons (a message quoting a tenant's long
// name, or more reasons than it keeps): the input is whole, and the entry
// is replayed (review 187: it was left out as cut, and a gate never saw it).
// Where only the first reasons were kept, what the log knows of them is
// compared, the first code and how many there were (review 255 F3: a
// candidate that changed the code named on the request was unchanged).
func TestAnEntryWhoseReasonsTheLogCutIsReplayed(t *testing.T) {
	e, err := engine.New(t.Context(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	// A denial of several reasons: addresses that are not the node's.
	raw, err := json.Marshal(serving(t, "worker-1", talos("worker-1", "10.5.0.9"), "10.5.0.2", "10.5.0.3", "10.5.0.4"))
	require.NoError(t, err)
	var input map[string]any
	require.NoError(t, json.Unmarshal(raw, &input))
	d, err := e.Decide(t.Context(), "ichor/kubelet_serving/decision", input)
	require.NoError(t, err)
	codes := d.Outcome().Reasons.Codes()
	require.Greater(t, len(codes), 1, "the denial has one reason: %v", codes)
	// The verdict as the rule gives it, logged with its first reason
	// alone (its message cut), the code given, of as many as said.
	entry := func(id, action, code string, reasons int) string {
		var result map[string]any
		require.NoError(t, json.Unmarshal(d.Result, &result))
		result["action"] = action
		result["reasons"] = []any{map[string]any{"code": code, "message": "m... (600 bytes)"}}
		input["log_truncated"] = map[string]any{"result.reasons": reasons}
		in, err := json.Marshal(input)
		require.NoError(t, err)
		out, err := json.Marshal(result)
		require.NoError(t, err)
		return fmt.Sprintf(`{"msg":"Decision Log","decision_id":%q,"path":"ichor/kubelet_serving/decision","input":%s,"result":%s}`+"\n", id, in, out)
	}
	log := entry("messages-cut", "approve", codes[0], 1) + // the codes all there, and compared: one
		entry("first-kept", "deny", codes[0], len(codes)) + // the first kept, of as many: unchanged
		entry("first-changed", "deny", "Other", len(codes)) +
		entry("count-changed", "deny", codes[0], 60)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	require.Len(t, entries, 4)
	assert.False(t, entries[0].Truncated())
	rep, err := decisionlog.Replay(t.Context(), e, entries)
	require.NoError(t, err)
	assert.Empty(t, rep.Truncated)
	assert.Equal(t, 4, rep.Replayed)
	assert.Equal(t, map[string]int{"approve-to-deny": 1}, rep.Directions)
	assert.Equal(t, 1, rep.Unchanged, "the first code and the count of a log that kept the first of them")
	assert.Equal(t, map[string]int{decisionlog.NoteReasonsChanged: 2}, rep.Notes)
	var changed []string
	for _, c := range rep.Changes {
		if c.Note == decisionlog.NoteReasonsChanged {
			changed = append(changed, c.Entry.DecisionID)
		}
	}
	assert.ElementsMatch(t, []string{"first-changed", "count-changed"}, changed)
}

func TestOnlyTheAppliedVerdictOfAConflictedRequestIsInEffect(t *testing.T) {
	log := `{"msg":"Decision Log","decision_id":"first","path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"csr-1"}},"result":{"action":"approve","reasons":[{"code":"IchorKubeletServing","message":"m"}]}}
{"msg":"Decision Log","decision_id":"second","path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"csr-1"}},"result":{"action":"approve","reasons":[{"code":"IchorKubeletServing","message":"m"}]}}
{"msg":"Decision Log","decision_id":"rec","path":"system/applied/record","input":{"decision_id":"second","object":"csr/csr-1","action":"approve"},"result":{"applied":"second"}}
{"msg":"Decision Log","decision_id":"old","path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"csr-2"}},"result":{"action":"deny","reasons":[{"code":"IPNotNode","message":"m"}]}}
{"msg":"Decision Log","decision_id":"wait","path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"csr-1"}},"result":{"action":"pending","reasons":[{"code":"NodeUnreadable","message":"m"}]}}
`
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	var ids []string
	for _, e := range decisionlog.InEffect(entries) {
		ids = append(ids, e.DecisionID)
	}
	// The first approval was never written; csr-2's verdict has no record
	// (an older manager) and stays; pending writes nothing and stays.
	assert.Equal(t, []string{"second", "old", "wait"}, ids)
}

// A record applies the decision it names only on the object that decision
// was about (review 177 F2): a replica taking a cluster over records the
// decision a request's condition names, and on a tenant's own cluster the
// tenant may write that condition, naming a decision about another request.
func TestARecordNamingADecisionAboutAnotherRequestAppliesNothing(t *testing.T) {
	// The requesting user's uid is not the object's: a kubelet's is empty.
	const verdict = `{"msg":"Decision Log","decision_id":"%s","path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"%s","uid":"","object_uid":"%s"}},"result":{"action":"%s","reasons":[{"code":"C","message":"m"}]}}` + "\n"
	const record = `{"msg":"Decision Log","decision_id":"r-%s","path":"system/applied/record","input":{"decision_id":"%s","object":"csr/%s","uid":"%s","action":"%s","outcome":"%s","adopted":%t}}` + "\n"
	var log strings.Builder
	// csr-2: denied, the write conflicted, approved and applied.
	fmt.Fprintf(&log, verdict, "c2-deny", "csr-2", "u2", "deny")
	fmt.Fprintf(&log, verdict, "c2-approve", "csr-2", "u2", "approve")
	fmt.Fprintf(&log, record, "1", "c2-approve", "csr-2", "u2", "approve", "written", false)
	// csr-3: denied; its condition, written by the tenant, names csr-2's
	// verdict never applied, and a replica taking the cluster over
	// records it.
	fmt.Fprintf(&log, verdict, "c3-deny", "csr-3", "u3", "deny")
	fmt.Fprintf(&log, record, "2", "c2-deny", "csr-3", "u3", "deny", "observed", true)
	// The same decision named with the right object but another request's
	// UID (csr-2 deleted and made again under its name) applies nothing
	// either.
	fmt.Fprintf(&log, record, "3", "c2-deny", "csr-2", "u9", "deny", "observed", true)
	// csr-4: a take-over's record of a decision the log does not hold (a
	// name made up) applies nothing (review 188): the verdict stays.
	fmt.Fprintf(&log, verdict, "c4-deny", "csr-4", "u4", "deny")
	fmt.Fprintf(&log, record, "4", "made-up", "csr-4", "u4", "approve", "observed", true)
	// csr-5: the manager's record of its own write names its own decision,
	// which the log read may not hold (the window began after it, or its
	// replica's log was not read): it applies, and the verdict never
	// applied goes (review 190).
	fmt.Fprintf(&log, verdict, "c5-deny", "csr-5", "u5", "deny")
	fmt.Fprintf(&log, record, "5", "before-the-window", "csr-5", "u5", "approve", "written", false)
	// csr-6: a record of the release before, which did not say whether it
	// was a take-over's, that says observed may be one: it applies only a
	// decision the log holds (review 192).
	fmt.Fprintf(&log, verdict, "c6-deny", "csr-6", "u6", "deny")
	log.WriteString(`{"msg":"Decision Log","decision_id":"r-6","path":"system/applied/record","input":{"decision_id":"made-up-6","object":"csr/csr-6","uid":"u6","action":"approve","outcome":"observed"}}` + "\n")

	entries, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	var ids []string
	for _, e := range decisionlog.InEffect(entries) {
		ids = append(ids, e.DecisionID)
	}
	assert.Equal(t, []string{"c2-approve", "c3-deny", "c4-deny", "c6-deny"}, ids)
}

// A decision and the record of it, each as the manager writes them from one
// CSR object, are matched by the object's UID, not the requesting user's
// (review 188: the decision logged spec.uid, the record metadata.uid, so a
// record of a CSR deleted and made again under its name applied to the new
// one). A CSR made by a user with a UID (a service account) has its record
// matched too.
func TestARecordIsMatchedByTheRequestObjectsUID(t *testing.T) {
	ctx := context.Background()
	log := &harness.DecisionLog{}
	e, err := engine.New(ctx, engine.Options{DecisionLog: log, ID: "test"})
	require.NoError(t, err)
	defer e.Stop(ctx)
	object := func(uid types.UID, ip string) *certificatesv1.CertificateSigningRequest {
		pemBytes, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP(ip)}})
		require.NoError(t, err)
		csr := csrgen.ServingObject("csr-worker-1", "worker-1", pemBytes)
		csr.UID, csr.Spec.UID = uid, "the-requesting-users-uid"
		return csr
	}
	decide := func(csr *certificatesv1.CertificateSigningRequest) string {
		d, err := e.KubeletServing(ctx, csrinput.KubeletServing{CSR: csrinput.Build(csr),
			Machine: &csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"}, Node: talos("worker-1", "10.5.0.2")})
		require.NoError(t, err)
		return d.DecisionID
	}
	record := func(id string, csr *certificatesv1.CertificateSigningRequest) {
		require.NoError(t, e.RecordApplied(ctx, engine.Applied{DecisionID: id, Object: "csr/" + csr.Name, UID: string(csr.UID),
			Action: engine.ActionApprove, Outcome: engine.AppliedObserved}))
	}
	// The first object: decided twice (the first write conflicted), the
	// second applied.
	first := object("object-1", "10.5.0.2")
	never, applied := decide(first), decide(first)
	record(applied, first)
	// Deleted and made again under its name: denied, never written; its
	// condition names the first object's applied decision, recorded at a
	// take-over.
	second := object("object-2", "10.5.0.9")
	denied := decide(second)
	record(applied, second)

	entries, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	var ids []string
	for _, e := range decisionlog.InEffect(entries) {
		ids = append(ids, e.DecisionID)
	}
	assert.Equal(t, []string{applied, denied}, ids, "never applied: %s", never)
}

// An issuer whose answer's write failed decides again: the verdict never
// stored is not in effect beside the one stored and recorded, and the
// webhook's admission of the same request, which the issuer's record does
// not apply, stays (review 187).
func TestAnIssuanceNeverStoredIsNotInEffect(t *testing.T) {
	const issuance = `{"msg":"Decision Log","decision_id":%q,"path":"ichor/credentials/issuance","input":{"request":{"name":%q,"namespace":"team-a","uid":%q,"purpose":"kubeconfig-admin"},"requester":{"username":"ichor:ada"}},"result":{"allowed":%t,"purpose":"kubeconfig-admin","reasons":[{"code":"C","message":"m"}]}}` + "\n"
	const record = `{"msg":"Decision Log","decision_id":"r-%s","path":"system/applied/record","input":{"decision_id":%q,"object":"taloscredentialrequest/team-a/%s","uid":%q,"action":"Issued","outcome":"written"}}` + "\n"
	var log strings.Builder
	log.WriteString(`{"msg":"Decision Log","decision_id":"adm","path":"ichor/credentials/admission","input":{"request":{"name":"demo-x","namespace":"team-a","uid":"u1","purpose":"kubeconfig-admin"}},"result":{"allowed":true,"reasons":[{"code":"C","message":"m"}]}}` + "\n")
	fmt.Fprintf(&log, issuance, "refused-first", "demo-x", "u1", false)
	fmt.Fprintf(&log, issuance, "issued", "demo-x", "u1", true)
	fmt.Fprintf(&log, record, "x", "issued", "demo-x", "u1")
	// An issuance never stored stays: it may have made the person's admin
	// binding, which the next one reused and which is in effect (review
	// 188).
	fmt.Fprintf(&log, issuance, "allowed-first", "demo-y", "u2", true)
	fmt.Fprintf(&log, issuance, "issued-again", "demo-y", "u2", true)
	fmt.Fprintf(&log, record, "y", "issued-again", "demo-y", "u2")
	entries, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, entries, 7)
	assert.Equal(t, decisionlog.ActionRefused, entries[1].Action())
	var ids []string
	for _, e := range decisionlog.InEffect(entries) {
		ids = append(ids, e.DecisionID)
	}
	assert.Equal(t, []string{"adm", "issued", "allowed-first", "issued-again"}, ids)
}

// A log holds the records that a decision was carried out in the shapes they
// have had: the plain entry (its facts as input, no result), the former
// record rule's entry (the same facts as input, repeated as its result,
// without the object's uid or the write's outcome), and that rule's entry
// from a bundle without the rule (undefined: input, no result, an error).
// Each is read as a record of its decision, and applies it.
func TestEveryShapeOfTheAppliedRecordIsRead(t *testing.T) {
	const verdict = `{"msg":"Decision Log","decision_id":"%s","path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"%s"}},"result":{"action":"approve","reasons":[{"code":"IchorKubeletServing","message":"m"}]}}` + "\n"
	var log strings.Builder
	for _, v := range [][2]string{{"a1", "csr-a"}, {"a2", "csr-a"}, {"b1", "csr-b"}, {"b2", "csr-b"}, {"c1", "csr-c"}, {"c2", "csr-c"}, {"d1", "csr-d"}} {
		fmt.Fprintf(&log, verdict, v[0], v[1])
	}
	// The plain entry, as RecordApplied writes it.
	log.WriteString(`{"bundles":{"ichor":{"revision":"sha256:4181216f15935cd2"}},"decision_id":"886eb44f-79fa-41b2-bec4-b85f0c4f3ce0","input":{"decision_id":"a2","object":"csr/csr-a","uid":"6f1c0d3e","action":"approve","outcome":"written"},"labels":{"app":"ichor-policy","id":"test"},"level":"info","msg":"Decision Log","path":"system/applied/record","time":"2026-12-01T20:38:57Z","timestamp":"2026-12-01T20:38:57.35224584Z","type":"openpolicyagent.org/decision_logs"}` + "\n")
	// The former rule's entry, as a manager before it wrote it.
	log.WriteString(`{"bundles":{"ichor":{"revision":"sha256:87e213ffe5220c35"}},"decision_id":"0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6","input":{"action":"approve","decision_id":"b2","object":"csr/csr-b"},"labels":{"app":"ichor-policy","id":"test"},"level":"info","msg":"Decision Log","path":"system/applied/record","result":{"action":"approve","applied":"b2","object":"csr/csr-b"},"time":"2026-11-29T13:08:07Z","timestamp":"2026-11-29T13:08:07.004514004Z","type":"openpolicyagent.org/decision_logs"}` + "\n")
	// The former rule undefined: a bundle without it.
	log.WriteString(`{"decision_id":"1e2f3a4b-5c6d-4e7f-8091-a2b3c4d5e6f7","error":{"code":"opa_undefined_error","message":"system/applied/record decision was undefined"},"input":{"action":"approve","decision_id":"c1","object":"csr/csr-c"},"labels":{"app":"ichor-policy","id":"test"},"msg":"Decision Log","path":"system/applied/record","timestamp":"2026-11-29T13:08:08Z","type":"openpolicyagent.org/decision_logs"}` + "\n")
	// A record that names no decision applies none: csr-d keeps its verdict.
	log.WriteString(`{"decision_id":"2f3a4b5c-6d7e-4f80-91a2-b3c4d5e6f708","input":{"decision_id":"","object":"csr/csr-d","uid":"","action":"approve","outcome":"observed"},"labels":{"app":"ichor-policy"},"msg":"Decision Log","path":"system/applied/record","timestamp":"2026-12-01T20:39:00Z","type":"openpolicyagent.org/decision_logs"}` + "\n")

	entries, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, entries, 11)
	var records []engine.Applied
	for _, e := range entries {
		if a, ok := e.Applied(); ok {
			records = append(records, a)
			assert.Equal(t, engine.ActionApprove, e.Action(), "a record's action is the one it records")
		}
	}
	assert.Equal(t, []engine.Applied{
		{DecisionID: "a2", Object: "csr/csr-a", UID: "6f1c0d3e", Action: "approve", Outcome: engine.AppliedWritten},
		{DecisionID: "b2", Object: "csr/csr-b", Action: "approve"},
		{DecisionID: "c1", Object: "csr/csr-c", Action: "approve"},
		{Object: "csr/csr-d", Action: "approve", Outcome: engine.AppliedObserved},
	}, records)
	var ids []string
	for _, e := range decisionlog.InEffect(entries) {
		ids = append(ids, e.DecisionID)
	}
	assert.Equal(t, []string{"a2", "b2", "c1", "d1"}, ids)
	assert.Len(t, decisionlog.Verdicts(entries), 7, "the records are not verdicts, whatever their shape")
}

// uploadedLog runs the engine on the inputs of realLog with both sinks on:
// its console lines, and the bodies its upload sink sent to a decision-log
// service (gzipped JSON arrays of OPA's events), as the service received them.
func uploadedLog(t *testing.T) (console string, bodies [][]byte) {
	t.Helper()
	ctx := context.Background()
	log := &harness.DecisionLog{}
	svc := &harness.LogService{}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	e, err := engine.New(ctx, engine.Options{DecisionLog: log, ID: "test", DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true})
	require.NoError(t, err)
	for _, in := range []csrinput.KubeletServing{
		serving(t, "worker-1", talos("worker-1", "10.5.0.2"), "10.5.0.2"),
		serving(t, "worker-1", talos("worker-1", "10.5.0.2"), "10.5.0.3"),
		serving(t, "worker-3", nil, "10.5.0.4"),
	} {
		_, err := e.KubeletServing(ctx, in)
		require.NoError(t, err)
	}
	_, err = e.Decide(ctx, decisionlog.PathAdmission, harness.AdmissionInput("ichor:bob", false))
	require.NoError(t, err)
	// A deadline makes Stop send what the upload sink holds.
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.Stop(stop)
	require.Equal(t, 4, svc.Received())
	return log.String(), svc.Bodies()
}

func gunzip(t *testing.T, body []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	require.NoError(t, err)
	out, err := io.ReadAll(zr)
	require.NoError(t, err)
	return out
}

// same is what an entry says, whichever shape it was read from.
func same(e decisionlog.Entry) []any {
	return []any{e.DecisionID, e.Path, string(e.Input), string(e.Result), e.Revision, e.Timestamp.UnixNano(), e.Labels, e.Action(), e.Codes(), e.Node(), e.User()}
}

func TestReadReadsWhatADecisionLogServiceStores(t *testing.T) {
	console, bodies := uploadedLog(t)
	want, skipped, err := decisionlog.Read(strings.NewReader(console))
	require.NoError(t, err)
	require.Zero(t, skipped)
	require.Len(t, want, 4)

	var gzipped, arrays, events, indented bytes.Buffer
	for _, b := range bodies {
		// Concatenated gzip streams are one gzip stream of several members,
		// as `cat *.json.gz` makes.
		gzipped.Write(b)
		plain := gunzip(t, b)
		arrays.Write(plain)
		arrays.WriteByte('\n')
		var items []json.RawMessage
		require.NoError(t, json.Unmarshal(plain, &items))
		for _, item := range items {
			events.Write(item)
			events.WriteByte('\n')
		}
		require.NoError(t, json.Indent(&indented, plain, "", "  "))
	}
	for name, input := range map[string][]byte{
		"the upload bodies, gzipped":               gzipped.Bytes(),
		"the bodies, one a line":                   arrays.Bytes(),
		"the events, one a line":                   events.Bytes(),
		"the bodies as one document, indented":     indented.Bytes(),
		"the bodies run together on a line":        bytes.ReplaceAll(arrays.Bytes(), []byte("\n"), nil),
		"the events among other lines":             []byte(interleave(events.String())),
		"the console log, gzipped (a rotated log)": gzipBytes(t, []byte(interleave(console))),
	} {
		t.Run(name, func(t *testing.T) {
			got, _, err := decisionlog.Read(bytes.NewReader(input))
			require.NoError(t, err)
			require.Len(t, got, len(want))
			for i := range want {
				assert.Equal(t, same(want[i]), same(got[i]))
			}
		})
	}
}

func gzipBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return out.Bytes()
}

func TestReadRefusesAnInputThatIsNotTheShapeItAnnounces(t *testing.T) {
	_, bodies := uploadedLog(t)
	for name, input := range map[string][]byte{
		"a gzip stream cut short":          bodies[0][:len(bodies[0])/2],
		"a gzip header and nothing else":   {0x1f, 0x8b},
		"a JSON document that breaks down": append(gunzip(t, bodies[0]), []byte(`[{"decision_id": `)...),
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := decisionlog.Read(bytes.NewReader(input))
			require.ErrorIs(t, err, decisionlog.ErrFormat)
		})
	}
}

func TestACandidateThatReadsTheClockIsNotReplayed(t *testing.T) {
	def, err := bundles.Default()
	require.NoError(t, err)
	require.NoError(t, decisionlog.CheckReplayable(def), "the rules shipped replay exactly")

	// The kubelet-serving rule, with a deny that reads the clock.
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../../policy")))
	rule := filepath.Join(dir, "ichor", "kubelet_serving", "clock.rego")
	require.NoError(t, os.WriteFile(rule, []byte(`package ichor.kubelet_serving

deny contains {"code": "AfterHours", "message": "no certificates at night"} if {
	[hour, _, _] := time.clock(time.now_ns())
	hour < 6
}
`), 0o600))
	candidate, err := bundles.FromDir(dir)
	require.NoError(t, err)

	err = decisionlog.CheckReplayable(candidate)

	require.Error(t, err)
	assert.Contains(t, err.Error(), "the candidate calls time.now_ns (")
	assert.Contains(t, err.Error(), "clock.rego:4)")
	assert.Contains(t, err.Error(), "non-deterministic")
}

// Builtins that OPA does not mark non-deterministic but that read the clock
// (x509 chains verified at the time of the call), and a refused builtin put
// in another function's place by `with`, are refused too (review of
// 2026-12-05): a certificate in the bundle's data that expires next month
// turns the verdict then, and a replay today would report no change.
func TestACandidateThatReadsTheClockThroughAnotherBuiltinIsNotReplayed(t *testing.T) {
	for name, rule := range map[string]string{
		"crypto.x509.parse_and_verify_certificates": `[ok, _] := crypto.x509.parse_and_verify_certificates(input.csr.pem)
	not ok`,
		"crypto.x509.parse_and_verify_certificates_with_options": `[ok, _] := crypto.x509.parse_and_verify_certificates_with_options(input.csr.pem, {})
	not ok`,
		"rand.intn": `_pick("x", 10) > 5 with _pick as rand.intn`,
		// A `with` whose target is refused (a common test mock) ended
		// OPA's compilation early and hid every other call (review of
		// 2026-12-05).
		"net.lookup_ip_addr": `count(net.lookup_ip_addr(sprintf("%s.example.invalid", [input.csr.name]))) > 0
	x := 1 with time.now_ns as 0
	x == 1`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS("../../policy")))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "ichor", "kubelet_serving", "clock.rego"), []byte(`package ichor.kubelet_serving

deny contains {"code": "Expired", "message": "expired"} if {
	`+rule+`
}

_pick(_, _) := 0
`), 0o600))
			candidate, err := bundles.FromDir(dir)
			require.NoError(t, err)

			err = decisionlog.CheckReplayable(candidate)

			require.Error(t, err)
			assert.Contains(t, err.Error(), "the candidate calls "+name+" (")
		})
	}
}

// The review of 2026-12-05: the engine reads a candidate file again as it
// polls, so a file replaced during a long replay had its later decisions
// replayed against another bundle, the report naming the first. A replay
// that meets a second revision stops.
func TestAReplayThatMeetsASecondRevisionStops(t *testing.T) {
	log, _ := realLog(t)
	entries, _, err := decisionlog.Read(strings.NewReader(log))
	require.NoError(t, err)
	entries = []decisionlog.Entry{entries[0], entries[1]}
	revisions := []string{"sha256:first", "sha256:swapped"}
	_, err = decisionlog.Replay(context.Background(), scripted{
		decisionlog.PathKubeletServing: func() (engine.Decision, error) {
			rev := revisions[0]
			revisions = revisions[1:]
			return engine.Decision{Revision: rev, Result: json.RawMessage(`{"action":"approve","reasons":[]}`)}, nil
		},
	}, entries)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was replayed against revision sha256:swapped, the ones before it against sha256:first")
}
