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
	return policyWith(t, filepath.Join("ichor", "kubelet_serving", "names.rego"),
		"\tsan.type == \"ip\"\n\tvalue :=", "\tsan.type == \"ip-disabled\"\n\tvalue :=")
}

// PolicyWithWiderTalosconfig is a copy of the shipped policy tree whose
// talosconfig-reader purpose grants a credential for a working day (twelve
// hours) by default, where the shipped one grants one for an hour: a
// candidate that admits and issues the same requests, under the same
// reason codes, and grants more, for the tests of replay and the shadow
// bundle. (It granted os:admin until the rule held talosconfig-reader to
// os:reader whatever the table says: review 212.)
func PolicyWithWiderTalosconfig(t testing.TB) string {
	t.Helper()
	return policyWith(t, filepath.Join("ichor", "credentials", "data.json"),
		`"talos_role": "os:reader",
        "credential": "talosconfig",
        "default_lifetime_seconds": 3600,`,
		`"talos_role": "os:reader",
        "credential": "talosconfig for a working day",
        "default_lifetime_seconds": 43200,`)
}

// policyWith is a copy of the shipped policy tree, in the test's temporary
// directory, with old replaced by replacement once in the file at path.
func policyWith(t testing.TB, path, old, replacement string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, policy.FS); err != nil {
		t.Fatalf("copy the policy tree: %v", err)
	}
	path = filepath.Join(dir, path)
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Replace(string(src), old, replacement, 1)
	if out == string(src) {
		t.Fatalf("%q was not found in %s", old, path)
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
