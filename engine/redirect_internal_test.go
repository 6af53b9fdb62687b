package engine

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// The bundle client follows a server's redirects (a registry serves its
// blobs from elsewhere), but not from https to plain http (review 28 L4):
// that would hand the bundle to whoever is on the path, which only
// --bundle-allow-insecure-http may choose.
func TestABundleOverHTTPSIsNotFetchedOverPlainHTTP(t *testing.T) {
	served := 0
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		_, _ = w.Write([]byte("not a bundle"))
	}))
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			_, _ = w.Write([]byte("a blob"))
			return
		}
		target := plain.URL + "/bundle.tar.gz"
		if r.URL.Path == "/same" {
			target = "/elsewhere"
		}
		http.Redirect(w, r, target, http.StatusFound)
	}))
	t.Cleanup(secure.Close)
	m, err := plugins.New([]byte(`{}`), "test", inmem.New())
	require.NoError(t, err)
	client, err := (&limitsPlugin{limits: bundles.DefaultLimits, manager: m}).NewClient(rest.Config{})
	require.NoError(t, err)
	// Trust the test server: the client's TLS configuration is the
	// system's roots.
	client.Transport.(*limitsTransport).base.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // G402: the test's own server

	_, err = client.Get(secure.URL + "/bundle.tar.gz")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not fetched over plain http")
	assert.Zero(t, served, "the plain server was asked")

	// OPA's OCI downloader makes its own client of the transport alone,
	// without CheckRedirect: the transport refuses plain http itself.
	_, err = (&http.Client{Transport: client.Transport}).Get(secure.URL + "/bundle.tar.gz")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not fetched over plain http, except from a source given as plain http with --bundle-allow-insecure-http")
	assert.Zero(t, served, "the plain server was asked")

	resp, err := client.Get(secure.URL + "/same")
	require.NoError(t, err, "a redirect within https is followed")
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// With --bundle-allow-insecure-http, a service asked for over https
	// still is not followed to plain http (review 162: the flag let an OCI
	// registry's https answer redirect there); one asked for over http is
	// fetched so.
	for service, want := range map[string]bool{secure.URL: false, plain.URL: true} {
		insecure, err := (&limitsPlugin{limits: bundles.DefaultLimits, manager: m, plainHTTP: true}).NewClient(rest.Config{URL: service})
		require.NoError(t, err)
		// Both transports: the test's servers are two ports of the loopback,
		// so the one asked for is elsewhere than the service.
		tr := insecure.Transport.(*limitsTransport)
		tr.base.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}      //nolint:gosec // G402: the test's own server
		tr.elsewhere.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // G402: the test's own server
		resp, err := (&http.Client{Transport: insecure.Transport}).Get(secure.URL + "/bundle.tar.gz")
		if want {
			require.NoError(t, err, "a service over plain http, allowed")
			_ = resp.Body.Close()
			continue
		}
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not fetched over plain http")
	}
	assert.Equal(t, 1, served, "only the http service's client fetched over plain http")
}

// The decision log goes to its service over https only, unless the operator
// allows plain http: an upload is not sent again over plain http on a
// redirect, and a plain http service is refused at the start, without the
// password the URL may hold.
func TestTheDecisionLogIsNotSentOverPlainHTTP(t *testing.T) {
	served := 0
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere/logs" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		target, code := plain.URL+"/logs", http.StatusTemporaryRedirect
		switch r.URL.Path {
		case "/same/logs":
			target = "/elsewhere/logs"
		case "/moved/logs":
			// net/http would follow it as a GET without the body, and its
			// 2xx would read as uploaded.
			target, code = "/elsewhere/logs", http.StatusMovedPermanently
		}
		http.Redirect(w, r, target, code)
	}))
	t.Cleanup(secure.Close)
	client := uploadClient()
	// Trust the test server: the client's TLS configuration is the
	// system's roots.
	client.Transport = secure.Client().Transport
	post := func(url string) error {
		resp, err := client.Post(url, "application/json", strings.NewReader("[]"))
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	err := post(secure.URL + "/logs")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "are not sent over plain http")
	assert.Zero(t, served, "the plain server was sent the entries")
	require.NoError(t, post(secure.URL+"/same/logs"), "a redirect within https is followed")
	err = post(secure.URL + "/moved/logs")
	require.Error(t, err, "an upload redirected as a GET was taken for uploaded")
	assert.Contains(t, err.Error(), "not taken for uploaded")

	// Nor to another host: whoever answers for the service would have the
	// decisions sent, and counted as uploaded, wherever it chose (review 62).
	other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(other.Close)
	away := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/logs", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(away.Close)
	client.Transport = away.Client().Transport
	err = post(away.URL + "/logs")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redirects to another host")
	assert.Zero(t, served, "another host was sent the entries")
	// A service's headers are a few hundred bytes; Go takes 10 MiB.
	tr, ok := uploadClient().Transport.(*http.Transport)
	require.True(t, ok)
	assert.Equal(t, int64(maxServiceHeaderBytes), tr.MaxResponseHeaderBytes)

	_, err = New(t.Context(), Options{DecisionLog: io.Discard, Log: io.Discard, DecisionLogURL: "http://ichor:s3cret@logs.example"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--decision-log-allow-insecure-http")
	assert.NotContains(t, err.Error(), "s3cret")
}
