package engine

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
		assert.Equal(t, want, bundles.RedactedSource(in), in)
	}
	assert.Equal(t, "https://bundles.example/ichor.tar.gz?...", describeSource(Options{Source: "https://bundles.example/ichor.tar.gz?sig=abc"}))

	// A registry's reference with a user: refused, its password unsaid.
	_, err = bundles.ParseOCIRef("oci://ichor:s3cret@registry.example/ichor/policy:v1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "carries a user before the registry")
	assert.NotContains(t, err.Error(), "s3cret")
	_, err = bundles.ParseOCIRef("oci://registry.example/ichor/policy@sha256:" + strings.Repeat("a", 64))
	require.NoError(t, err, "a digest's @ is no user")
}

// A signed URL's query (its signature) is in none of what a failed fetch
// leaves: the engine's log (OPA's errors quote the URL), the start's error.
func TestASignedURLsQueryIsInNoLogNorError(t *testing.T) {
	// A server gone: Go's client error quotes the URL whole.
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	var log bytes.Buffer
	_, err := New(context.Background(), Options{
		Source: srv.URL + "/ichor.tar.gz?X-Goog-Date=20261206&X-Goog-Signature=s3cretsig", PollInterval: 100 * time.Millisecond, StartTimeout: 2 * time.Second,
		VerificationKeys: []VerificationKey{{ID: "ichor", PEM: "a shared secret", Algorithm: "HS256"}}, AllowInsecureHTTP: true,
		DecisionLog: io.Discard, Log: &log,
	})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cretsig")
	assert.Contains(t, err.Error(), "ichor.tar.gz?...")
	assert.Contains(t, err.Error(), "connection refused")
	assert.NotContains(t, err.Error(), "not fetched within", "a refusal is no timeout")
	require.NotEmpty(t, log.String(), "OPA logged nothing of the failed fetches")
	assert.NotContains(t, log.String(), "s3cretsig")
}
