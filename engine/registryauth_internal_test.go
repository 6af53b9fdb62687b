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
