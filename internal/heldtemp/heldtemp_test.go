//go:build unix

package heldtemp_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/heldtemp"
)

// TestMain runs, under HELDTEMP_CHILD, a process that makes a directory,
// says its path and lives until its standard input ends (the test's end) or
// it is killed. (Blocked on nothing else, the runtime would end it as
// deadlocked.)
func TestMain(m *testing.M) {
	if os.Getenv("HELDTEMP_CHILD") != "" {
		d, _, err := heldtemp.Make("ichor-test-")
		if err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString(d.Path() + "\n")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process killed while it holds its directory (SIGKILL: nothing of its
// own runs) leaves it behind; the next process to make one removes it, and
// leaves alone the directory of a process alive.
func TestADirectoryOfAProcessKilledIsRemovedByTheNext(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	heldtemp.SetStaleAge(t.Cleanup, 0)
	child := func() (*exec.Cmd, string) {
		cmd := exec.Command(os.Args[0], "-test.run", "^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), "HELDTEMP_CHILD=1")
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		in, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		return cmd, line[:len(line)-1]
	}
	killed, killedDir := child()
	alive, aliveDir := child()
	require.NoError(t, killed.Process.Signal(syscall.SIGKILL))
	_, err := killed.Process.Wait()
	require.NoError(t, err)
	require.DirExists(t, killedDir)

	d, removed, err := heldtemp.Make("ichor-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Remove() })
	assert.Equal(t, 1, removed)
	assert.NoDirExists(t, killedDir)
	assert.DirExists(t, aliveDir, "a live process's directory")
	require.NoError(t, alive.Process.Signal(syscall.Signal(0)), "the live process lives")
	assert.DirExists(t, d.Path())

	require.NoError(t, d.Remove())
	assert.NoDirExists(t, d.Path())
}

// What the sweep cannot tell is nobody's is left: a directory without a
// lock file (being made, or not made here), one whose lock file is younger
// than the bound (its process may be about to lock it), a link, another
// pattern's.
func TestWhatCannotBeToldNobodysIsLeft(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	heldtemp.SetStaleAge(t.Cleanup, time.Hour)
	old := time.Now().Add(-2 * time.Hour)
	mk := func(name string, lock bool, mtime time.Time) string {
		p := filepath.Join(tmp, name)
		require.NoError(t, os.Mkdir(p, 0o700))
		if lock {
			require.NoError(t, os.WriteFile(filepath.Join(p, ".held"), nil, 0o600))
			require.NoError(t, os.Chtimes(filepath.Join(p, ".held"), mtime, mtime))
		}
		return p
	}
	unlocked := mk("ichor-test-nolock", false, old)
	young := mk("ichor-test-young", true, time.Now())
	other := mk("other-stale", true, old)
	stale := mk("ichor-test-stale", true, old)
	target := mk("target", true, old)
	require.NoError(t, os.Symlink(target, filepath.Join(tmp, "ichor-test-link")))

	d, removed, err := heldtemp.Make("ichor-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Remove() })
	assert.Equal(t, 1, removed)
	assert.NoDirExists(t, stale)
	for _, kept := range []string{unlocked, young, other, target, filepath.Join(tmp, "ichor-test-link")} {
		_, err := os.Lstat(kept)
		assert.NoError(t, err, kept)
	}
}
