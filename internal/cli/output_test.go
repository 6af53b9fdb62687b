package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// TestOutputIsAFormatEverywhere: -o is an output format in every command
// that prints a document, with one vocabulary (json, yaml and jsonpath=
// everywhere, and the human form by default), and a file or directory is
// never -o: where it was, the old command line is refused with the flag that
// writes it now.
func TestOutputIsAFormatEverywhere(t *testing.T) {
	dir := t.TempDir()
	log := decisionLog(t, dir)
	code, stdout, stderr := run(t, "", "decisions", "list", log, "-o", "name")
	require.Equal(t, cli.ExitOK, code, stderr)
	id := strings.TrimSpace(stdout)
	require.NotEmpty(t, id)

	csr := manifest(t, csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})), false)
	commands := map[string][]string{
		"policy check-csr": append([]string{"policy", "check-csr", "-f", csr}, identity...),
		"check several":    append([]string{"policy", "check-csr", "-f", csr, "-f", csr}, identity...),
		"version":          {"version"},
		"decisions list":   {"decisions", "list", log},
		"decisions show":   {"decisions", "show", id, log},
		"decisions replay": {"decisions", "replay", log, "--bundle", "../../policy"},
	}
	// A JSONPath each command's document answers, and what it prints.
	jsonpath := map[string][2]string{
		"policy check-csr": {"{.action}", "approve"},
		"check several":    {"{.items[*].csr}", "csr-1 csr-1"},
		"version":          {"{.go_version}", "go1."},
		"decisions list":   {"{.items[*].id}", id},
		"decisions show":   {"{.decision_id}", id},
		"decisions replay": {"{.replayed}", "1"},
	}
	for name, args := range commands {
		for _, tc := range []struct {
			output string
			check  func(t *testing.T, stdout string)
		}{
			{"json", func(t *testing.T, stdout string) {
				for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
					assert.True(t, json.Valid([]byte(l)) || json.Valid([]byte(stdout)), stdout)
				}
			}},
			{"yaml", func(t *testing.T, stdout string) {
				var doc map[string]any
				require.NoError(t, yaml.Unmarshal([]byte(stdout), &doc), stdout)
				assert.NotEmpty(t, doc)
			}},
			{"jsonpath=" + jsonpath[name][0], func(t *testing.T, stdout string) {
				assert.Contains(t, stdout, jsonpath[name][1])
			}},
		} {
			t.Run(name+" -o "+tc.output, func(t *testing.T) {
				code, stdout, stderr := run(t, "", append(args, "-o", tc.output)...)
				require.Equal(t, cli.ExitOK, code, stderr)
				tc.check(t, stdout)
			})
		}
		t.Run(name+" -o a file", func(t *testing.T) {
			code, stdout, stderr := run(t, "", append(args, "-o", "out.json")...)
			assert.Equal(t, cli.ExitUsage, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, `-o "out.json": -o is the output format (`)
		})
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"decisions list -o wide", []string{"decisions", "list", log, "-o", "wide"}, "PATH"},
		{"decisions list -o name", []string{"decisions", "list", log, "-o", "name"}, id + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", tc.args...)
			require.Equal(t, cli.ExitOK, code, stderr)
			assert.Contains(t, stdout, tc.want)
		})
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
	} {
		t.Run(strings.Join(tc.args[:2], " ")+" -o FILE", func(t *testing.T) {
			code, stdout, stderr := run(t, "", tc.args...)
			assert.Equal(t, cli.ExitUsage, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, "-o is an output format in ichor, as in kubectl")
			assert.Contains(t, stderr, tc.want)
		})
	}
	assert.NoFileExists(t, filepath.Join(dir, "b.tar.gz"))
}
