package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ichor-dev/ichor-policy/policy"
)

// PolicyWithoutServingIPCheck is a copy of the shipped policy tree, in the
// test's temporary directory, whose kubelet-serving rule no longer checks IP
// addresses: a candidate bundle that decides some requests otherwise, for
// the tests of check-csr and replay.
func PolicyWithoutServingIPCheck(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, policy.FS); err != nil {
		t.Fatalf("copy the policy tree: %v", err)
	}
	path := filepath.Join(dir, "ichor", "kubelet_serving", "kubelet_serving.rego")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Replace(string(src), "\tsan.type == \"ip\"\n\tnot san.value in", "\tsan.type == \"ip-disabled\"\n\tnot san.value in", 1)
	if out == string(src) {
		t.Fatal("the IP check was not found in the kubelet-serving rule")
	}
	// Copied from an embed.FS, the files are read-only.
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil { //nolint:gosec // G703: a file of the test's temporary directory
		t.Fatal(err)
	}
	return dir
}
