package cli

// Hostile strings in every human output of the CLI: what a requester wrote
// (a CSR's common name, another subject attribute, a SAN), what a reason's
// message quotes, and what anyone who can write a decision log file put
// there, never reach the terminal as control characters, and the JSON
// outputs still decode to the very strings that were logged.

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/termsafe/termsafetest"
	"github.com/ichor-dev/ichor-policy/policy"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// hostileOrg is an organization that retitles the window and clears the
// screen; the subject check quotes it with %s, so its message carries it raw.
const hostileOrg = "system:nodes\x1b]0;owned\x07\x1b[2J"

// hostileLog is a decision log written by the engine: a request from
// termsafetest.Node, which no machine has (pending, its node is the hostile
// name), and worker-1's request with hostileOrg (denied, the reason quotes
// it). Its ids are pending and deny.
type hostileLog struct {
	log, pending, deny string
}

func newHostileLog(t *testing.T) hostileLog {
	t.Helper()
	ctx := context.Background()
	var sink decisionsSink
	e, err := engine.New(ctx, engine.Options{DecisionLog: &sink, ID: "test"})
	require.NoError(t, err)
	request := func(node string, subject pkix.Name, talos bool) csrinput.KubeletServing {
		pemBytes, err := csrgen.PEM(csrgen.Request{Subject: subject, DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}})
		require.NoError(t, err)
		in := csrinput.KubeletServing{CSR: csrinput.Build(csrgen.ServingObject("csr-hostile", node, pemBytes))}
		if talos {
			in.Machine = &csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"}
			in.Node = &csrinput.Node{Readable: true, Nodename: "worker-1", Hostname: "worker-1", Addresses: []string{"10.5.0.2"}}
		}
		return in
	}
	pending, err := e.KubeletServing(ctx, request(termsafetest.Node, csrgen.NodeSubject(termsafetest.Node), false))
	require.NoError(t, err)
	require.Equal(t, "pending", pending.Action)
	deny, err := e.KubeletServing(ctx, request("worker-1", pkix.Name{CommonName: "system:node:worker-1", Organization: []string{hostileOrg}}, true))
	require.NoError(t, err)
	require.Equal(t, "deny", deny.Action, deny.Reasons.String())
	require.Contains(t, deny.Reasons.String(), hostileOrg, "the reason quotes the organization raw")
	e.Stop(ctx)
	return hostileLog{log: sink.buf.String(), pending: pending.DecisionID, deny: deny.DecisionID}
}

// policyWithMachineUnknownRenamed is a candidate that gives the reason for an
// unknown machine another code: the hostile pending decision is reported by
// replay as "reasons changed", with its node.
func policyWithMachineUnknownRenamed(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, policy.FS))
	path := filepath.Join(dir, "ichor", "kubelet_serving", "kubelet_serving.rego")
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	out := strings.Replace(string(src), `"code": "MachineUnknown",`, `"code": "MachineNotKnown",`, 1)
	require.NotEqual(t, string(src), out)
	require.NoError(t, os.Chmod(path, 0o600))
	require.NoError(t, os.WriteFile(path, []byte(out), 0o600)) //nolint:gosec // G703: a file of the test's temporary directory
	return dir
}

// run runs the command line through Run, as the binary does.
func run(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDecisionsHumanOutputEscapesWhatTheRequesterWrote(t *testing.T) {
	l := newHostileLog(t)
	// What OPA's console sink wrote is JSON: it escaped the C0 controls, not
	// C1 or the bidi override, which stand in it as they are.
	require.NotContains(t, l.log, "\x1b")
	require.Contains(t, l.log, "\u202e")
	candidate := policyWithMachineUnknownRenamed(t)

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"list", []string{"decisions", "list"}, []string{termsafetest.NodeEscaped}},
		{"show pending", []string{"decisions", "show", l.pending}, []string{
			"Node:      " + termsafetest.NodeEscaped + "\n",
			"User:      system:node:" + termsafetest.NodeEscaped + "\n",
		}},
		{"show deny", []string{"decisions", "show", l.deny}, []string{`O=system:nodes^[]0;owned\u0007^[[2J`}},
		{"replay", []string{"decisions", "replay", "--bundle", candidate}, []string{termsafetest.NodeEscaped, "MachineUnknown → MachineNotKnown"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := run(t, l.log, c.args...)
			require.Equal(t, ExitOK, code, stderr)
			termsafetest.AssertInert(t, stdout)
			termsafetest.AssertInert(t, stderr)
			for _, w := range c.want {
				assert.Contains(t, stdout, w)
			}
		})
	}
}

func TestDecisionsJSONOutputKeepsTheLoggedStrings(t *testing.T) {
	l := newHostileLog(t)
	candidate := policyWithMachineUnknownRenamed(t)

	_, stdout, stderr := run(t, l.log, "decisions", "list", "-o", "json")
	termsafetest.AssertInert(t, stdout+stderr)
	var list struct{ Items []decisionRecord }
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	var nodes []string
	for _, r := range list.Items {
		nodes = append(nodes, r.Node)
	}
	assert.Equal(t, []string{termsafetest.Node, "worker-1"}, nodes)

	_, stdout, _ = run(t, l.log, "decisions", "show", l.pending, "-o", "json")
	termsafetest.AssertInert(t, stdout)
	var entry struct {
		Entry struct {
			Result struct{ Node string } `json:"result"`
		} `json:"entry"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &entry))
	assert.Equal(t, termsafetest.Node, entry.Entry.Result.Node)

	_, stdout, _ = run(t, l.log, "decisions", "show", l.deny, "-o", "text")
	assert.NotContains(t, stdout, hostileOrg)

	_, stdout, _ = run(t, l.log, "decisions", "replay", "--bundle", candidate, "-o", "json")
	termsafetest.AssertInert(t, stdout)
	var rep replayJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.Len(t, rep.Changes, 1)
	assert.Equal(t, termsafetest.Node, rep.Changes[0].Node)
}

// A decision log is a file anyone could have written: raw bytes that are not
// UTF-8 (a lone C1 CSI, 0x9b) inside its strings, and newlines and tabs that
// would forge a row of the listing.
func TestDecisionsOfAHandWrittenLog(t *testing.T) {
	l := newHostileLog(t)
	line := strings.SplitN(l.log, "\n", 2)[0]
	forged := "worker-9\n2026-01-01T00:00:00Z  0000  kubelet-serving  approve\tworker-1"
	encoded, err := json.Marshal(forged)
	require.NoError(t, err)
	nodeJSON, err := json.Marshal(termsafetest.Node)
	require.NoError(t, err)
	require.Contains(t, line, string(nodeJSON[1:len(nodeJSON)-1]))
	written := strings.ReplaceAll(line, string(nodeJSON[1:len(nodeJSON)-1]), "raw\x9b2J")
	written += "\n" + strings.ReplaceAll(line, string(nodeJSON[1:len(nodeJSON)-1]), string(encoded[1:len(encoded)-1])) + "\n"

	code, stdout, stderr := run(t, written, "decisions", "list", "--all")
	require.Equal(t, ExitOK, code, stderr)
	termsafetest.AssertInert(t, stdout)
	assert.Contains(t, stdout, "raw\ufffd2J", "the byte decoded, as JSON decoders do, to U+FFFD")
	assert.Contains(t, stdout, `worker-9\n2026-01-01T00:00:00Z  0000  kubelet-serving  approve\tworker-1`)
	assert.Len(t, strings.Split(strings.TrimRight(stdout, "\n"), "\n"), 3, "a header and two rows:\n%s", stdout)

	code, stdout, stderr = run(t, written, "decisions", "show", l.pending)
	require.Equal(t, ExitOK, code, stderr)
	termsafetest.AssertInert(t, stdout+stderr)
	assert.Contains(t, stdout, `"node": "raw\ufffd2J"`, "the input's JSON, as it was written")

	// A decision id is the log writer's too: -o name keeps each to its line.
	forgedID := strings.Replace(written, `"decision_id":"`+l.pending+`"`, `"decision_id":"evil\n\u001b[2Jdecision.cli.ichor.dev/forged"`, 1)
	require.NotEqual(t, written, forgedID)
	code, stdout, stderr = run(t, forgedID, "decisions", "list", "--all", "-o", "name")
	require.Equal(t, ExitOK, code, stderr)
	termsafetest.AssertInert(t, stdout)
	assert.Equal(t, "decision.cli.ichor.dev/evil\\n^[[2Jdecision.cli.ichor.dev/forged\n", strings.SplitAfter(stdout, "\n")[0])
	assert.Len(t, strings.Split(strings.TrimRight(stdout, "\n"), "\n"), 2, "one line a decision:\n%s", stdout)

	// So does -o jsonpath, which prints what it reaches as text.
	code, stdout, stderr = run(t, forgedID, "decisions", "list", "--all", "-o", `jsonpath={range .items[*]}{.id}{"\n"}{end}`)
	require.Equal(t, ExitOK, code, stderr)
	termsafetest.AssertInert(t, stdout)
	assert.Equal(t, "evil\\n^[[2Jdecision.cli.ichor.dev/forged\n", strings.SplitAfter(stdout, "\n")[0])
	assert.Len(t, strings.Split(strings.TrimRight(stdout, "\n"), "\n"), 2, "one line a decision:\n%s", stdout)
	// -o jsonpath-as-json is JSON, which escapes the newline itself: the id
	// reads back as it was written.
	code, stdout, stderr = run(t, forgedID, "decisions", "list", "--all", "-o", `jsonpath-as-json={.items[*].id}`)
	require.Equal(t, ExitOK, code, stderr)
	var ids []string
	require.NoError(t, json.Unmarshal([]byte(stdout), &ids))
	assert.Contains(t, ids, "evil\n\u001b[2Jdecision.cli.ichor.dev/forged")

	_, stdout, _ = run(t, strings.SplitN(written, "\n", 2)[0], "decisions", "show", l.pending, "-o", "json")
	termsafetest.AssertInert(t, stdout)
	var d struct {
		Entry struct {
			Result struct{ Node string } `json:"result"`
		} `json:"entry"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	assert.Equal(t, "raw\ufffd2J", d.Entry.Result.Node, "what a JSON decoder reads for the byte")
}

// An error quotes what it failed on; it reaches the terminal escaped.
func TestErrorsOnStandardErrorAreEscaped(t *testing.T) {
	l := newHostileLog(t)
	code, stdout, stderr := run(t, l.log, "decisions", "show", termsafetest.Node)
	assert.Equal(t, ExitError, code)
	assert.Empty(t, stdout)
	termsafetest.AssertInert(t, stderr)
	assert.Contains(t, stderr, "ichor: decision "+termsafetest.NodeEscaped+" is not in the log")

	code, _, stderr = run(t, "", "decisions", "list", filepath.Join(t.TempDir(), "\x1b[2J\u202e.log"))
	assert.Equal(t, ExitUsage, code)
	termsafetest.AssertInert(t, stderr)
	assert.Contains(t, stderr, `^[[2J\u202e.log`)
}

func TestAuditTableEscapesWhatTheKubeletServed(t *testing.T) {
	var out bytes.Buffer
	s := newStreams(nil, &out, &bytes.Buffer{})
	table := newTablePrintFlags(true)
	require.NoError(t, table.complete())
	require.NoError(t, printAudit(s.out, table, []auditRow{{
		Cluster: "demo", Machine: "worker-1", Node: termsafetest.Node, Status: engine.AuditDrifted,
		Reasons:    engine.Reasons{{Code: "CertificateNamesNotNode", Message: "the certificate names " + termsafetest.Node + "\nforged line"}},
		DecisionID: "d-1",
	}, {
		Cluster: "demo", Machine: "worker-2", Node: "worker-2", Status: engine.ActionError, Error: "handshake: \x1b]0;owned\x07",
	}}))
	s.flush()
	termsafetest.AssertInert(t, out.String())
	assert.Regexp(t, `demo/worker-1\s+`+regexp.QuoteMeta(termsafetest.NodeEscaped)+`\s+drifted`, out.String())
	assert.Contains(t, out.String(), "  CertificateNamesNotNode: the certificate names "+termsafetest.NodeEscaped+`\nforged line`+"\n")
	assert.Contains(t, out.String(), `demo/worker-2: no decision: handshake: ^[]0;owned\u0007`)
}

// The credential client's progress (a condition's reason, the endpoints of
// machines) is written to the escaped standard error.
func TestCredentialProgressIsEscaped(t *testing.T) {
	var errOut bytes.Buffer
	s := newStreams(nil, &bytes.Buffer{}, &errOut)
	r := credentialFlags{}.request(&cobra.Command{}, nil, "demo", s)
	_, err := r.Progress.Write([]byte(" answered after 1s: " + termsafetest.Node + "\n"))
	require.NoError(t, err)
	termsafetest.AssertInert(t, errOut.String())
	assert.Equal(t, " answered after 1s: "+termsafetest.NodeEscaped+"\n", errOut.String())
}

// render's patches are applied as they are: they keep every byte. The
// manager's decision log is JSON, escaped and the same document.
func TestOnlyRenderWritesRaw(t *testing.T) {
	var out, errOut bytes.Buffer
	s := newStreams(nil, &out, &errOut)
	assert.Same(t, &out, s.rawOut)
	opts, err := managerOptions{bundleLimits: bundles.DefaultLimits, bundlePoll: engine.DefaultPollInterval, logFileMaxMiB: 1, logFileMaxBackups: 1, logFlushTimeout: time.Second, logBuffer: engine.DefaultDecisionLogBufferEvents}.engineOptions(s)
	require.NoError(t, err)
	assert.Same(t, s.out, opts.DecisionLog)
	assert.Same(t, s.err, opts.Log)
}

// The writer's cut sequence is written when the command ends.
func TestRunFlushesTheEscapedStreams(t *testing.T) {
	var out bytes.Buffer
	s := newStreams(nil, &out, &bytes.Buffer{})
	_, err := s.out.Write([]byte("cut \xe6"))
	require.NoError(t, err)
	assert.Equal(t, "cut ", out.String())
	s.flush()
	assert.Equal(t, `cut \ufffd`, out.String())
}

// A logged action is the log writer's too: it cannot add a line of the
// report's own (review 22 of the CLI's output: "No decision would change."
// under a change). An action no approver knows was no verdict: the manager
// refused it, and the replay reads it so (review 257), naming nothing of it
// in the heading.
func TestReplayHeadingsKeepTheLoggedActionToItsLine(t *testing.T) {
	l := newHostileLog(t)
	line := strings.SplitN(l.log, "\n", 2)[0]
	require.Contains(t, line, `"action":"pending"`)
	forged := strings.Replace(line, `"action":"pending"`, `"action":"x\n\nNo decision would change.\n\tfake"`, 1) + "\n"
	code, stdout, stderr := run(t, forged, "decisions", "replay", "--bundle", "../../policy")
	require.Equal(t, ExitOK, code, stderr)
	termsafetest.AssertInert(t, stdout)
	assert.NotContains(t, stdout, "\nNo decision would change.", "a logged action added a line:\n%s", stdout)
	assert.Contains(t, stdout, "error → pending")
}
