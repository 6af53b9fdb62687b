package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
)

// withRecords is the fixture's log as a manager writes it: csr-worker-1 was
// decided twice (approve, whose write conflicted, then deny, applied) and
// csr-worker-2 once (approve, applied), each applied verdict followed by its
// record (system/applied/record).
func (f decisionsFixture) withRecords(t *testing.T) string {
	t.Helper()
	sink := &decisionsSink{}
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: sink, ID: "test"})
	require.NoError(t, err)
	require.NoError(t, e.RecordApplied(context.Background(), written(f.deny, "csr/csr-worker-1", engine.ActionDeny)))
	require.NoError(t, e.RecordApplied(context.Background(), written(f.two, "csr/csr-worker-2", engine.ActionApprove)))
	e.Stop(context.Background())
	return f.log + sink.buf.String()
}

// written is the record of a verdict the manager wrote on the object.
func written(decisionID, object, action string) engine.Applied {
	return engine.Applied{DecisionID: decisionID, Object: object, UID: "uid-" + object, Action: action, Outcome: engine.AppliedWritten}
}

// TestDecisionsReplayCountsWhatListLists: list shows the three verdicts in
// effect; replay replays those three, not the two records nor the verdict
// that was never applied, and says how many it left out of each. --all
// replays the unapplied verdict too, never a record.
func TestDecisionsReplayCountsWhatListLists(t *testing.T) {
	f := newDecisionsFixture(t)
	log := f.file(t, f.withRecords(t))

	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", log)
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{f.deny, f.pending, f.two}, column(t, stdout, "ID"))
	// Read from kubectl's logs, the count says which entries are records.
	_, _, stderr, _ = decisionsRun(t, "", "decisions", "list", f.file(t, "not an entry\n"+f.withRecords(t)))
	assert.Equal(t, "ichor: read 4 decisions and 2 records of applied verdicts; skipped 1 line that is not a decision-log entry\n", stderr)

	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log)
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Replayed 3 decisions logged under ")
	assert.Regexp(t, `(?m)^unchanged\s+3$`, stdout)
	assert.Regexp(t, `(?m)^not replayed: verdicts never applied \(--all replays them\)\s+1$`, stdout)
	assert.Regexp(t, `(?m)^not replayed: records of applied verdicts \(not decisions\)\s+2$`, stdout)

	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log, "--all")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Replayed 4 decisions logged under ")
	assert.NotContains(t, stdout, "verdicts never applied")
	assert.Regexp(t, `(?m)^not replayed: records of applied verdicts \(not decisions\)\s+2$`, stdout)

	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log, "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var rep struct {
		Replayed    int
		Unchanged   int
		NotReplayed notReplayed `json:"not_replayed"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.Equal(t, 3, rep.Replayed)
	assert.Equal(t, 3, rep.Unchanged)
	assert.Equal(t, notReplayed{Records: 2, NeverApplied: 1}, rep.NotReplayed)

	// A log of records alone has no decision to replay.
	sink := &decisionsSink{}
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: sink, ID: "test"})
	require.NoError(t, err)
	require.NoError(t, e.RecordApplied(context.Background(), written(f.two, "csr/csr-worker-2", engine.ActionApprove)))
	e.Stop(context.Background())
	code, _, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", f.file(t, sink.buf.String()))
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "no decision read: read only 1 record of an applied verdict")
}

// formerRecords rewrites the plain records of a log into the shape the
// former record rule (policy/system/applied) gave them: the facts as input
// without the object's uid or the write's outcome, repeated as the result.
func formerRecords(t *testing.T, log string) string {
	t.Helper()
	var out strings.Builder
	for line := range strings.Lines(log) {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil || entry["path"] != engine.PathApplied {
			out.WriteString(line)
			continue
		}
		in := entry["input"].(map[string]any)
		delete(in, "uid")
		delete(in, "outcome")
		entry["result"] = map[string]any{"applied": in["decision_id"], "object": in["object"], "action": in["action"]}
		b, err := json.Marshal(entry)
		require.NoError(t, err)
		out.Write(append(b, '\n'))
	}
	return out.String()
}

// A log written before the records became plain entries is read as it was:
// list and replay count and leave out its records and its never-applied
// verdict exactly as they do a new log's.
func TestDecisionsListAndReplayReadTheFormerRecords(t *testing.T) {
	f := newDecisionsFixture(t)
	current := f.withRecords(t)
	former := formerRecords(t, current)
	require.NotEqual(t, current, former)
	require.Equal(t, 2, strings.Count(former, `"applied":`), "two records in the former shape")

	for name, log := range map[string]string{"current": current, "former": former} {
		t.Run(name, func(t *testing.T) {
			file := f.file(t, log)
			code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", file)
			require.Equal(t, ExitOK, code, stderr)
			assert.Equal(t, []string{f.deny, f.pending, f.two}, column(t, stdout, "ID"))
			code, stdout, _, _ = decisionsRun(t, "", "decisions", "list", "--all", file, "-o", "wide")
			require.Equal(t, ExitOK, code)
			assert.Len(t, column(t, stdout, "ID"), 6, "the four verdicts and the two records")

			code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", file, "-o", "json")
			require.Equal(t, ExitOK, code, stderr)
			var rep struct {
				Replayed    int
				NotReplayed notReplayed `json:"not_replayed"`
			}
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
			assert.Equal(t, 3, rep.Replayed)
			assert.Equal(t, notReplayed{Records: 2, NeverApplied: 1}, rep.NotReplayed)
		})
	}
}
