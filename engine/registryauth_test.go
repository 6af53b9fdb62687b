package engine_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
)

// askingRegistry is a registry that asks who pulls, as ghcr.io, Docker Hub
// and Harbor do (the distribution spec's token flow): a request without the
// token is answered 401 naming a token service on another host, which
// hands the token for the user and password it accepts; a blob is served by
// a redirect to a storage host of its own. Each records the Authorization
// headers it was sent.
type askingRegistry struct {
	registry, tokens, storage *httptest.Server
	// push is the same registry, asking nothing, for the test's pushes.
	push string

	mu       sync.Mutex
	password string
	sent     map[string][]string // by server: the Authorization headers
}

func newAskingRegistry(t *testing.T) *askingRegistry {
	t.Helper()
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	a := &askingRegistry{password: "s3cret", sent: map[string][]string{}}
	pushSrv := httptest.NewServer(inner)
	t.Cleanup(pushSrv.Close)
	a.push = strings.TrimPrefix(pushSrv.URL, "http://")
	a.storage = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.saw("storage", r)
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(a.storage.Close)
	a.tokens = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.saw("tokens", r)
		user, password, ok := r.BasicAuth()
		a.mu.Lock()
		want := a.password
		a.mu.Unlock()
		if !ok || user != "ada" || password != want {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"who are you?"}]}`)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"token": "t0k-" + want})
	}))
	t.Cleanup(a.tokens.Close)
	blob := regexp.MustCompile(`^/v2/.+/blobs/sha256:[0-9a-f]{64}$`)
	a.registry = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.saw("registry", r)
		a.mu.Lock()
		token := "Bearer t0k-" + a.password
		a.mu.Unlock()
		if r.Header.Get("Authorization") != token {
			w.Header().Set("Www-Authenticate", `Bearer realm="`+a.tokens.URL+`/token",service="test",scope="repository:ichor/policy:pull"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodGet && blob.MatchString(r.URL.Path) {
			http.Redirect(w, r, a.storage.URL+r.URL.Path, http.StatusTemporaryRedirect) //nolint:gosec // G710: a test registry sending its blobs to its own storage server
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(a.registry.Close)
	return a
}

func (a *askingRegistry) saw(server string, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent[server] = append(a.sent[server], r.Header.Get("Authorization"))
}

func (a *askingRegistry) headers(server string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.sent[server]...)
}

func (a *askingRegistry) host() string { return strings.TrimPrefix(a.registry.URL, "http://") }

// dockerConfig writes what `docker login HOST -u USER` writes.
func dockerConfig(t *testing.T, path, host, user, password string) {
	t.Helper()
	data, err := json.Marshal(map[string]any{"auths": map[string]any{
		host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
	require.NoError(t, os.Rename(path+".tmp", path))
}

// A bundle in a registry that asks who pulls is pulled with the credential
// of a Docker config file (--bundle-registry-credentials): sent to the
// registry and to the token service it names, never to the storage host its
// blobs are redirected to. Without it, or with a wrong password, the start
// fails with the registry's refusal; a credential rotated in the file is
// used at the next pull.
func TestABundleFromARegistryThatAsksWhoPulls(t *testing.T) {
	s := newSigner(t)
	a := newAskingRegistry(t)
	good := policyBundle(t, false)
	push(t, bundles.OCIPlainHTTPScheme+a.push+"/ichor/policy:stable", good, s)
	ref := bundles.OCIPlainHTTPScheme + a.host() + "/ichor/policy:stable"
	keys := []engine.VerificationKey{{ID: "ichor", PEM: s.public}}
	config := filepath.Join(t.TempDir(), "config.json")
	start := func(credentials string, timeout time.Duration, onStatus func(engine.BundleStatus)) (*engine.Engine, error) {
		return engine.New(context.Background(), engine.Options{
			Source: ref, VerificationKeys: keys, AllowInsecureHTTP: true, RegistryCredentials: credentials,
			PollInterval: time.Second, StartTimeout: timeout, DecisionLog: io.Discard, Log: io.Discard, OnBundleStatus: onStatus,
		})
	}

	_, err := start("", 2*time.Second, nil)
	require.Error(t, err, "pulled without a credential")
	assert.Contains(t, err.Error(), "401")
	dockerConfig(t, config, a.host(), "ada", "wrong")
	_, err = start(config, 2*time.Second, nil)
	require.Error(t, err, "pulled with a wrong password")
	assert.Contains(t, err.Error(), "who are you?")

	dockerConfig(t, config, a.host(), "ada", "s3cret")
	earlier := len(a.headers("registry"))
	var st statuses
	e, err := start(config, 30*time.Second, st.add)
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	_, rev := forgedIPDecision(t, e)
	assert.Equal(t, good.Manifest.Revision, rev)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("ada:s3cret"))
	assert.Contains(t, a.headers("tokens"), basic, "the token service was not sent the credential")
	require.NotEmpty(t, a.headers("storage"), "no blob was redirected to the storage host")
	for _, h := range a.headers("storage") {
		assert.Empty(t, h, "the storage host was sent an Authorization header")
	}
	for _, h := range a.headers("registry")[earlier:] {
		assert.Contains(t, []string{"", basic, "Bearer t0k-s3cret"}, h, "the registry was sent something else")
	}

	// The password is rotated: the registry takes only the new one, and
	// the file (a Secret's, updated by the kubelet) holds it; the next
	// bundle is pulled with it.
	a.mu.Lock()
	a.password = "n3w"
	a.mu.Unlock()
	dockerConfig(t, config, a.host(), "ada", "n3w")
	loosened := policyBundle(t, true)
	push(t, bundles.OCIPlainHTTPScheme+a.push+"/ichor/policy:stable", loosened, s)
	require.Eventually(t, func() bool {
		_, rev := forgedIPDecision(t, e)
		return rev == loosened.Manifest.Revision
	}, 30*time.Second, 100*time.Millisecond, "the bundle was not pulled with the rotated credential: %v", st.last())
}

// A credentials file the manager cannot use fails the start, saying why,
// before anything is asked of the registry: missing, too large, without
// the registry's entry, holding an identity token (an OAuth2 refresh token
// the manager does not exchange), or given for a bundle not in a registry.
// A registry credential goes with every request: over plain http, allowed
// for the bundle or not, it is refused (review 62).
func TestARegistryCredentialIsNotSentOverPlainHTTP(t *testing.T) {
	s := newSigner(t)
	host := "registry.example:5000"
	creds := filepath.Join(t.TempDir(), "config.json")
	dockerConfig(t, creds, host, "ada", "SUPERSECRET")
	// (A registry on this host's loopback takes it: the credential never
	// leaves the host; TestABundleFromARegistryThatAsksWhoPulls pulls so.)
	_, err := engine.New(context.Background(), engine.Options{
		Source: bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable", AllowInsecureHTTP: true,
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, RegistryCredentials: creds,
		StartTimeout: 2 * time.Second, DecisionLog: io.Discard, Log: io.Discard,
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a registry credential (--bundle-registry-credentials) is sent only over https, or to a registry on this host's loopback")
	assert.NotContains(t, err.Error(), "SUPERSECRET")
}

func TestRegistryCredentialsItCannotUseFailTheStart(t *testing.T) {
	s := newSigner(t)
	dir := t.TempDir()
	host := "registry.example:5000"
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	other := filepath.Join(dir, "other.json")
	dockerConfig(t, other, "elsewhere.example", "ada", "s3cret")
	for name, tc := range map[string]struct {
		source, credentials, want string
	}{
		"missing":        {bundles.OCIScheme + host + "/ichor/policy:stable", filepath.Join(dir, "absent.json"), "no such file"},
		"a directory":    {bundles.OCIScheme + host + "/ichor/policy:stable", dir, "is not a regular file"},
		"too large":      {bundles.OCIScheme + host + "/ichor/policy:stable", write("large.json", `{"auths":{}}`+strings.Repeat(" ", 1<<20)), "larger than 1048576"},
		"not JSON":       {bundles.OCIScheme + host + "/ichor/policy:stable", write("broken.json", `{"auths":`), "registry credentials"},
		"another host":   {bundles.OCIScheme + host + "/ichor/policy:stable", other, "holds no entry for " + host},
		"identity token": {bundles.OCIScheme + host + "/ichor/policy:stable", write("token.json", `{"auths":{"`+host+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("ada:"))+`","identitytoken":"SUPERSECRET"}}}`), "identity or registry token"},
		// A token given alone, without "user:": the error must not quote it
		// (review 35 H1: oras-go's did, into the log and a Pod's Event).
		"a token without its user": {bundles.OCIScheme + host + "/ichor/policy:stable", write("alone.json", `{"auths":{"`+host+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("SUPERSECRET"))+`"}}}`), "is not the base64 of user:password"},
		"auth not base64":          {bundles.OCIScheme + host + "/ichor/policy:stable", write("raw.json", `{"auths":{"`+host+`":{"auth":"ada:SUPERSECRET"}}}`), "is not the base64 of user:password"},
		"a user without password":  {bundles.OCIScheme + host + "/ichor/policy:stable", write("user.json", `{"auths":{"`+host+`":{"username":"ada"}}}`), "holds no user name and password"},
		"not a registry":           {"https://bundles.example/policy.tar.gz", other, "registry credentials are for a bundle in a registry"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := engine.New(context.Background(), engine.Options{
				Source: tc.source, VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, RegistryCredentials: tc.credentials,
				StartTimeout: 2 * time.Second, DecisionLog: io.Discard, Log: io.Discard,
			})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "SUPERSECRET", "the error quotes the credential")
		})
	}
}
