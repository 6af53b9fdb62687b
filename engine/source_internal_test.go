package engine

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// A URL's user is never sent by OPA's client: a source with one is refused,
// naming it without its password; logs and errors name a source without its
// password or query, where a signed URL keeps its signature (review of
// 2026-12-06).
func TestASourcesCredentialsAreNeitherDroppedInSilenceNorLogged(t *testing.T) {
	_, _, err := splitURL("https://ichor:s3cret@bundles.example/ichor.tar.gz")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "carries a user in its URL, which is never sent")
	assert.Contains(t, err.Error(), "https://ichor:xxxxx@bundles.example/ichor.tar.gz")
	assert.NotContains(t, err.Error(), "s3cret")

	for in, want := range map[string]string{
		"https://bundles.example/ichor.tar.gz":                      "https://bundles.example/ichor.tar.gz",
		"https://bundles.example/ichor.tar.gz?X-Goog-Signature=abc": "https://bundles.example/ichor.tar.gz?...",
		"https://ichor:s3cret@bundles.example/b.tar.gz":             "https://ichor:xxxxx@bundles.example/b.tar.gz",
		"oci://registry.example/ichor/policy:v1":                    "oci://registry.example/ichor/policy:v1",
		"/etc/ichor/bundle.tar.gz":                                  "/etc/ichor/bundle.tar.gz",
	} {
		assert.Equal(t, want, RedactedSource(in), in)
	}
	assert.Equal(t, "https://bundles.example/ichor.tar.gz?...", describeSource(Options{Source: "https://bundles.example/ichor.tar.gz?sig=abc"}))
}
