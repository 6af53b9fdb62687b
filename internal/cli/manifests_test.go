package cli_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// yamlDoc is obj as kubectl get -o yaml prints it.
func yamlDoc(t *testing.T, obj any) string {
	t.Helper()
	b, err := yaml.Marshal(obj)
	require.NoError(t, err)
	return string(b)
}

func jsonDoc(t *testing.T, obj any) string {
	t.Helper()
	b, err := json.MarshalIndent(obj, "", "  ")
	require.NoError(t, err)
	return string(b)
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// TestCheckCSRReadsEveryDocument: -f reads every document of a file, of
// standard input, of a directory (its links to files too, as kubectl) and of
// every -f, and refuses a document that is not a CSR rather than deciding the
// others silently, and a directory that holds nothing to decide, as an empty
// file. Before, a second
// document after "---" was dropped unread and the command exited 0.
func TestCheckCSRReadsEveryDocument(t *testing.T) {
	good := csrgen.ServingObject("csr-good", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}}))
	forged := csrgen.ServingObject("csr-forged", "worker-1", request(t, csrgen.Request{IPs: []net.IP{net.ParseIP("10.5.0.3")}}))
	secret := map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s"}}
	dir := t.TempDir()
	twoYAML := writeFile(t, dir, "two.yaml", yamlDoc(t, good)+"---\n"+yamlDoc(t, forged))
	twoJSON := writeFile(t, dir, "two.json", jsonDoc(t, good)+"\n"+jsonDoc(t, forged))
	oneGood := writeFile(t, dir, "good.yaml", "---\n# kubectl get csr csr-good -o yaml\n"+yamlDoc(t, good)+"---\n")
	oneForged := writeFile(t, dir, "forged.yaml", yamlDoc(t, forged))
	withSecret := writeFile(t, dir, "secret.yaml", yamlDoc(t, good)+"---\n"+yamlDoc(t, secret))
	empty := writeFile(t, dir, "empty.yaml", "---\n# nothing\n")
	manifests := t.TempDir()
	writeFile(t, manifests, "a.yaml", yamlDoc(t, good))
	writeFile(t, manifests, "b.json", jsonDoc(t, forged))
	writeFile(t, manifests, "README.md", "not read")
	require.NoError(t, os.Mkdir(filepath.Join(manifests, "sub"), 0o700))
	writeFile(t, manifests, "sub/c.yaml", yamlDoc(t, secret))
	// A link to a file is read as the file; a link to a directory or to
	// nothing is not.
	linked := t.TempDir()
	require.NoError(t, os.Symlink(oneForged, filepath.Join(linked, "forged.yaml")))
	require.NoError(t, os.Symlink(manifests, filepath.Join(linked, "dir.yaml")))
	require.NoError(t, os.Symlink(filepath.Join(dir, "nothing.yaml"), filepath.Join(linked, "dangling.yaml")))
	onlyLinksAstray := t.TempDir()
	require.NoError(t, os.Symlink(manifests, filepath.Join(onlyLinksAstray, "dir.yaml")))
	emptyDir := t.TempDir()
	// A file name that would print a line of its own.
	forging := t.TempDir()
	writeFile(t, forging, "a\nichor: forged.yaml", yamlDoc(t, secret))

	for _, tc := range []struct {
		name  string
		stdin string
		files []string
		code  int
		// want are the decided requests' names and actions, one JSON
		// line each; wantOne is the single request's action, indented.
		want    []string
		wantOne string
		stderr  string
	}{
		{name: "two YAML documents", files: []string{twoYAML}, want: []string{"csr-good approve", "csr-forged deny"}},
		{name: "two JSON objects", files: []string{twoJSON}, want: []string{"csr-good approve", "csr-forged deny"}},
		{name: "two YAML documents on standard input", stdin: yamlDoc(t, good) + "---\n" + yamlDoc(t, forged), files: []string{"-"}, want: []string{"csr-good approve", "csr-forged deny"}},
		{name: "a directory", files: []string{manifests}, want: []string{"csr-good approve", "csr-forged deny"}},
		{name: "-f repeated", files: []string{oneForged, oneGood}, want: []string{"csr-forged deny", "csr-good approve"}},
		{name: "a directory holding a link to a file", files: []string{linked}, want: []string{"csr-forged deny"}},
		{name: "a file named to forge a line", files: []string{forging}, code: cli.ExitUsage, stderr: `a\nichor: forged.yaml is a Secret`},
		{name: "an empty directory", files: []string{emptyDir}, code: cli.ExitUsage, stderr: "holds no manifest file (.yaml, .yml, .json)"},
		{name: "a directory of links to no file", files: []string{onlyLinksAstray}, code: cli.ExitUsage, stderr: "holds no manifest file"},
		{name: "one document between separators and comments", files: []string{oneGood}, wantOne: engine.ActionApprove},
		{name: "a Secret after a CSR", files: []string{withSecret}, code: cli.ExitUsage, stderr: "secret.yaml document 2 is a Secret (v1), not a certificates.k8s.io/v1 CertificateSigningRequest"},
		{name: "no document", files: []string{empty}, code: cli.ExitUsage, stderr: "empty.yaml holds no manifest"},
		{name: "a JSON array", stdin: "[]", files: []string{"-"}, code: cli.ExitUsage, stderr: "- is a JSON array, not a Kubernetes object"},
		{name: "a list whose items are no list", stdin: `{"apiVersion": "v1", "kind": "List", "items": 3}`, files: []string{"-"}, code: cli.ExitUsage, stderr: "- is not a Kubernetes object: its items is a JSON number"},
		{name: "standard input twice", files: []string{"-", "-"}, code: cli.ExitUsage, stderr: `"-" (standard input) is given twice`},
		{name: "a file that is not there", files: []string{filepath.Join(dir, "nothing.yaml")}, code: cli.ExitUsage, stderr: "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"policy", "check-csr", "-o", "json"}
			for _, f := range tc.files {
				args = append(args, "-f", f)
			}
			code, stdout, stderr := run(t, tc.stdin, append(args, identity...)...)
			require.Equal(t, tc.code, code, stderr)
			assert.Contains(t, stderr, tc.stderr)
			switch {
			case tc.wantOne != "":
				var d engine.CSRDecision
				require.NoError(t, json.Unmarshal([]byte(stdout), &d), stdout)
				assert.Equal(t, tc.wantOne, d.Action)
			case tc.code != cli.ExitOK:
				assert.Empty(t, stdout)
			default:
				var got []string
				for _, l := range checkLines(t, stdout) {
					got = append(got, l.CSR+" "+l.Action)
				}
				assert.Equal(t, tc.want, got)
			}
		})
	}
}

// TestCheckCSRBoundsWhatItReads: an input beyond the bound is refused
// before it is decoded.
func TestCheckCSRBoundsWhatItReads(t *testing.T) {
	big := strings.Repeat(" ", 32<<20+1)
	code, stdout, stderr := run(t, big, "policy", "check-csr", "-o", "json", "-f", "-", "--machine-unknown")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "- is larger than 33554432 bytes")

	obj := csrgen.ServingObject("csr-x", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}}))
	obj.Spec.SignerName = certificatesv1.KubeletServingSignerName
	doc := jsonDoc(t, obj)
	many := strings.Repeat(doc+"\n", 10001)
	code, _, stderr = run(t, many, "policy", "check-csr", "-o", "json", "-f", "-", "--machine-unknown")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "more than 10000")
}
