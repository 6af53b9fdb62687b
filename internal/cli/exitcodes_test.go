package cli_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/cli"
)

// closedServer is the URL of a port nothing listens on.
func closedServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "https://" + addr
}

// TestAnUnreachableAPIServerIsExitOne: every command that speaks to an API
// server fails with exit 1, not 2, when the server cannot be reached: the
// command line was right. Before, cluster talosconfig said 2 (it took the
// failed list of TalosMachines for a missing --talos-endpoints).
func TestAnUnreachableAPIServerIsExitOne(t *testing.T) {
	server := closedServer(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: ns}}]
current-context: c
`), 0o600))
	t.Setenv("TALOSCONFIG", filepath.Join(dir, "talosconfig"))
	t.Setenv("KUBECONFIG", kubeconfig)

	for _, args := range [][]string{
		{"cluster", "talosconfig", "demo", "--out", filepath.Join(dir, "t1")},
		{"cluster", "talosconfig", "demo", "--talos-endpoints", "10.5.0.2", "--out", filepath.Join(dir, "t2")},
		{"cluster", "kubeconfig", "demo", "--out", filepath.Join(dir, "k1")},
		{"decisions", "list", "--from-cluster"},
		{"decisions", "replay", "--from-cluster", "--bundle", "../../policy"},
		{"audit", "kubelet-serving"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, _, stderr := run(t, "", args...)
			assert.Equal(t, cli.ExitError, code, stderr)
			assert.Contains(t, stderr, "connect: connection refused")
		})
	}
}

// TestHelpSaysTheExitStatuses: the statuses are documented where a person
// looks first.
func TestHelpSaysTheExitStatuses(t *testing.T) {
	code, stdout, _ := run(t, "", "--help")
	require.Equal(t, cli.ExitOK, code)
	for _, want := range []string{"Exit status of every command:", "0  done", "1  failed", "cannot be reached", "2  a wrong command", "3  done"} {
		assert.Contains(t, stdout, want)
	}
}
