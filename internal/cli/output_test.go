package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/termsafe/termsafetest"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// outputCommand is a command that prints, and what each -o shows of it.
type outputCommand struct {
	name string
	args []string
	// table is a command whose human form is a table (else text): it
	// takes -o wide, whose column wide names.
	table bool
	wide  string
	// human matches the default output.
	human string
	// kind is the document's kind; named what -o name prints, "" for a
	// command whose document has no name (-o name refused).
	kind, named string
	// jsonpath is a template and what it prints.
	jsonpath, want string
}

// TestOutputIsAFormatEverywhere: -o means one thing in every command that
// prints, as in kubectl: an output format (table by default where the output
// is rows, or text where it is one thing; wide; json, yaml and kyaml; name;
// jsonpath=, jsonpath-file=), through cli-runtime's printers; anything else,
// a file name where a format belongs included, is refused (exit 2) with
// kubectl's words. A request named to forge a row and retitle the terminal
// is escaped in the table's cell and in -o name, and kept exactly in -o json.
func TestOutputIsAFormatEverywhere(t *testing.T) {
	dir := t.TempDir()
	log := decisionLog(t, dir)
	code, id, stderr := run(t, "", "decisions", "list", log, "-o", "jsonpath={.items[0].id}")
	require.Equal(t, cli.ExitOK, code, stderr)
	require.NotEmpty(t, id)

	hostile := "csr-\x1b]0;owned\x07\x1b[2J\nforged-row\tx"
	escaped := `csr-^[]0;owned\u0007^[[2J\nforged-row\tx`
	csr := manifest(t, csrgen.ServingObject(hostile, "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})), false)
	client := manifest(t, clientObject(t, "csr-client", "system:node:worker-1", csrgen.NodeSubject("worker-1")), false)
	check := append([]string{"policy", "check-csr", "-f", csr}, identity...)

	for _, c := range []outputCommand{
		{name: "decisions list", args: []string{"decisions", "list", log}, table: true, wide: "PATH",
			human: `(?m)^TIME\s+ID\s+POLICY\s+ACTION\s+NODE/USER\s+CODES\s+REVISION\n\S+\s+` + id + `\s+kubelet-serving\s+pending\s+worker-1\s+MachineUnknown\s+sha256:`,
			kind:  "List", named: "decision.cli.ichor.dev/" + id + "\n", jsonpath: "{.items[*].id}", want: id},
		{name: "decisions show", args: []string{"decisions", "show", id, log},
			human: `(?m)^Decision:\s+` + id + `$`, kind: "Decision", named: "decision.cli.ichor.dev/" + id + "\n", jsonpath: "{.entry.result.action}", want: "pending"},
		{name: "decisions replay", args: []string{"decisions", "replay", log, "--bundle", "../../policy"}, table: true,
			human: `(?m)^CHANGE\s+DECISIONS\nunchanged\s+1$`, kind: "DecisionReplay", jsonpath: "{.replayed}", want: "1"},
		{name: "policy check-csr", args: check, table: true, wide: "REVISION",
			human: `(?m)^CSR\s+ACTION\s+NODE\s+CODES\s+DECISION\n` + regexp.QuoteMeta(escaped) + `\s+approve\s+worker-1\s+IchorKubeletServing\s+\S+\n\n`,
			kind:  "CSRDecision", named: "csrdecision.cli.ichor.dev/" + escaped + "\n", jsonpath: "{.action}", want: "approve"},
		{name: "check several", args: append([]string{"policy", "check-csr", "-f", csr, "-f", csr}, identity...), table: true, wide: "KIND",
			human: `(?m)^CSR\s+ACTION\s+NODE\s+CODES\s+DECISION\n(` + regexp.QuoteMeta(escaped) + `\s+approve\s.*\n){2}\n`,
			kind:  "List", named: strings.Repeat("csrdecision.cli.ichor.dev/"+escaped+"\n", 2), jsonpath: "{.items[*].action}", want: "approve approve"},
		{name: "policy check-client-csr", args: []string{"policy", "check-client-csr", "-f", client, "--authorized", "selfnodeclient"}, table: true, wide: "KIND",
			human: `(?m)^csr-client\s+approve\s+worker-1\s+IchorKubeletClient\s`, kind: "CSRDecision", named: "csrdecision.cli.ichor.dev/csr-client\n",
			jsonpath: "{.request_kind}", want: "selfnodeclient"},
		{name: "version", args: []string{"version"}, human: `(?m)^ichor:\s+\S+\n`, kind: "Version", jsonpath: "{.go_version}", want: "go1."},
	} {
		t.Run(c.name, func(t *testing.T) { testOutputFormats(t, c, dir) })
	}

	// Where -o named a file, the old command line is refused, saying which
	// flag writes it now, and nothing is written.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bundle", "build", "-o", filepath.Join(dir, "b.tar.gz")}, "the file to write is --out FILE"},
		{[]string{"render", "kubelet-serving", "-f", "x.yaml", "-o", dir}, "the file to write is --output-dir DIR"},
		{[]string{"cluster", "talosconfig", "demo", "-o", filepath.Join(dir, "t")}, "the file to write is --out FILE"},
		{[]string{"cluster", "kubeconfig", "demo", "-o", filepath.Join(dir, "k")}, "the file to write is --out FILE"},
		// --exec wrote to its default file, -o ignored (review of 2026-12-06).
		{[]string{"cluster", "kubeconfig", "demo", "--exec", "-o", filepath.Join(dir, "k")}, "the file to write is --out FILE"},
	} {
		t.Run(strings.Join(tc.args[:len(tc.args)-2], " ")+" -o FILE", func(t *testing.T) {
			code, stdout, stderr := run(t, "", tc.args...)
			assert.Equal(t, cli.ExitUsage, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, "-o is an output format in ichor, as in kubectl")
			assert.Contains(t, stderr, tc.want)
		})
	}
	assert.NoFileExists(t, filepath.Join(dir, "b.tar.gz"))
}

// testOutputFormats runs c in every format.
func testOutputFormats(t *testing.T, c outputCommand, dir string) {
	out := func(t *testing.T, format ...string) string {
		t.Helper()
		code, stdout, stderr := run(t, "", append(append([]string{}, c.args...), format...)...)
		require.Equal(t, cli.ExitOK, code, stderr)
		termsafetest.AssertInert(t, stdout)
		return stdout
	}
	refused := func(t *testing.T, format string) string {
		t.Helper()
		code, stdout, stderr := run(t, "", append(append([]string{}, c.args...), "-o", format)...)
		assert.Equal(t, cli.ExitUsage, code)
		assert.Empty(t, stdout)
		return stderr
	}
	human := out(t)
	assert.Regexp(t, c.human, human)
	if c.table {
		assert.Regexp(t, c.human, out(t, "-o", "table"))
		if c.wide != "" {
			assert.NotContains(t, human, c.wide)
			assert.Contains(t, out(t, "-o", "wide"), c.wide)
		}
	} else {
		assert.Regexp(t, c.human, out(t, "-o", "text"))
		assert.Contains(t, refused(t, "wide"), `unable to match a printer suitable for the output format "wide"`)
	}

	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out(t, "-o", "json")), &doc))
	assert.Equal(t, c.kind, doc["kind"])
	if c.kind != "List" {
		assert.Equal(t, "cli.ichor.dev/v1alpha1", doc["apiVersion"])
	}
	if strings.Contains(c.named, "forged") {
		// JSON keeps the name exactly; the stream's escapes are JSON's.
		items, ok := doc["items"].([]any)
		if !ok {
			items = []any{doc}
		}
		for _, item := range items {
			assert.Equal(t, "csr-\x1b]0;owned\x07\x1b[2J\nforged-row\tx", item.(map[string]any)["metadata"].(map[string]any)["name"])
		}
	}
	require.NoError(t, yaml.Unmarshal([]byte(out(t, "-o", "yaml")), &doc))
	assert.Equal(t, c.kind, doc["kind"])
	assert.Contains(t, out(t, "-o", "kyaml"), "kind: \""+c.kind+"\"")

	if c.named != "" {
		assert.Equal(t, c.named, out(t, "-o", "name"), "one line a name, escaped")
	} else {
		stderr := refused(t, "name")
		assert.Contains(t, stderr, `unable to match a printer suitable for the output format "name"`)
		assert.NotContains(t, stderr, ",name,")
	}

	assert.Contains(t, out(t, "-o", "jsonpath="+c.jsonpath), c.want)
	template := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".jsonpath")
	require.NoError(t, os.WriteFile(template, []byte(c.jsonpath), 0o600))
	assert.Contains(t, out(t, "-o", "jsonpath-file="+template), c.want)
	assert.Contains(t, refused(t, "jsonpath={.items["), "error parsing jsonpath")
	assert.Contains(t, refused(t, "jsonpath"), "template format specified but no template given")

	for _, format := range []string{"xml", "out.json", "Table"} {
		stderr := refused(t, format)
		assert.Contains(t, stderr, "unable to match a printer suitable for the output format")
	}
	stderr := refused(t, "xml")
	human0 := "table,wide"
	if !c.table {
		human0 = "text"
	}
	assert.Contains(t, stderr, `ichor: unable to match a printer suitable for the output format "xml", allowed formats are: json,jsonpath,jsonpath-as-json,jsonpath-file,kyaml,`)
	assert.Contains(t, stderr, human0)
}

// TestYAMLOutputsKeepEveryCharacterARequesterWrote: a request named with
// characters JSON keeps as they are and a YAML reader refuses (DEL, the C1
// controls, a C1 CSI among them, U+FFFE) is read from kubectl's JSON, prints
// in -o yaml and -o kyaml as in -o json, and reads back as the very name;
// before, the input was refused ("neither YAML nor JSON", exit 2) and, read
// otherwise, the whole output failed ("yaml: control characters are not
// allowed", exit 1).
func TestYAMLOutputsKeepEveryCharacterARequesterWrote(t *testing.T) {
	for _, hostile := range []string{
		"csr-\x7f\u0085\u009b31mred\u009dx\ufffe\uffff-\u202eend",
		// Characters YAML writes as they are and the streams escape: the
		// string must be double-quoted for the escape to read back as the
		// character (review 22: plain, single-quoted and block strings
		// read back as the six characters of the escape).
		"csr-\u202eend",
		"*csr\u200b",
		"csr\n\u00ad\ue000",
		// What a YAML 1.1 reader would take for another type.
		"on", "n", "0123", "1:20",
		// A block that starts with a line break (review 23: read back
		// without its leading spaces, or not at all).
		"\n  csr-x", "\n\n  csr\nx",
	} {
		t.Run(hostile, func(t *testing.T) { yamlKeepsTheName(t, hostile) })
	}
}

func yamlKeepsTheName(t *testing.T, hostile string) {
	t.Helper()
	// Read as kubectl get -o json writes it (its -o yaml fails on it).
	csr := manifest(t, csrgen.ServingObject(hostile, "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})), true)
	// In any case, as cli-runtime takes it (review 202 F4: -o YAML printed
	// U+202E as a plain scalar the terminal's escape then changed).
	for _, format := range []string{"json", "yaml", "kyaml", "YAML", "Json"} {
		code, stdout, stderr := run(t, "", append([]string{"policy", "check-csr", "-f", csr, "-o", format}, identity...)...)
		require.Equal(t, cli.ExitOK, code, "-o %s: %s", format, stderr)
		assert.NotContains(t, stdout, "\u009b", "-o %s: a C1 CSI reached the terminal", format)
		var doc struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(stdout), &doc), "-o %s", format)
		assert.Equal(t, hostile, doc.Metadata.Name, "-o %s", format)
	}
}
