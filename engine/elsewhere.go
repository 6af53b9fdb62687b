package engine

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
)

// Requests elsewhere than the bundle's service.
//
// The operator names the bundle's service; whoever answers for it names
// the rest: the storage host a registry redirects a blob to, the token
// service its 401 names, any redirect of a URL source. Those are followed,
// as docker and OPA follow them (a registry serves its blobs from a CDN),
// but never into the networks netguard denies by default: the manager's
// loopback, the node's link-local services (a cloud's instance metadata),
// addresses that name no one host. Before, a hostile or compromised
// registry could have the manager send GETs there, each replica at each
// poll (review 246, F2). The answer of such a GET would fail the bundle's
// checks, but the request itself is what a metadata service or a
// loopback-only port acts on.
//
// The manager's loopback is not denied when the service itself is there (a
// registry on the loopback, in a test or behind a sidecar, redirecting to
// another port of it): the operator chose to reach it. No other network is
// spared so: a registry on a link-local address (a node-local cache) is no
// reason to reach the instance metadata beside it.
//
// Left open (docs/hardening.md): the service's own name, which whoever
// answers its DNS may point anywhere between two connections (over https
// the certificate check ends such a connection after its handshake, over
// plain http, an operator's choice, it would carry a GET); the pod and
// service networks; and, through a proxy, what a name resolves to, which is
// the proxy's to check.

// deniedElsewhere are the networks no request elsewhere than the service at
// serviceHost (a URL's host, with or without a port) may reach.
func deniedElsewhere(serviceHost string) netguard.Denied {
	denied := netguard.Default()
	if !bundles.OnLoopback(serviceHost) {
		return denied
	}
	loopback := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	return slices.DeleteFunc(denied, func(p netip.Prefix) bool {
		return slices.ContainsFunc(loopback, p.Contains)
	})
}

// guardedElsewhere is base for the requests elsewhere than the service
// that are not sent through a proxy: its connections are checked by denied
// on their address, after DNS and before anything is sent.
func guardedElsewhere(base *http.Transport, denied netguard.Denied) *http.Transport {
	t := base.Clone()
	// http.DefaultTransport's dialer, with the check.
	t.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: denied.Control}).DialContext
	return t
}

// checkElsewhereHost refuses a request elsewhere whose URL names an address
// in a denied network, or an address in a form net/netip does not read
// (2852039166, 0xa9fea9fe, 0251.0376.0251.0376), which a proxy or another
// resolver may read as 169.254.169.254: checked whatever the connection
// goes through, since through a proxy the proxy is what is dialled.
func checkElsewhereHost(req *http.Request, denied netguard.Denied) error {
	host := strings.TrimSuffix(req.URL.Hostname(), ".")
	a, err := netip.ParseAddr(host)
	if err != nil {
		if numeric(host) {
			return fmt.Errorf("host %q reads as an address in a form other than the usual one: no connection is made to it", host)
		}
		return nil // a name: checked on its address as it is dialled
	}
	return denied.Check(a)
}

// numeric reports whether every label of host is a number (decimal, octal
// or 0x hexadecimal): no top-level domain is, so such a host is an address
// to some resolver.
func numeric(host string) bool {
	for label := range strings.SplitSeq(strings.ToLower(host), ".") {
		hex := strings.TrimPrefix(label, "0x")
		switch {
		case hex == "":
			return false
		case hex != label && strings.Trim(hex, "0123456789abcdef") != "":
			return false
		case hex == label && strings.Trim(label, "0123456789") != "":
			return false
		}
	}
	return true
}

// elsewhereError says which request elsewhere was refused, and why.
func elsewhereError(req *http.Request, service string, err error) error {
	return fmt.Errorf("%s %s, named by the bundle's service %s (a redirect or a token service): %w", req.Method, bundles.RedactedURL(req.URL), LoggedName(service), err)
}
