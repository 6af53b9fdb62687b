package cli

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/test/harness"
)

// An interrupted command gives the prompt back, whatever it waits on: the
// commands that wait on what watches no context (a FIFO nobody writes, an
// API server that accepted the connection and never answers: client
// libraries' discovery takes no context) are left interruptGrace after the
// first signal, with a shell's status for the signal, and a second signal
// ends them at once. Before, only SIGKILL ended them.
func TestAnInterruptedCommandStopsWhateverItWaitsOn(t *testing.T) {
	ichor, err := harness.BuildIchor(t.TempDir())
	require.NoError(t, err)
	dir := t.TempDir()

	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))

	// A server that completes TLS and never answers.
	answer := make(chan struct{})
	stall := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-answer }))
	t.Cleanup(func() { close(answer); stall.Close() })
	kubeconfig := filepath.Join(dir, "stall.kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: stall, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: stall, context: {cluster: stall, user: u}}]
current-context: stall
`, stall.URL), 0o600))

	for _, tc := range []struct {
		name   string
		args   []string
		signal syscall.Signal
		second bool
		want   int
	}{
		{"a FIFO nobody writes, SIGINT", []string{"decisions", "list", fifo}, syscall.SIGINT, false, 130},
		{"a FIFO nobody writes, SIGTERM twice", []string{"decisions", "list", fifo}, syscall.SIGTERM, true, 143},
		{"a request fetched from a server that never answers", []string{"policy", "check-csr", "csr-1", "--nodename", "n1", "--kubeconfig", kubeconfig}, syscall.SIGINT, false, 130},
		{"an audit of a server that never answers", []string{"audit", "kubelet-serving", "--kubeconfig", kubeconfig}, syscall.SIGTERM, false, 143},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Read while the process writes it (harness.DecisionLog is
			// the project's locked buffer).
			stderr := &harness.DecisionLog{}
			cmd := exec.Command(ichor, tc.args...)
			cmd.Stderr = stderr
			// What the command makes to clean up (the policy engine's
			// directory) is made before its waits that watch no context,
			// or not at all: a command left after interruptGrace runs no
			// deferred stop.
			tmp := t.TempDir()
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			require.NoError(t, cmd.Start())
			ended := make(chan error, 1)
			go func() { ended <- cmd.Wait() }()
			t.Cleanup(func() { _ = cmd.Process.Kill() })

			// Waiting: not ended on its own.
			select {
			case err := <-ended:
				t.Fatalf("the command ended before it was interrupted (%v): %s", err, stderr.String())
			case <-time.After(time.Second):
			}
			require.NoError(t, cmd.Process.Signal(tc.signal))
			if tc.second {
				// Once the first is taken: two sent at once are one (the
				// kernel keeps one of a kind pending).
				require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "stopping; again to stop at once") },
					10*time.Second, 10*time.Millisecond, "the first signal was not taken: %s", stderr.String())
				require.NoError(t, cmd.Process.Signal(tc.signal))
			}
			select {
			case err := <-ended:
				var exit *exec.ExitError
				require.True(t, errors.As(err, &exit), "ended with %v", err)
				assert.Equal(t, tc.want, exit.ExitCode(), "stderr: %s", stderr.String())
				if tc.second {
					assert.Contains(t, stderr.String(), "ichor: interrupted again")
				} else {
					assert.Contains(t, stderr.String(), "ichor: interrupted")
				}
				left, err := os.ReadDir(tmp)
				require.NoError(t, err)
				assert.Empty(t, left, "the interrupted command left files behind")
			case <-time.After(30 * time.Second):
				t.Fatalf("still running 30 s after %s; stderr: %s", tc.signal, stderr.String())
			}
		})
	}
}
