package engine

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// bundleFile writes the embedded bundle under revision to path.
func bundleFile(t *testing.T, path, revision string) {
	t.Helper()
	b, err := bundles.Default()
	require.NoError(t, err)
	b.Manifest.Revision = revision
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
	require.NoError(t, os.Rename(path+".tmp", path))
}

// A bundle file changed while the engine starts (between the read it is
// started on and the first poll: a ConfigMap swapped by the kubelet while
// OPA compiles) is loaded at the next poll. The polls once took their
// starting point from a second read, so such a change was their starting
// point and never loaded, with nothing to say so (the hostile review of
// 2026-12-05).
func TestABundleFileChangedWhileTheEngineStartsIsLoaded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	bundleFile(t, path, "first")
	e, err := New(context.Background(), Options{Source: path, PollInterval: time.Hour, DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	require.Equal(t, "first", e.Revision())

	// The window, made wide: the polls stopped, the file changed, the polls
	// started again as the start starts them.
	e.stopPoll()
	<-e.pollDone
	bundleFile(t, path, "second")
	e.pollFile(Options{PollInterval: 20 * time.Millisecond})

	require.Eventually(t, func() bool { return e.Revision() == "second" }, 30*time.Second, 20*time.Millisecond,
		"the bundle changed during the start was not loaded: %s", e.Revision())
}
