package engine

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"testing"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/netguard/netguardtest"
)

func bundleClient(t *testing.T, serviceURL string) *http.Client {
	t.Helper()
	m, err := plugins.New([]byte(`{}`), "test", inmem.New())
	require.NoError(t, err)
	client, err := (&limitsPlugin{limits: bundles.DefaultLimits, plainHTTP: true, manager: m}).NewClient(rest.Config{URL: serviceURL, Type: "oci"})
	require.NoError(t, err)
	return client
}

// What the bundle's service names elsewhere (a redirect, a token service)
// is not reached in the manager's loopback nor in the node's link-local
// networks: a hostile registry had the manager send GETs there at each poll
// (review 246, F2). Nothing is sent: the connection is not even made.
func TestTheBundlesServiceNamesNothingInADeniedNetwork(t *testing.T) {
	addr, accepted := netguardtest.Listener(t)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)

	t.Run("a name that resolves to the loopback", func(t *testing.T) {
		client := bundleClient(t, "http://registry.example")
		_, err := client.Get("http://localhost:" + port + "/latest/meta-data/")
		require.Error(t, err)
		assert.True(t, errors.As(err, new(*netguard.RefusedError)), "refused for its network: %v", err)
		assert.Contains(t, err.Error(), "named by the bundle's service registry.example (a redirect or a token service)")
		assert.Zero(t, accepted.Load(), "a connection was made")
	})

	t.Run("an address, through a proxy", func(t *testing.T) {
		// The proxy is what is dialled: the URL's address is checked
		// before, in any form a proxy may read as one.
		client := bundleClient(t, "http://registry.example")
		throughProxy(t, client, addr)
		for _, host := range []string{"169.254.169.254", "169.254.169.254.", "2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "0xa9.0xfe.0xa9.0xfe", "[::ffff:169.254.169.254]", "127.0.0.1"} {
			_, err := client.Get("http://" + host + "/latest/meta-data/")
			require.Error(t, err, host)
			assert.Contains(t, err.Error(), "named by the bundle's service registry.example", host)
		}
		assert.Zero(t, accepted.Load(), "the proxy was asked")
	})

	t.Run("a name, through a proxy on the loopback", func(t *testing.T) {
		// An egress proxy beside the manager: the proxy is dialled, and
		// resolves the name itself.
		client := bundleClient(t, "http://registry.example")
		throughProxy(t, client, addr)
		before := accepted.Load()
		_, err := client.Get("http://cdn.example/blob")
		require.Error(t, err, "the listener hangs up")
		assert.False(t, errors.As(err, new(*netguard.RefusedError)), "refused: %v", err)
		assert.Equal(t, before+1, accepted.Load(), "the proxy was not asked")
	})

	t.Run("the service's own network", func(t *testing.T) {
		// A registry on the loopback may send the manager to another port
		// of it: the operator chose to reach the loopback.
		client := bundleClient(t, "http://127.0.0.1:9")
		before := accepted.Load()
		_, err := client.Get("http://localhost:" + port + "/blob")
		require.Error(t, err, "the listener hangs up")
		assert.False(t, errors.As(err, new(*netguard.RefusedError)), "refused: %v", err)
		assert.Equal(t, before+1, accepted.Load(), "the connection was made")
	})
}

// throughProxy sends client's requests through the proxy at addr, as
// HTTPS_PROXY would.
func throughProxy(t *testing.T, client *http.Client, addr string) {
	t.Helper()
	proxy, err := url.Parse("http://" + addr)
	require.NoError(t, err)
	tr := client.Transport.(*limitsTransport)
	tr.proxy = http.ProxyURL(proxy)
	tr.base.(*http.Transport).Proxy = tr.proxy
	tr.elsewhere.(*http.Transport).Proxy = tr.proxy
}

func TestTheNetworksDeniedElsewhereSpareOnlyTheLoopback(t *testing.T) {
	loopback4, loopback6 := netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")
	linkLocal := netip.MustParsePrefix("169.254.0.0/16")
	for _, tc := range []struct {
		service        string
		spared, denied []netip.Prefix
	}{
		{service: "registry.example", denied: []netip.Prefix{loopback4, loopback6, linkLocal}},
		{service: "registry.example:5000", denied: []netip.Prefix{loopback4, loopback6, linkLocal}},
		{service: "10.0.0.5:5000", denied: []netip.Prefix{loopback4, loopback6, linkLocal}},
		{service: "127.0.0.1:5000", spared: []netip.Prefix{loopback4, loopback6}, denied: []netip.Prefix{linkLocal}},
		{service: "localhost:5000", spared: []netip.Prefix{loopback4, loopback6}, denied: []netip.Prefix{linkLocal}},
		{service: "[::1]:5000", spared: []netip.Prefix{loopback4, loopback6}, denied: []netip.Prefix{linkLocal}},
		// A node-local cache on a link-local address is no reason to reach
		// the instance metadata beside it.
		{service: "169.254.20.10:5000", denied: []netip.Prefix{loopback4, loopback6, linkLocal}},
	} {
		denied := deniedElsewhere(tc.service)
		for _, p := range tc.spared {
			assert.NotContains(t, denied, p, "%s: %s is denied", tc.service, p)
		}
		for _, p := range tc.denied {
			assert.Contains(t, denied, p, "%s: %s is not denied", tc.service, p)
		}
	}
}
