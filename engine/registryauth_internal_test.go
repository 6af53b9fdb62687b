package engine

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The credential goes to the registry's origin and to the token services a
// 401 of the registry itself names, over https or the registry's own
// scheme: never to the registry's host over plain http (a redirect that
// downgrades, review 35 M1), to another host, or to a realm named by anyone
// but the registry.
func TestTheRegistryCredentialGoesToTheRegistryAndItsTokenServiceOnly(t *testing.T) {
	registry, err := url.Parse("https://registry.example")
	require.NoError(t, err)
	a := newRegistryAuth(registry, "Basic x")
	sent := func(raw string) bool {
		req, err := http.NewRequest(http.MethodGet, raw, nil)
		require.NoError(t, err)
		return a.authorize(req).Header.Get("Authorization") == "Basic x"
	}
	challenge := func(from, realm string) {
		req, err := http.NewRequest(http.MethodGet, from, nil)
		require.NoError(t, err)
		resp := &http.Response{StatusCode: http.StatusUnauthorized, Header: http.Header{}}
		resp.Header.Set("Www-Authenticate", `Bearer realm="`+realm+`",service="registry.example",scope="repository:ichor/policy:pull"`)
		a.learn(req, resp)
	}

	assert.True(t, sent("https://registry.example/v2/ichor/policy/manifests/stable"))
	assert.True(t, sent("https://REGISTRY.example/v2/"), "host names are not case-sensitive")
	assert.False(t, sent("http://registry.example/v2/"), "sent over plain http")
	assert.False(t, sent("https://registry.example:8443/v2/"), "sent to another port")
	assert.False(t, sent("https://storage.example/blob?sig=1"), "sent to a storage host")
	assert.False(t, sent("https://auth.example/token"), "sent to a token service nobody named")

	challenge("https://storage.example/blob", "https://evil.example/token")
	assert.False(t, sent("https://evil.example/token"), "a realm named by another host is trusted")
	challenge("https://registry.example/v2/", "http://auth.example/token")
	assert.False(t, sent("http://auth.example/token"), "a plain-http realm of an https registry is trusted")
	challenge("https://registry.example/v2/", "https://auth.example/token")
	assert.True(t, sent("https://auth.example/token?service=registry.example"))
	assert.False(t, sent("http://auth.example/token"), "the realm's credential is sent over plain http")

	// ORAS's bearer token, once it has one, is left alone.
	req, err := http.NewRequest(http.MethodGet, "https://registry.example/v2/", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer t0k")
	assert.Equal(t, "Bearer t0k", a.authorize(req).Header.Get("Authorization"))
}

// A plain-http registry is given the credential only on this host's
// loopback, where it never crosses the network: the token service its 401
// names over plain http is trusted only on the loopback too, not anywhere
// the registry's operator pointed it (review of 2026-12-06).
func TestAPlainHTTPRegistrysTokenServiceIsTrustedOnlyOnTheLoopback(t *testing.T) {
	registry, err := url.Parse("http://127.0.0.1:5000")
	require.NoError(t, err)
	a := newRegistryAuth(registry, "Basic x")
	sent := func(raw string) bool {
		req, err := http.NewRequest(http.MethodGet, raw, nil)
		require.NoError(t, err)
		return a.authorize(req).Header.Get("Authorization") == "Basic x"
	}
	challenge := func(realm string) {
		req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:5000/v2/", nil)
		require.NoError(t, err)
		resp := &http.Response{StatusCode: http.StatusUnauthorized, Header: http.Header{}}
		resp.Header.Set("Www-Authenticate", `Bearer realm="`+realm+`",service="registry"`)
		a.learn(req, resp)
	}

	assert.True(t, sent("http://127.0.0.1:5000/v2/"))
	challenge("http://token.example/token")
	assert.False(t, sent("http://token.example/token"), "the credential goes in clear to another host")
	challenge("http://localhost:5001/token")
	assert.True(t, sent("http://localhost:5001/token"))
	challenge("https://token.example/token")
	assert.True(t, sent("https://token.example/token"))
}

// The auths key may be the host or a URL of it, as docker writes some.
func TestTheRegistryCredentialIsFoundByItsHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte("ada:pa:ss"))
	require.NoError(t, os.WriteFile(path, []byte(`{"auths":{"https://registry.example/v1/":{"auth":"`+auth+`"},"other.example":{"username":"bob","password":"x"}}}`), 0o600))
	header, err := registryBasicAuth(path, "registry.example")
	require.NoError(t, err)
	assert.Equal(t, "Basic "+auth, header, "a password holding a colon is kept whole")
	header, err = registryBasicAuth(path, "other.example")
	require.NoError(t, err)
	assert.Equal(t, "Basic "+base64.StdEncoding.EncodeToString([]byte("bob:x")), header)
}

// A challenge's realm is read as ORAS reads it: quoted strings with commas
// or escaped quotes in them, tokens, and the parameters in any order.
func TestTheRealmOfAChallenge(t *testing.T) {
	for challenge, want := range map[string]string{
		`Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a:pull"`: "https://auth.example/token",
		`bearer service=registry.example, realm="https://auth.example/token?a=1,2"`:                      "https://auth.example/token?a=1,2",
		`Bearer scope="repository:a:pull,push",realm="https://auth.example/t\"x"`:                        `https://auth.example/t"x`,
		`Bearer realm=https://auth.example/token`:                                                        "https://auth.example/token",
	} {
		got, ok := bearerRealm(challenge)
		assert.True(t, ok, challenge)
		assert.Equal(t, want, got, challenge)
	}
	for _, challenge := range []string{`Basic realm="registry"`, `Bearer`, `Bearer service="x"`, `Bearer realm="https://unterminated`, `Bearer scope`} {
		_, ok := bearerRealm(challenge)
		assert.False(t, ok, challenge)
	}
}

// The credential is found under another spelling of its host (another
// case, the default port, Docker Hub's names), and one of several entries
// that differ is never picked at random: refused.
func TestTheRegistryCredentialIsFoundUnderAnotherSpellingOfItsHost(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) string {
		path := filepath.Join(dir, "config.json")
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	ada := base64.StdEncoding.EncodeToString([]byte("ada:s3cret"))
	path := write(`{"auths":{"https://index.docker.io/v1/":{"auth":"` + ada + `"},"Registry.Example:443":{"auth":"` + ada + `"}}}`)
	for _, host := range []string{"registry-1.docker.io", "docker.io", "registry.example", "registry.example:443"} {
		header, err := registryBasicAuth(path, host)
		require.NoError(t, err, host)
		assert.Equal(t, "Basic "+ada, header, host)
	}
	bob := base64.StdEncoding.EncodeToString([]byte("bob:other"))
	path = write(`{"auths":{"registry.example":{"auth":"` + ada + `"},"https://registry.example/v1/":{"auth":"` + bob + `"}}}`)
	header, err := registryBasicAuth(path, "registry.example")
	require.NoError(t, err, "the exact key is taken first")
	assert.Equal(t, "Basic "+ada, header)
	_, err = registryBasicAuth(path, "REGISTRY.example")
	require.ErrorContains(t, err, "several different entries")
	assert.NotContains(t, err.Error(), "s3cret")
}

// An origin is its scheme and host, without the scheme's default port.
func TestAnOriginLeavesTheDefaultPortOut(t *testing.T) {
	for raw, want := range map[string]string{
		"https://Registry.Example:443/v2/": "https://registry.example",
		"http://registry.example:80/v2/":   "http://registry.example",
		"https://registry.example:80/v2/":  "https://registry.example:80",
		"http://[::1]:5000/v2/":            "http://[::1]:5000",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		o := origin(u)
		assert.Equal(t, want, o.String(), raw)
	}
}
