package cli

// These tests are in package cli, not cli_test, to see the error a command
// returns and the exit status it asks for (ExitChanged), besides what Run
// returns.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// decisionsRun executes the ichor command line in-process and returns what
// Run returns, what was printed, and the error the command returned.
func decisionsRun(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)

	// The same command again, for the error itself.
	root := newRoot(strings.NewReader(stdin), &bytes.Buffer{}, &bytes.Buffer{})
	root.SetArgs(args)
	err = root.ExecuteContext(context.Background())
	return code, out.String(), errOut.String(), err
}

// listItems are the items of the v1 List a command printed with -o json.
func listItems[T any](t *testing.T, stdout string) []T {
	t.Helper()
	var list struct {
		APIVersion, Kind string
		Items            []T
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	assert.Equal(t, "v1/List", list.APIVersion+"/"+list.Kind)
	return list.Items
}

type decisionsSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *decisionsSink) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// decisionsFixture is a real decision log, written by the engine with the
// embedded bundle: its console sink's lines (log), and the same decisions as
// its upload sink sent them to a decision-log service (uploads, the bodies
// as received: gzipped JSON arrays of OPA's events).
type decisionsFixture struct {
	log                         string
	uploads                     [][]byte
	approve, deny, pending, two string // the decision ids
	revision                    string
}

func servingRequest(t *testing.T, node string, talos []string, ips ...string) csrinput.KubeletServing {
	t.Helper()
	r := csrgen.Request{Subject: csrgen.NodeSubject(node), DNSNames: []string{node}}
	for _, ip := range ips {
		r.IPs = append(r.IPs, net.ParseIP(ip))
	}
	pemBytes, err := csrgen.PEM(r)
	require.NoError(t, err)
	in := csrinput.KubeletServing{CSR: csrinput.Build(csrgen.ServingObject("csr-"+node, node, pemBytes))}
	if talos != nil {
		in.Machine = &csrinput.Machine{Name: node, Namespace: "default", Cluster: "demo"}
		in.Node = &csrinput.Node{Readable: true, Nodename: node, Hostname: node, Addresses: talos}
	}
	return in
}

// newDecisionsFixture decides, with the engine: worker-1 asking for its own
// IP (approve), worker-1 asking for worker-2's IP (deny), worker-3 that no
// machine has (pending), worker-2 asking for its own IP (approve).
func newDecisionsFixture(t *testing.T) decisionsFixture {
	t.Helper()
	ctx := context.Background()
	sink := &decisionsSink{}
	svc := &harness.LogService{}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	e, err := engine.New(ctx, engine.Options{DecisionLog: sink, ID: "test", DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true})
	require.NoError(t, err)
	var ds []engine.CSRDecision
	for _, in := range []csrinput.KubeletServing{
		servingRequest(t, "worker-1", []string{"10.5.0.2"}, "10.5.0.2"),
		servingRequest(t, "worker-1", []string{"10.5.0.2"}, "10.5.0.3"),
		servingRequest(t, "worker-3", nil, "10.5.0.4"),
		servingRequest(t, "worker-2", []string{"10.5.0.3"}, "10.5.0.3"),
	} {
		d, err := e.KubeletServing(ctx, in)
		require.NoError(t, err)
		ds = append(ds, d)
	}
	require.Equal(t, []string{"approve", "deny", "pending", "approve"}, []string{ds[0].Action, ds[1].Action, ds[2].Action, ds[3].Action})
	// Stopping with a deadline sends what the upload sink holds.
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.Stop(stop)
	require.Equal(t, 4, svc.Received(), "the service received every decision")
	return decisionsFixture{
		log: sink.buf.String(), uploads: svc.Bodies(), revision: ds[0].Revision,
		approve: ds[0].DecisionID, deny: ds[1].DecisionID, pending: ds[2].DecisionID, two: ds[3].DecisionID,
	}
}

// kubectlLogs is the log as kubectl logs shows it: the decisions among the
// manager's and OPA's own lines.
func (f decisionsFixture) kubectlLogs() string {
	lines := strings.Split(strings.TrimSpace(f.log), "\n")
	return `{"level":"info","ts":1777636800,"logger":"manager","msg":"starting","bundle":""}` + "\n" +
		lines[0] + "\n" +
		"I0501 12:00:01.000000       1 leaderelection.go:257] attempting to acquire leader lease\n" +
		lines[1] + "\n" +
		`{"level":"info","ts":1777636801,"msg":"denied kubelet serving certificate","csr":"csr-worker-1","decision_id":"x"}` + "\n" +
		strings.Join(lines[2:], "\n") + "\n"
}

func (f decisionsFixture) file(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "decisions.log")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// column returns the value of one column of every row of a table.
func column(t *testing.T, table, name string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	header := regexp.MustCompile(`\S+`).FindAllStringIndex(lines[0], -1)
	idx := -1
	for i, h := range header {
		if lines[0][h[0]:h[1]] == name {
			idx = i
		}
	}
	require.GreaterOrEqual(t, idx, 0, "no column %s in %q", name, lines[0])
	var out []string
	for _, l := range lines[1:] {
		out = append(out, strings.Fields(l)[idx])
	}
	return out
}

func TestDecisionsListShowsEveryDecisionInLogOrder(t *testing.T) {
	f := newDecisionsFixture(t)

	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", f.file(t, f.kubectlLogs()))

	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "ichor: read 4 decisions; skipped 3 lines that are not decision-log entries\n", stderr)
	assert.Regexp(t, `^TIME\s+ID\s+POLICY\s+ACTION\s+NODE/USER\s+CODES\s+REVISION\n`, stdout)
	assert.Equal(t, []string{f.approve, f.deny, f.pending, f.two}, column(t, stdout, "ID"))
	assert.Equal(t, []string{"approve", "deny", "pending", "approve"}, column(t, stdout, "ACTION"))
	assert.Equal(t, []string{"worker-1", "worker-1", "worker-3", "worker-2"}, column(t, stdout, "NODE/USER"))
	assert.Equal(t, []string{"IchorKubeletServing", "IPNotNode", "MachineUnknown", "IchorKubeletServing"}, column(t, stdout, "CODES"))
	assert.Equal(t, []string{"kubelet-serving", "kubelet-serving", "kubelet-serving", "kubelet-serving"}, column(t, stdout, "POLICY"))
	assert.Equal(t, []string{f.revision, f.revision, f.revision, f.revision}, column(t, stdout, "REVISION"))
	for _, ts := range column(t, stdout, "TIME") {
		at, err := time.Parse(time.RFC3339, ts)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), at, time.Minute)
	}
}

func TestDecisionsListFilters(t *testing.T) {
	f := newDecisionsFixture(t)
	log := f.file(t, f.log)
	// The time of the pending decision: --since it keeps it and what follows.
	var third map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.Split(f.log, "\n")[2]), &third))
	since := third["timestamp"].(string)

	for _, tc := range []struct {
		name  string
		flags []string
		want  []string
	}{
		{"no filter", nil, []string{f.approve, f.deny, f.pending, f.two}},
		{"policy by name", []string{"--policy", "kubelet-serving"}, []string{f.approve, f.deny, f.pending, f.two}},
		{"policy by path", []string{"--policy", "ichor/kubelet_serving/decision"}, []string{f.approve, f.deny, f.pending, f.two}},
		{"another policy", []string{"--policy", "admission"}, nil},
		{"approve", []string{"--action", "approve"}, []string{f.approve, f.two}},
		{"deny", []string{"--action", "deny"}, []string{f.deny}},
		{"pending", []string{"--action", "pending"}, []string{f.pending}},
		{"refused", []string{"--action", "refused"}, nil},
		{"node", []string{"--node", "worker-2"}, []string{f.two}},
		{"user", []string{"--user", "system:node:worker-1"}, []string{f.approve, f.deny}},
		{"since a duration", []string{"--since", "1h"}, []string{f.approve, f.deny, f.pending, f.two}},
		{"since days", []string{"--since", "30d"}, []string{f.approve, f.deny, f.pending, f.two}},
		{"since days and hours", []string{"--since", "1d12h"}, []string{f.approve, f.deny, f.pending, f.two}},
		{"since a time", []string{"--since", since}, []string{f.pending, f.two}},
		{"since the future", []string{"--since", time.Now().Add(time.Hour).Format(time.RFC3339)}, nil},
		{"revision", []string{"--revision", f.revision}, []string{f.approve, f.deny, f.pending, f.two}},
		{"revision prefix", []string{"--revision", f.revision[:10]}, []string{f.approve, f.deny, f.pending, f.two}},
		{"another revision", []string{"--revision", "sha256:0000000000000000"}, nil},
		{"combined", []string{"--node", "worker-1", "--action", "deny", "--since", "1h"}, []string{f.deny}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr, _ := decisionsRun(t, "", append([]string{"decisions", "list", log, "-o", "json"}, tc.flags...)...)
			require.Equal(t, ExitOK, code, stderr)
			var got []string
			for _, rec := range listItems[struct{ ID string }](t, stdout) {
				got = append(got, rec.ID)
			}
			assert.Equal(t, tc.want, got)

			code, stdout, stderr, _ = decisionsRun(t, "", append([]string{"decisions", "list", log}, tc.flags...)...)
			require.Equal(t, ExitOK, code, stderr)
			if tc.want == nil {
				assert.Empty(t, stdout)
				assert.Contains(t, stderr, "no decision matches (of 4 read)")
			} else {
				assert.Equal(t, tc.want, column(t, stdout, "ID"))
			}
		})
	}
}

func TestDecisionsListJSONCarriesTheFieldsAndTheEntry(t *testing.T) {
	f := newDecisionsFixture(t)

	code, stdout, stderr, _ := decisionsRun(t, f.log, "decisions", "list", "-", "--action", "deny", "-o", "json")

	require.Equal(t, ExitOK, code, stderr)
	recs := listItems[struct {
		APIVersion, Kind                               string
		Metadata                                       struct{ Name string }
		Time                                           time.Time
		ID, Policy, Path, Action, Node, User, Revision string
		Codes                                          []string
		Entry                                          map[string]any
	}](t, stdout)
	require.Len(t, recs, 1)
	rec := recs[0]
	assert.Equal(t, "cli.ichor.dev/v1alpha1", rec.APIVersion)
	assert.Equal(t, "Decision", rec.Kind)
	assert.Equal(t, f.deny, rec.Metadata.Name)
	assert.Equal(t, f.deny, rec.ID)
	assert.Equal(t, "kubelet-serving", rec.Policy)
	assert.Equal(t, engine.PathKubeletServing, rec.Path)
	assert.Equal(t, "deny", rec.Action)
	assert.Equal(t, "worker-1", rec.Node)
	assert.Equal(t, "system:node:worker-1", rec.User)
	assert.Equal(t, []string{"IPNotNode"}, rec.Codes)
	assert.Equal(t, f.revision, rec.Revision)
	assert.WithinDuration(t, time.Now(), rec.Time, time.Minute)
	assert.Equal(t, "Decision Log", rec.Entry["msg"])
	assert.Equal(t, f.deny, rec.Entry["decision_id"])
	assert.Equal(t, "10.5.0.2", rec.Entry["input"].(map[string]any)["node"].(map[string]any)["addresses"].([]any)[0])
}

func TestDecisionsShowPrintsTheReasonsInputAndResult(t *testing.T) {
	f := newDecisionsFixture(t)

	code, stdout, stderr, _ := decisionsRun(t, f.kubectlLogs(), "decisions", "show", f.deny, "-")

	require.Equal(t, ExitOK, code, stderr)
	assert.Regexp(t, `(?m)^Decision:\s+`+f.deny+`$`, stdout)
	assert.Regexp(t, `(?m)^Time:\s+\d{4}-\d\d-\d\dT`, stdout)
	assert.Regexp(t, `(?m)^Policy:\s+kubelet-serving \(ichor/kubelet_serving/decision\)$`, stdout)
	assert.Regexp(t, `(?m)^Revision:\s+`+regexp.QuoteMeta(f.revision)+`$`, stdout)
	assert.Regexp(t, `(?m)^Action:\s+deny$`, stdout)
	assert.Regexp(t, `(?m)^Node:\s+worker-1$`, stdout)
	assert.Contains(t, stdout, "\nReasons:\n  IPNotNode: IP address 10.5.0.3 is not one of the node's addresses [\"10.5.0.2\"]\n")
	assert.Contains(t, stdout, "\nInput:\n{\n  \"csr\": {")
	assert.Contains(t, stdout, "\nResult:\n{\n  \"action\": \"deny\",")
	assert.Contains(t, stdout, `"subject_alt_names": [`)

	// A prefix that one decision has is enough; -o json is the Decision
	// that list prints, the entry whole in it.
	code, stdout, stderr, _ = decisionsRun(t, f.log, "decisions", "show", f.pending[:13], "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var d struct {
		Kind, ID string
		Entry    map[string]any
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	assert.Equal(t, "Decision", d.Kind)
	assert.Equal(t, f.pending, d.ID)
	assert.Equal(t, f.pending, d.Entry["decision_id"])

	// What -o name prints names it to show.
	code, name, stderr, _ := decisionsRun(t, f.log, "decisions", "list", "--action", "pending", "-o", "name")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "decision.cli.ichor.dev/"+f.pending+"\n", name)
	code, stdout, stderr, _ = decisionsRun(t, f.log, "decisions", "show", strings.TrimSpace(name))
	require.Equal(t, ExitOK, code, stderr)
	assert.Regexp(t, `(?m)^Decision:\s+`+f.pending+`$`, stdout)
}

// TestKYAMLKeepsAKeyTheStreamsEscape: a requester's extra keys reach the
// output as keys. KYAML leaves a key of letters plain, and a Hangul filler
// (drawn as nothing) is a letter, which the streams write \u3164: plain, that
// read back as six characters, another key than the requester's (review 202
// F4). Each such key is double-quoted now and reads back as it was written;
// a key of letters the streams leave alone stays plain.
func TestKYAMLKeepsAKeyTheStreamsEscape(t *testing.T) {
	f := newDecisionsFixture(t)
	keys := []string{"\u3164scope", "sco\u3164pe", "\u115f", "x\uffa0.y/z", "cl\u00e9"}
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.SplitN(f.log, "\n", 2)[0]), &entry))
	extra := map[string]any{}
	for _, k := range keys {
		extra[k] = []any{"**REDACTED**"}
	}
	entry["input"].(map[string]any)["csr"].(map[string]any)["extra"] = extra
	line, err := json.Marshal(entry)
	require.NoError(t, err)

	for _, format := range []string{"kyaml", "yaml", "json"} {
		code, stdout, stderr, _ := decisionsRun(t, string(line)+"\n", "decisions", "show", f.approve, "-o", format)
		require.Equal(t, ExitOK, code, "-o %s: %s", format, stderr)
		assert.NotContains(t, stdout, "\u3164", "-o %s: the filler reached the terminal as it is", format)
		var d struct {
			Entry struct {
				Input struct {
					CSR struct {
						Extra map[string][]string `json:"extra"`
					} `json:"csr"`
				} `json:"input"`
			} `json:"entry"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(stdout), &d), "-o %s:\n%s", format, stdout)
		got := make([]string, 0, len(keys))
		for k := range d.Entry.Input.CSR.Extra {
			got = append(got, k)
		}
		assert.ElementsMatch(t, keys, got, "-o %s", format)
		if format == "kyaml" {
			assert.Contains(t, stdout, "\n          cl\u00e9: [", "a key the streams leave alone is left plain")
		}
	}
}

func TestDecisionsShowRefusesAnUnknownID(t *testing.T) {
	f := newDecisionsFixture(t)

	code, stdout, stderr, _ := decisionsRun(t, f.log, "decisions", "show", "00000000-0000-0000-0000-000000000000")

	assert.Equal(t, ExitError, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "decision 00000000-0000-0000-0000-000000000000 is not in the log (4 decisions read)")

	// An empty ID (an unset "$ID" in a script) is a prefix of every ID: a
	// wrong argument, not a search of the whole log (review 172).
	for _, id := range []string{"", "decision/", "decision.cli.ichor.dev/"} {
		code, stdout, stderr, _ = decisionsRun(t, f.log, "decisions", "show", id)
		assert.Equal(t, ExitUsage, code, "%q: %s", id, stderr)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, "the decision ID is empty")
	}
}

// The replay's summary names at most ten revisions, then how many more: a
// forged log of as many revisions as entries made a line of megabytes
// (review 172).
func TestTheReplaySummaryNamesTenRevisions(t *testing.T) {
	var revs []string
	for i := range 12 {
		revs = append(revs, fmt.Sprintf("r%d", i))
	}
	assert.Equal(t, "r0, r1", namedRevisions(revs[:2]))
	assert.Equal(t, "r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 and 2 more", namedRevisions(revs))
	entries := []decisionlog.Entry{{Revision: "a"}, {Revision: "b"}, {Revision: "a"}, {}}
	assert.Equal(t, []string{"a", "b"}, loggedRevisions(entries))
}

func TestDecisionsReplayWithTheSamePolicyChangesNothing(t *testing.T) {
	f := newDecisionsFixture(t)

	code, stdout, stderr, err := decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", f.file(t, f.log), "--fail-on", "any")

	require.NoError(t, err)
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Replayed 4 decisions logged under "+f.revision+" against ../../policy (revision "+f.revision+").")
	assert.Regexp(t, `(?m)^unchanged\s+4$`, stdout)
	assert.Contains(t, stdout, "No decision would change.")
	assert.NotContains(t, stdout, "→")
}

func TestDecisionsReplayWithoutTheIPCheckReportsTheFlip(t *testing.T) {
	f := newDecisionsFixture(t)
	log := f.file(t, f.kubectlLogs())
	candidate := harness.PolicyWithoutServingIPCheck(t)

	code, stdout, stderr, err := decisionsRun(t, "", "decisions", "replay", "--bundle", candidate, log, "--fail-on", "deny-to-approve")

	assert.Equal(t, ExitChanged, exitCode(err), "the error asks for exit status %d", ExitChanged)
	assert.Equal(t, ExitChanged, code, "Run exits with the status the error asks for")
	assert.Contains(t, stderr, "decisions changed as --fail-on forbids: deny-to-approve (1)")
	assert.Regexp(t, `(?m)^deny → approve\s+1$`, stdout)
	assert.Regexp(t, `(?m)^unchanged\s+3$`, stdout)
	assert.Contains(t, stdout, "\ndeny → approve: 1 decision\n")
	assert.Regexp(t, `(?m)^`+f.deny+`\s+\S+Z\s+kubelet-serving\s+worker-1\s+deny → approve\s+IchorKubeletServing$`, stdout)
	for _, id := range []string{f.approve, f.pending, f.two} {
		assert.NotContains(t, stdout, id)
	}

	for _, failOn := range [][]string{{"--fail-on", "to-approve"}, {"--fail-on", "approve-to-deny,any"}, {"--fail-on", "from-deny"}} {
		_, _, _, err := decisionsRun(t, "", append([]string{"decisions", "replay", "--bundle", candidate, log}, failOn...)...)
		assert.Equal(t, ExitChanged, exitCode(err), failOn)
	}
	for _, failOn := range [][]string{nil, {"--fail-on", "approve-to-deny"}, {"--fail-on", "to-deny", "--fail-on", "pending-to-approve"}, {"--fail-on", "reasons-changed"}} {
		code, _, stderr, err := decisionsRun(t, "", append([]string{"decisions", "replay", "--bundle", candidate, log}, failOn...)...)
		require.NoError(t, err, failOn)
		assert.Equal(t, ExitOK, code, stderr)
	}

	// Only the decisions selected are replayed.
	code, stdout, stderr, err = decisionsRun(t, "", "decisions", "replay", "--bundle", candidate, log, "--action", "approve", "--fail-on", "any")
	require.NoError(t, err)
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Replayed 2 decisions")
}

// A candidate that admits the same request under the same reason code but
// grants more (a talosconfig for twelve hours where one for an hour was
// admitted) fails "--fail-on any", and says which fields changed; a gate on
// directions alone does not see it.
func TestDecisionsReplayReportsACredentialThatGrantsMore(t *testing.T) {
	ctx := context.Background()
	log := &harness.DecisionLog{}
	e, err := engine.New(ctx, engine.Options{DecisionLog: log, Log: io.Discard})
	require.NoError(t, err)
	d, err := e.Decide(ctx, engine.PathCredentialAdmission, harness.AdmissionInput("ichor:alice", true))
	require.NoError(t, err)
	e.Stop(ctx)
	file := filepath.Join(t.TempDir(), "decisions.log")
	require.NoError(t, os.WriteFile(file, []byte(log.String()), 0o600))
	candidate := harness.PolicyWithWiderTalosconfig(t)

	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "replay", "--bundle", candidate, file, "--fail-on", "any")

	assert.Equal(t, ExitChanged, code, stderr)
	assert.Contains(t, stderr, "decisions changed as --fail-on forbids: any (1)")
	assert.Regexp(t, `(?m)^result changed \(same action\)\s+1$`, stdout)
	assert.Contains(t, stdout, "\nresult changed, same action: 1 decision\n")
	assert.Regexp(t, `(?m)^`+d.ID+`\s+\S+Z\s+admission\s+ichor:alice\s+allowed\s+credential,lifetime_seconds$`, stdout)

	for failOn, want := range map[string]int{"result-changed": ExitChanged, "to-allowed": ExitOK, "reasons-changed": ExitOK} {
		code, _, stderr, _ := decisionsRun(t, "", "decisions", "replay", "--bundle", candidate, file, "--fail-on", failOn)
		assert.Equal(t, want, code, "%s: %s", failOn, stderr)
	}

	_, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", candidate, file, "-o", "json")
	var rep struct {
		Notes   map[string]int
		Changes []struct {
			Note      string
			Changed   []string
			OldResult map[string]any `json:"old_result"`
			NewResult map[string]any `json:"new_result"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stderr)
	assert.Equal(t, map[string]int{"result-changed": 1}, rep.Notes)
	require.Len(t, rep.Changes, 1)
	c := rep.Changes[0]
	assert.Equal(t, []string{"credential", "lifetime_seconds"}, c.Changed)
	assert.Equal(t, "talosconfig", c.OldResult["credential"].(map[string]any)["credential"])
	assert.Equal(t, "talosconfig for a working day", c.NewResult["credential"].(map[string]any)["credential"])
	assert.InDelta(t, 43200, c.NewResult["lifetime_seconds"], 0)
}

func TestDecisionsReplayJSON(t *testing.T) {
	f := newDecisionsFixture(t)
	candidate := harness.PolicyWithoutServingIPCheck(t)

	_, stdout, stderr, err := decisionsRun(t, f.log, "decisions", "replay", "--bundle", candidate, "-o", "json", "--fail-on", "to-approve")

	assert.Equal(t, ExitChanged, exitCode(err), stderr)
	var rep struct {
		Candidate       struct{ Bundle, Revision string }
		LoggedRevisions []string `json:"logged_revisions"`
		Replayed        int
		Unchanged       int
		Directions      map[string]int
		Changes         []struct {
			ID, Policy, Node, User, Direction string
			Old, New                          struct {
				Action  string
				Reasons []engine.Reason
			}
		}
		FailOn []string `json:"fail_on"`
		Failed map[string]int
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.Equal(t, candidate, rep.Candidate.Bundle)
	assert.NotEqual(t, f.revision, rep.Candidate.Revision)
	assert.Equal(t, []string{f.revision}, rep.LoggedRevisions)
	assert.Equal(t, 4, rep.Replayed)
	assert.Equal(t, 3, rep.Unchanged)
	assert.Equal(t, map[string]int{"deny-to-approve": 1}, rep.Directions)
	require.Len(t, rep.Changes, 1)
	c := rep.Changes[0]
	assert.Equal(t, []string{f.deny, "kubelet-serving", "worker-1", "system:node:worker-1", "deny-to-approve"}, []string{c.ID, c.Policy, c.Node, c.User, c.Direction})
	assert.Equal(t, "deny", c.Old.Action)
	assert.Equal(t, "approve", c.New.Action)
	assert.Equal(t, "IchorKubeletServing", c.New.Reasons[0].Code)
	assert.Equal(t, []string{"to-approve"}, rep.FailOn)
	assert.Equal(t, map[string]int{"to-approve": 1}, rep.Failed)
}

// The hostile review of 2026-12-05: whoever makes a request can have its
// input cut in the log (a CSR with more names than the log keeps), and a
// cut decision is not replayed; a gate that passed in silence could then
// miss the very shape a candidate flips. --fail-on truncated fails on
// them, and a replay that could replay nothing fails as an empty one does.
func TestDecisionsReplayOfCutInputsCanFailTheGate(t *testing.T) {
	f := newDecisionsFixture(t)
	var lines []string
	for line := range strings.SplitSeq(strings.TrimSuffix(f.log, "\n"), "\n") {
		if strings.Contains(line, f.deny) {
			var entry map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &entry))
			entry["input"].(map[string]any)["log_truncated"] = map[string]any{"input.csr.dns_names": 300}
			b, err := json.Marshal(entry)
			require.NoError(t, err)
			line = string(b)
		}
		lines = append(lines, line)
	}
	log := f.file(t, strings.Join(lines, "\n")+"\n")

	code, stdout, stderr, err := decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log, "--fail-on", "any")
	require.NoError(t, err)
	require.Equal(t, ExitOK, code, stderr)
	assert.Regexp(t, `(?m)^not replayed: input cut in the log\s+1$`, stdout)

	code, stdout, stderr, err = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log, "--fail-on", "any,truncated")
	assert.Equal(t, ExitChanged, exitCode(err))
	assert.Equal(t, ExitChanged, code)
	assert.Contains(t, stderr, "decisions changed as --fail-on forbids: truncated (1)")
	assert.Contains(t, stdout, "Replayed 3 decisions")

	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "replay", "--bundle", "../../policy", log, "--action", "deny", "--fail-on", "deny-to-approve")
	assert.Equal(t, ExitError, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "no decision could be replayed: the log cut the input of all 1 selected")
}

func TestDecisionsReplayOfNothingFails(t *testing.T) {
	code, stdout, stderr, _ := decisionsRun(t, "not a decision\n", "decisions", "replay", "--bundle", "../../policy")

	assert.Equal(t, ExitError, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "no decision read: skipped 1 line that is not a decision-log entry")
}

func TestDecisionsRefusesBadUsage(t *testing.T) {
	f := newDecisionsFixture(t)
	log := f.file(t, f.log)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"decisions", "list", log, "--bogus"}, ExitUsage, "unknown flag: --bogus"},
		{"a directory for a log", []string{"decisions", "list", filepath.Dir(log)}, ExitUsage, "a directory, not a log file"},
		{"bad action", []string{"decisions", "list", log, "--action", "approved"}, ExitUsage, `--action "approved" is not an action`},
		{"bad policy", []string{"decisions", "list", log, "--policy", "serving"}, ExitUsage, `unknown policy "serving"`},
		{"bad since", []string{"decisions", "list", log, "--since", "yesterday"}, ExitUsage, "--since"},
		{"negative days", []string{"decisions", "list", log, "--since", "-30d"}, ExitUsage, "--since"},
		{"bad output", []string{"decisions", "list", log, "-o", "xml"}, ExitUsage, `unable to match a printer suitable for the output format "xml", allowed formats are: json,jsonpath,jsonpath-as-json,jsonpath-file,kyaml,name,table,wide,yaml`},
		{"stdin twice", []string{"decisions", "list", "-", "-"}, ExitUsage, "given twice"},
		{"missing file", []string{"decisions", "list", "/nonexistent/decisions.log"}, ExitUsage, "no such file"},
		{"show without ID", []string{"decisions", "show"}, ExitUsage, "give the decision ID"},
		{"show bad output", []string{"decisions", "show", f.deny, log, "-o", "table"}, ExitUsage, `unable to match a printer suitable for the output format "table", allowed formats are: json,jsonpath,jsonpath-as-json,jsonpath-file,kyaml,name,text,yaml`},
		{"replay without bundle", []string{"decisions", "replay", log}, ExitUsage, "--bundle is required"},
		{"replay bad direction", []string{"decisions", "replay", "--bundle", "../../policy", log, "--fail-on", "deny-approve"}, ExitUsage, `"deny-approve" is not a direction`},
		{"replay bad direction in a list", []string{"decisions", "replay", "--bundle", "../../policy", log, "--fail-on", "any,to-granted"}, ExitUsage, `"to-granted" is not a direction`},
		{"replay missing bundle", []string{"decisions", "replay", "--bundle", "/nonexistent", log}, ExitUsage, "bundle"},
		// The largest numbers overflowed the reader's bounds: a panic, and
		// every JSON document refused (review 187).
		{"log bytes past the bound", []string{"decisions", "list", log, "--max-log-bytes", "9223372036854775807"}, ExitUsage, "--max-log-bytes 9223372036854775807: give a number of bytes above 0 and at most"},
		{"line bytes past the bound", []string{"decisions", "list", log, "--max-line-bytes", "4611686018427387903"}, ExitUsage, "--max-line-bytes 4611686018427387903: give a number of bytes above 0 and at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr, _ := decisionsRun(t, "", tc.args...)
			assert.Equal(t, tc.code, code, stderr)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

func TestDecisionsReadWhatADecisionLogServiceReceived(t *testing.T) {
	f := newDecisionsFixture(t)
	// What a service that keeps each upload's body stores: gzipped JSON
	// arrays of OPA's events, run together as `cat *.json.gz` makes them.
	uploads := f.file(t, string(bytes.Join(f.uploads, nil)))

	_, fromConsole, _, err := decisionsRun(t, f.log, "decisions", "list", "-o", "json")
	require.NoError(t, err)
	code, fromService, stderr, err := decisionsRun(t, "", "decisions", "list", uploads)
	require.NoError(t, err)
	require.Equal(t, ExitOK, code, stderr)
	assert.Empty(t, stderr, "nothing skipped")
	assert.Equal(t, []string{f.approve, f.deny, f.pending, f.two}, column(t, fromService, "ID"))
	assert.Equal(t, []string{"approve", "deny", "pending", "approve"}, column(t, fromService, "ACTION"))
	assert.Equal(t, []string{"IchorKubeletServing", "IPNotNode", "MachineUnknown", "IchorKubeletServing"}, column(t, fromService, "CODES"))

	// Every field but the entry itself (OPA's event has no msg) is the same
	// as read from the console; standard input is detected as gzip too.
	_, fromServiceJSON, _, err := decisionsRun(t, string(bytes.Join(f.uploads, nil)), "decisions", "list", "-o", "json")
	require.NoError(t, err)
	withoutEntry := func(out string) []map[string]any {
		recs := listItems[map[string]any](t, out)
		for _, rec := range recs {
			delete(rec, "entry")
		}
		return recs
	}
	assert.Equal(t, withoutEntry(fromConsole), withoutEntry(fromServiceJSON))

	_, showConsole, _, err := decisionsRun(t, f.log, "decisions", "show", f.deny)
	require.NoError(t, err)
	_, showService, _, err := decisionsRun(t, "", "decisions", "show", f.deny, uploads)
	require.NoError(t, err)
	assert.Equal(t, showConsole, showService)

	_, stdout, _, err := decisionsRun(t, "", "decisions", "replay", "--bundle", harness.PolicyWithoutServingIPCheck(t), uploads, "--fail-on", "deny-to-approve")
	assert.Equal(t, ExitChanged, exitCode(err))
	assert.Regexp(t, `(?m)^deny → approve\s+1$`, stdout)
	assert.Regexp(t, `(?m)^unchanged\s+3$`, stdout)
}

func TestDecisionsThatReadNoDecisionFail(t *testing.T) {
	f := newDecisionsFixture(t)
	controllerOnly := `{"level":"info","ts":1777636800,"logger":"manager","msg":"starting"}` + "\n" +
		`{"level":"info","msg":"approved kubelet serving certificate","decision_id":"x"}` + "\n"
	for _, tc := range []struct {
		name, stdin string
		code        int
		want        string
	}{
		{"an empty input", "", ExitError, "no decision read: the input is empty"},
		{"only the controllers' lines", controllerOnly, ExitError, "no decision read: skipped 2 lines that are not decision-log entries"},
		{"an upload body without events", "[]", ExitError, "no decision read: the input is empty"},
		{"a gzip stream cut short", string(f.uploads[0][:len(f.uploads[0])/2]), ExitUsage, "not a readable decision log: gzip"},
		// A decision's line torn (the manager killed mid-write) is told
		// from a line of another log: it may be a decision lost (review
		// 187). The controllers' lines that name a decision_id are whole.
		{"a decision's line torn", controllerOnly + `{"bundles":{"ichor":{"revision":"r"}},"decision_id":"x","input":{"csr":{"name":"csr-` + "\n",
			ExitError, "no decision read: skipped 2 lines that are not decision-log entries; skipped 1 damaged decision-log entry (JSON cut short"},
		// A window of the log that caught a record and not its decision
		// (review 187: "no decision matches", exit 0).
		{"only a record of an applied verdict", `{"msg":"Decision Log","decision_id":"r","path":"system/applied/record","input":{"decision_id":"d","object":"csr/csr-1","action":"approve","outcome":"written"}}` + "\n",
			ExitError, "no decision read: read only 1 record of an applied verdict (a record decides nothing"},
	} {
		for _, args := range [][]string{
			{"decisions", "list"},
			{"decisions", "list", "-o", "json"},
			{"decisions", "show", f.deny},
			{"decisions", "replay", "--bundle", "../../policy"},
		} {
			t.Run(tc.name+"/"+strings.Join(args[1:], " "), func(t *testing.T) {
				code, stdout, stderr, _ := decisionsRun(t, tc.stdin, args...)
				assert.Equal(t, tc.code, code, stderr)
				assert.Empty(t, stdout)
				assert.Contains(t, stderr, tc.want)
			})
		}
	}
}

func TestDecisionsListNamesEveryLoggedRule(t *testing.T) {
	// The credential rules the webhook and the CLI ask besides admission
	// and issuance: a purpose's requirements, a credential's checks.
	ctx := context.Background()
	sink := &decisionsSink{}
	e, err := engine.New(ctx, engine.Options{DecisionLog: sink, ID: "test"})
	require.NoError(t, err)
	reqs, err := e.Requirements(ctx, "talosconfig-reader")
	require.NoError(t, err)
	check, err := e.CheckCredential(ctx, engine.CredentialCheckInput{
		Purpose: "talosconfig-reader", PublicKey: engine.PublicKeyFacts{Parsed: true, Algorithm: "Ed25519", Bits: 256},
	})
	require.NoError(t, err)
	// The flood guard's limits, and the audit of a certificate in service
	// that names an address the node no longer has.
	_, err = e.KubeletServingLimits(ctx)
	require.NoError(t, err)
	audit, err := e.KubeletServingAudit(ctx, servingcert.Audit{
		Machine: csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"},
		Node:    csrinput.Node{Readable: true, Nodename: "worker-1", Hostname: "worker-1", Addresses: []string{"10.5.0.2"}},
		Certificate: servingcert.Certificate{
			Address: "10.5.0.9:10250", Read: true,
			Subject:         []csrinput.Attribute{{OID: "2.5.4.10", Name: "O", Value: "system:nodes"}, {OID: "2.5.4.3", Name: "CN", Value: "system:node:worker-1"}},
			SubjectAltNames: []csrinput.SAN{{Type: "ip", Value: "10.5.0.9"}}, Serial: "01", Issuer: "CN=kubernetes",
			NotBefore: "2026-01-01T00:00:00Z", NotAfter: "2027-01-01T00:00:00Z", NotBeforeUnix: 1767225600, NotAfterUnix: 1798761600,
			ExtKeyUsages: []string{"server auth"}, IssuedByClusterCA: true,
		},
		Now: "2026-06-01T00:00:00Z", NowUnix: 1780272000,
	})
	require.NoError(t, err)
	require.Equal(t, engine.AuditDrifted, audit.Status)
	// A TalosCluster's kubeconfigRef judged (review 202 F5: logged, and
	// listed by its path only).
	kc, err := e.Kubeconfig(ctx, engine.KubeconfigInput{Cluster: engine.KubeconfigCluster{Namespace: "tenant-a", Name: "remote"}})
	require.NoError(t, err)
	require.False(t, kc.Allowed)
	e.Stop(ctx)

	code, stdout, stderr, _ := decisionsRun(t, sink.buf.String(), "decisions", "list")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{"requirements", "credential-check", "kubelet-serving-limits", "kubelet-serving-audit", "kubeconfig"}, column(t, stdout, "POLICY"))
	assert.Equal(t, []string{"-", "allowed", "-", "drifted", "refused"}, column(t, stdout, "ACTION"))
	assert.Equal(t, []string{reqs.DecisionID, check.DecisionID}, column(t, stdout, "ID")[:2])

	code, stdout, stderr, _ = decisionsRun(t, sink.buf.String(), "decisions", "list", "--policy", "kubeconfig")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{kc.DecisionID}, column(t, stdout, "ID"))

	code, stdout, stderr, _ = decisionsRun(t, sink.buf.String(), "decisions", "list", "--policy", "requirements")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{reqs.DecisionID}, column(t, stdout, "ID"))

	// An audit's status is its action: what drifted is found by it.
	code, stdout, stderr, _ = decisionsRun(t, sink.buf.String(), "decisions", "list", "--policy", "kubelet-serving-audit", "--action", "drifted")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{audit.DecisionID}, column(t, stdout, "ID"))
}

func TestDecisionsReplayRefusesACandidateThatReadsTheClock(t *testing.T) {
	f := newDecisionsFixture(t)
	candidate := t.TempDir()
	require.NoError(t, os.CopyFS(candidate, os.DirFS("../../policy")))
	require.NoError(t, os.WriteFile(filepath.Join(candidate, "ichor", "kubelet_serving", "clock.rego"), []byte(`package ichor.kubelet_serving

deny contains {"code": "AfterHours", "message": "no certificates at night"} if {
	[hour, _, _] := time.clock(time.now_ns())
	hour < 6
}
`), 0o600))

	code, stdout, stderr, _ := decisionsRun(t, f.log, "decisions", "replay", "--bundle", candidate, "--fail-on", "any")

	assert.Equal(t, ExitError, code)
	assert.Empty(t, stdout, "no report: it would be the clock's")
	assert.Contains(t, stderr, "cannot be replayed exactly: the candidate calls time.now_ns (")
}

// apiServerWithPodLogs serves the two calls --from-cluster makes: the pod
// list and a pod's log. envtest's API server cannot stand in: it has no
// kubelet, and pods/log is served by the kubelet through the API server. So
// this is a stand-in for those two calls only, in the API server's shapes;
// what it asserts is what the CLI asks for (namespace, selector, container)
// and that it reads what the logs hold. It records each request.
func apiServerWithPodLogs(t *testing.T, logs map[string]string) (*httptest.Server, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var requests []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		const pods = "/api/v1/namespaces/ichor-system/pods"
		switch {
		case r.URL.Path == pods:
			list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
			for name := range logs {
				list.Items = append(list.Items, corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ichor-system"},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager"}}},
				})
			}
			// A pod the selector selects without a manager container is
			// not read.
			list.Items = append(list.Items, corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "ichor-policy-debug", Namespace: "ichor-system"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "shell"}}},
			})
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(list)
		case strings.HasPrefix(r.URL.Path, pods+"/") && strings.HasSuffix(r.URL.Path, "/log"):
			name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, pods+"/"), "/log")
			log, ok := logs[name]
			if !ok || r.URL.Query().Get("container") != "manager" {
				http.NotFound(w, r)
				return
			}
			if log == kubeletUnreachable {
				// What the API server answers when it cannot reach the
				// pod's kubelet.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"InternalError","code":500,`+
					`"message":"Get \"https://10.0.0.5:10250/containerLogs/ichor-system/pod/manager\": dial tcp 10.0.0.5:10250: connect: connection refused"}`)
				return
			}
			if log == waitingContainer {
				// What the API server answers for a container still starting.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400,`+
					`"message":"container \"manager\" is waiting to start: ContainerCreating"}`)
				return
			}
			w.Header().Set("Content-Type", "text/plain")
			if cut, ok := strings.CutPrefix(log, brokenStream); ok {
				// What the client reads of a connection reset while
				// the log streams: a part, then an unexpected end.
				_, _ = io.WriteString(w, cut)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}
			_, _ = io.WriteString(w, log)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &requests
}

// waitingContainer, as a pod's log, makes the stand-in API server answer as
// for a container still starting, kubeletUnreachable as when the pod's
// kubelet cannot be reached; a log that begins with brokenStream is sent,
// the rest of it, and then the connection is broken off.
const (
	waitingContainer   = "\x00waiting"
	kubeletUnreachable = "\x00unreachable"
	brokenStream       = "\x00broken"
)

// A log that breaks off while it is read, or that cannot be opened for
// another cause than a container still starting or a pod gone (here the
// pod's kubelet unreachable: the API server's 500), is no pod to skip: a
// replay's gate would pass on the other replicas' decisions alone (review
// 187: a log broken off was skipped as a container still starting is, and
// the command exited 0; review 202 F3: so was one that could not be
// opened).
func TestDecisionsFromClusterFailsWhenALogIsNotReadWhole(t *testing.T) {
	f := newDecisionsFixture(t)
	logs := f.kubectlLogs()
	for name, tc := range map[string]struct{ log, says string }{
		"broken off":          {brokenStream + logs[:len(logs)/2], "read the log of pod ichor-system/ichor-policy-7d9c6b8f5-b"},
		"kubelet unreachable": {kubeletUnreachable, "connection refused"},
	} {
		t.Run(name, func(t *testing.T) {
			srv, _ := apiServerWithPodLogs(t, map[string]string{"ichor-policy-7d9c6b8f5-a": logs, "ichor-policy-7d9c6b8f5-b": tc.log})
			kubeconfig := kubeconfigFor(t, srv.URL, "")
			for _, args := range [][]string{
				{"decisions", "list", "--from-cluster", "--kubeconfig", kubeconfig},
				{"decisions", "replay", "--bundle", harness.PolicyWithoutServingIPCheck(t), "--from-cluster", "--kubeconfig", kubeconfig},
			} {
				code, stdout, stderr, _ := decisionsRun(t, "", args...)
				assert.Equal(t, ExitError, code, "%s: %s", args[:2], stdout)
				assert.Contains(t, stderr, "read the log of pod ichor-system/ichor-policy-7d9c6b8f5-b", args[:2])
				assert.Contains(t, stderr, tc.says, args[:2])
				assert.Empty(t, stdout, "%s: a listing or a report without that pod's decisions", args[:2])
			}
		})
	}
}

// A rolling update: one replica's container is still starting. Its log is
// skipped, said so, and the other's is read; with no log readable at all,
// the command fails with the API server's reason.
func TestDecisionsFromClusterSkipsAPodStillStarting(t *testing.T) {
	f := newDecisionsFixture(t)
	srv, _ := apiServerWithPodLogs(t, map[string]string{
		"ichor-policy-7d9c6b8f5-a": f.kubectlLogs(),
		"ichor-policy-7d9c6b8f5-b": waitingContainer,
	})
	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", "--from-cluster", "--kubeconfig", kubeconfigFor(t, srv.URL, ""))
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stderr, "ichor: pod ichor-policy-7d9c6b8f5-b skipped: ")
	assert.Contains(t, stderr, "is waiting to start")
	assert.NotEmpty(t, column(t, stdout, "ID"))

	srv, _ = apiServerWithPodLogs(t, map[string]string{"ichor-policy-7d9c6b8f5-b": waitingContainer})
	code, _, stderr, _ = decisionsRun(t, "", "decisions", "list", "--from-cluster", "--kubeconfig", kubeconfigFor(t, srv.URL, ""))
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "is waiting to start")
}

// kubeconfigFor is a kubeconfig whose current context reaches server and
// names namespace ("" for none).
func kubeconfigFor(t *testing.T, server, namespace string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "`+server+`"}
users:
- name: test
  user: {token: test}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: "`+namespace+`"}
current-context: test
`), 0o600))
	return path
}

func TestDecisionsFromClusterReadTheManagerPodsLogs(t *testing.T) {
	f := newDecisionsFixture(t)
	lines := strings.Split(strings.TrimSpace(f.kubectlLogs()), "\n")
	// Two replicas, each with part of the decisions among its own lines;
	// the first by name made the later ones.
	srv, requests := apiServerWithPodLogs(t, map[string]string{
		"ichor-policy-7d9c6b8f5-a": strings.Join(lines[4:], "\n") + "\n",
		"ichor-policy-7d9c6b8f5-b": strings.Join(lines[:4], "\n") + "\n",
	})
	kubeconfig := kubeconfigFor(t, srv.URL, "")

	code, stdout, stderr, err := decisionsRun(t, "", "decisions", "list", "--from-cluster", "--kubeconfig", kubeconfig)

	require.NoError(t, err)
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{f.approve, f.deny, f.pending, f.two}, column(t, stdout, "ID"), "both pods' decisions, in the order they were made")
	assert.Equal(t, "ichor: read 4 decisions from 2 pods in namespace ichor-system (ichor-policy-7d9c6b8f5-a, ichor-policy-7d9c6b8f5-b); skipped 3 lines that are not decision-log entries\n", stderr)
	assert.Contains(t, *requests, "/api/v1/namespaces/ichor-system/pods?labelSelector=app.kubernetes.io%2Fname%3Dichor-policy",
		"the chart's selector label, in ichor-system")
	assert.Contains(t, *requests, "/api/v1/namespaces/ichor-system/pods/ichor-policy-7d9c6b8f5-a/log?container=manager")
	assert.NotContains(t, strings.Join(*requests, "\n"), "ichor-policy-debug/log")

	_, stdout, _, err = decisionsRun(t, "", "decisions", "show", f.deny, "--from-cluster", "--kubeconfig", kubeconfig)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^Action:\s+deny$`, stdout)

	_, _, _, err = decisionsRun(t, "", "decisions", "replay", "--bundle", harness.PolicyWithoutServingIPCheck(t), "--from-cluster", "--kubeconfig", kubeconfig, "--fail-on", "deny-to-approve")
	assert.Equal(t, ExitChanged, exitCode(err))

	// The context's namespace is never the default: it is often a
	// tenant's, where a pod labelled as the manager's would be read as it
	// (review of 2026-12-06). -n names another.
	code, stdout, stderr, _ = decisionsRun(t, "", "decisions", "list", "--from-cluster", "--kubeconfig", kubeconfigFor(t, srv.URL, "team-a"))
	assert.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, []string{f.approve, f.deny, f.pending, f.two}, column(t, stdout, "ID"), "the manager's namespace was not read")
	code, _, stderr, _ = decisionsRun(t, "", "decisions", "list", "--from-cluster", "-n", "elsewhere", "--kubeconfig", kubeconfigFor(t, srv.URL, "team-a"))
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "list the manager's pods in namespace elsewhere")
}

func TestDecisionsFromClusterRefusesMixedSources(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a file too", []string{"decisions", "list", "--from-cluster", "decisions.log"}, "give no FILE"},
		{"a cluster flag without it", []string{"decisions", "list", "-n", "ichor-system", "-"}, "--namespace is for --from-cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr, _ := decisionsRun(t, "", tc.args...)
			assert.Equal(t, ExitUsage, code, stderr)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

// An API server's warnings are printed as kubectl prints them, once each,
// on the command's standard error and escaped like the rest (review 22:
// they were klog's text lines, written past the escaping streams).
func TestAPIServerWarningsArePrintedOnceAndEscaped(t *testing.T) {
	f := newDecisionsFixture(t)
	inner, _ := apiServerWithPodLogs(t, map[string]string{"ichor-policy-7d9c6b8f5-a": f.kubectlLogs()})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Go's HTTP client refuses a header that holds a C0 control: a
		// bidi override is what a server can put in one.
		w.Header().Add("Warning", `299 - "the API is deprecated`+"\u202e"+`"`)
		inner.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", "--from-cluster", "--kubeconfig", kubeconfigFor(t, srv.URL, ""))
	require.Equal(t, ExitOK, code, stderr)
	assert.NotEmpty(t, column(t, stdout, "ID"))
	assert.NotContains(t, stderr, "\u202e")
	assert.Equal(t, 1, strings.Count(stderr, "Warning: the API is deprecated\\u202e\n"), "once, escaped: %q", stderr)
}

// An entry whose values the printers cannot hold (a number beyond float64's
// range, which anyone who writes a line of the log can put there) is left
// out of a document's output and said, naming it: it failed the whole
// listing before (review 255 F4), and the listing then exits 1, so that a
// script does not take the part for the whole (review 257: it exited 0).
// The table lists it.
func TestAnEntryThePrintersCannotHoldIsLeftOutAndSaid(t *testing.T) {
	log := fmt.Sprintf(unprintableEntry, "good", "1") + fmt.Sprintf(unprintableEntry, "forged", "1e400")
	for _, o := range []string{"json", "yaml", "name"} {
		code, stdout, stderr, _ := decisionsRun(t, log, "decisions", "list", "-", "-o", o)
		assert.Equal(t, ExitError, code, "%s: %s", o, stderr)
		assert.Contains(t, stdout, "good", o)
		assert.NotContains(t, stdout, "forged", o)
		assert.Contains(t, stderr, "ichor: decision forged left out of the output", o)
		assert.Contains(t, stderr, "ichor: 1 of 2 decisions left out of the output", o)
	}
	code, stdout, stderr, _ := decisionsRun(t, log, "decisions", "list", "-")
	assert.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "forged")

	code, stdout, stderr, _ = decisionsRun(t, fmt.Sprintf(unprintableEntry, "good", "1"), "decisions", "list", "-", "-o", "json")
	assert.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "good")
	assert.NotContains(t, stderr, "left out")
}

// unprintableEntry is a decision-log line of a decision id and a number:
// 1e400 is beyond float64's range, which the printers cannot hold.
const unprintableEntry = `{"msg":"Decision Log","decision_id":%q,"path":"ichor/kubelet_serving/decision","input":{"csr":{"name":"csr-1"},"x":%s},"result":{"action":"deny","reasons":[{"code":"C","message":"m"}]}}` + "\n"
