package engine_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// The decision-log service's credential may be a bearer token read from a
// file (a mounted Secret) rather than a password in the URL, which every
// reader of the Deployment sees: it is read at each upload, so a rotated
// Secret is used at the next; one that cannot be read fails that upload with
// the entries kept, and no log line quotes it.
func TestTheDecisionLogServiceIsSentTheTokenFileAtEachUpload(t *testing.T) {
	svc := &harness.LogService{}
	var (
		mu       sync.Mutex
		accepted = "Bearer first-token.A-b_c~1+2/3=="
		refused  int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := r.Header.Get("Authorization") == accepted
		if !ok {
			refused++
		}
		mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		svc.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "token")
	// A Secret's value as kubectl writes it from a file: a trailing newline.
	require.NoError(t, os.WriteFile(path, []byte("first-token.A-b_c~1+2/3==\n"), 0o600))
	log := &harness.DecisionLog{}
	// httptest's server is on the loopback, the one place a token goes over
	// plain http.
	e, err := engine.New(context.Background(), engine.Options{
		DecisionLog: io.Discard, Log: log, DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true, DecisionLogTokenFile: path,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	decide := func() string {
		d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
		require.NoError(t, err)
		return d.DecisionID
	}

	first := decide()
	require.Eventually(t, func() bool { return svc.Has(first) }, 20*time.Second, 50*time.Millisecond, "the entry reaches the service with the file's token")

	// The Secret is being rotated: its file is gone for a moment.
	require.NoError(t, os.Remove(path))
	second := decide()
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "decision-log token") }, 20*time.Second, 50*time.Millisecond,
		"an upload without its token fails, and says why")
	assert.False(t, svc.Has(second))

	// The rotated token: the entry kept is sent with it.
	mu.Lock()
	accepted = "Bearer second-token"
	mu.Unlock()
	// Put in place whole, as the kubelet does a Secret's (an upload
	// retrying meanwhile would otherwise read a token half written).
	require.NoError(t, os.WriteFile(path+".new", []byte("second-token"), 0o600))
	require.NoError(t, os.Rename(path+".new", path))
	require.Eventually(t, func() bool { return svc.Has(second) }, 45*time.Second, 50*time.Millisecond, "the entry kept reaches the service with the rotated token")
	mu.Lock()
	assert.Zero(t, refused, "every upload sent carried the token of its time")
	mu.Unlock()
	assert.NotContains(t, log.String(), "first-token")
	assert.NotContains(t, log.String(), "second-token")
}

// A token that cannot be used fails the start with its reason, never its
// content: a file that is not one, empty, too large, of two lines or of
// characters no bearer token has; a token with no service, or beside a
// password in the URL; and a token for a service over plain http off this
// host's loopback, even with plain http allowed.
func TestADecisionLogTokenThatCannotBeUsedFailsTheStart(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	good := write("good", "sekrit-token")
	for name, c := range map[string]struct {
		url, file, want string
	}{
		"missing":        {"https://decisions.example.com", filepath.Join(dir, "absent"), "no such file"},
		"a directory":    {"https://decisions.example.com", dir, "is not a regular file"},
		"empty":          {"https://decisions.example.com", write("empty", " \n"), "is empty"},
		"too large":      {"https://decisions.example.com", write("large", strings.Repeat("s", 16<<10+1)), "larger than 16384 bytes"},
		"two lines":      {"https://decisions.example.com", write("lines", "sekrit-one\nsekrit-two\n"), "characters a bearer token has not"},
		"a header":       {"https://decisions.example.com", write("header", "sekrit\r\nX-Forged: 1"), "characters a bearer token has not"},
		"only padding":   {"https://decisions.example.com", write("padding", "=="), "characters a bearer token has not"},
		"padding inside": {"https://decisions.example.com", write("inside", "sekrit=x"), "characters a bearer token has not"},
		"no service":     {"", good, "give its URL too"},
		"and a password": {"https://ichor:sekrit-password@decisions.example.com", good, "not both"},
		"plain http":     {"http://decisions.example.com", good, "its token is sent only over https, or to a service on this host's loopback"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := engine.New(context.Background(), engine.Options{
				Log: &harness.DecisionLog{}, DecisionLogURL: c.url, DecisionLogAllowInsecureHTTP: true, DecisionLogTokenFile: c.file,
			})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), "sekrit", "the error quotes no credential")
		})
	}
}
