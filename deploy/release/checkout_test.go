package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A release is refused from a tree with changes, from a commit past its
// tag or without one, and into a directory holding an earlier release's
// files (review 62, the build's supply chain).
func TestAReleaseIsBuiltOnlyFromACleanCheckoutOfItsTag(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	run("init", "-q")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o600))
	run("add", "main.go")
	run("commit", "-q", "-m", "one")
	ctx := t.Context()

	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.0"), "HEAD is not the tag v0.2.0", "untagged")
	run("tag", "v0.2.0")
	require.NoError(t, CheckCheckout(ctx, dir, "v0.2.0"))
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.3.0"), "HEAD is not the tag v0.3.0", "another tag's name")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main // changed\n"), 0o600))
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.0"), "the work tree has changes")
	run("commit", "-q", "-am", "two")
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.0"), "HEAD is not the tag v0.2.0", "a commit past the tag")
	run("tag", "v0.2.1")
	require.NoError(t, CheckCheckout(ctx, dir, "v0.2.1"))
	// An untracked Go file is compiled into its package: a change.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "extra.go"), []byte("package main\n"), 0o600))
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.1"), "?? extra.go")
	// Ignored, it is compiled all the same (review 183); the build's own
	// outputs are not.
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("extra.go\n/bin/\n/dist/\n*.test\n"), 0o600))
	run("add", ".gitignore")
	run("commit", "-q", "-m", "ignore")
	run("tag", "-f", "v0.2.1")
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.1"), "!! extra.go", "an ignored Go file")
	require.NoError(t, os.Remove(filepath.Join(dir, "extra.go")))
	for _, output := range []string{"bin/tools/helm", "dist/SHA256SUMS", "engine.test"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, output)), 0o750))
		require.NoError(t, os.WriteFile(filepath.Join(dir, output), nil, 0o600))
	}
	require.NoError(t, CheckCheckout(ctx, dir, "v0.2.1"), "the build's own outputs")
	// Deeper, such a name is no output of the build: an ignored file of
	// policy/ is embedded (review 184).
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "policy", "ichor"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "policy", "ichor", "x.test"), nil, 0o600))
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.1"), "!! policy/ichor/x.test")
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "policy")))
	// The caller's GIT_WORK_TREE (a clean copy elsewhere) does not decide
	// what is looked at (review 184).
	clean := t.TempDir()
	current, err := os.ReadFile(filepath.Join(dir, "main.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(clean, "main.go"), current, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(clean, ".gitignore"), []byte("extra.go\n/bin/\n/dist/\n*.test\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main // changed again\n"), 0o600))
	t.Setenv("GIT_WORK_TREE", clean)
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.1"), "main.go", "the release tree's change, hidden by another work tree")
	require.NoError(t, os.Unsetenv("GIT_WORK_TREE"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), current, 0o600))
	// A tracked file git is told not to look at.
	run("update-index", "--skip-worktree", "main.go")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main // not the tag's\n"), 0o600))
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.1"), `"main.go"`)
	run("update-index", "--no-skip-worktree", "main.go")
	run("checkout", "main.go")
	run("update-index", "--assume-unchanged", "main.go")
	assert.ErrorContains(t, CheckCheckout(ctx, dir, "v0.2.1"), "assume-unchanged")
	run("update-index", "--no-assume-unchanged", "main.go")
	require.NoError(t, CheckCheckout(ctx, dir, "v0.2.1"))
	// The final tag on a release candidate's commit, the candidate's
	// annotated tag beside it (git describe would name that one).
	run("tag", "-a", "-m", "rc", "v0.2.2-rc.1")
	run("tag", "v0.2.2")
	require.NoError(t, CheckCheckout(ctx, dir, "v0.2.2"))

	notGit := CheckCheckout(ctx, t.TempDir(), "v0.2.0")
	assert.ErrorContains(t, notGit, "a release is built from a git checkout of its tag: git status --porcelain")
	assert.NotContains(t, notGit.Error(), "core.", "the command named as the caller gave it")
	// Only the caller's choice of another repository is dropped (review
	// 185): a container's safe.directory comes in GIT_CONFIG_*.
	assert.Equal(t, []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "HOME=/h"},
		gitEnv([]string{"GIT_DIR=/x", "GIT_CONFIG_COUNT=1", "GIT_WORK_TREE=/y", "GIT_CONFIG_KEY_0=safe.directory", "GIT_INDEX_FILE=/z", "HOME=/h"}))
	assert.NotNil(t, gitEnv(nil), "an empty environment is no environment inherited")

	// The revision stamped is the commit checked out (review 183).
	head, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	require.NoError(t, CheckRevision(ctx, dir, strings.TrimSpace(string(head))))
	assert.ErrorContains(t, CheckRevision(ctx, dir, "0123456789abcdef0123456789abcdef01234567"), "is not HEAD")
	assert.ErrorContains(t, CheckRevision(ctx, dir, ""), "is not HEAD")

	out := filepath.Join(t.TempDir(), "dist")
	require.NoError(t, CheckOutEmpty(out), "absent")
	require.NoError(t, os.Mkdir(out, 0o750))
	require.NoError(t, CheckOutEmpty(out), "empty")
	require.NoError(t, os.WriteFile(filepath.Join(out, "ichor_darwin_arm64.tar.gz"), nil, 0o600))
	assert.ErrorContains(t, CheckOutEmpty(out), "holds 1 files already (ichor_darwin_arm64.tar.gz...)")
}
