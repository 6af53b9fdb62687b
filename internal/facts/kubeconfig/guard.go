package kubeconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"k8s.io/client-go/rest"
)

// ErrServerIsLocal is a connection refused because its peer is the
// manager's own API server (its key, or a certificate of its CA).
var ErrServerIsLocal = errors.New("the peer presents the key or a certificate of the CA of the manager's own API server: a remote cluster's client does not talk to it")

// ResponseHeaderTimeout is how long a remote API server has to start its
// answer to any request.
const ResponseHeaderTimeout = 30 * time.Second

// RESTConfig is the client configuration of the document's server
// (Document.RESTConfig) whose every connection is checked, not only the
// first probe: each TLS handshake refuses a peer that presents the local API
// server's key or a chain that verifies against its CA (so a redirect, a new
// DNS answer or a reconnection cannot reach it), no proxy is used (the
// client goes where the probe went), and an HTTP redirect is an error, never
// followed with the tenant's credential.
func (l *Local) RESTConfig(ctx context.Context, d *Document, insecure bool) (*rest.Config, error) {
	if l == nil {
		return nil, errors.New("the manager's own API server is not known, so no server can be told apart from it")
	}
	cfg, err := d.RESTConfig(insecure)
	if err != nil {
		return nil, err
	}
	localKey, roots, err := l.load(ctx)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("TLS configuration of the kubeconfig's server: %w", err)
	}
	if tlsConfig == nil {
		// No CA, client certificate or server name: the system's roots.
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer presents no certificate")
		}
		id := identify(cs.PeerCertificates, localKey, roots)
		if id.SameKeyAsLocal || id.VerifiesWithLocalCA {
			return ErrServerIsLocal
		}
		return nil
	}
	noProxy := func(*http.Request) (*url.URL, error) { return nil, nil }
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	// client-go refuses a Transport together with TLS options: the TLS
	// options are in the transport; the bearer token stays in cfg and
	// client-go adds it around the transport.
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	cfg.Proxy = noProxy
	cfg.Transport = &http.Transport{
		Proxy:               noProxy,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: ProbeTimeout,
		// A server that takes a request and never starts its answer (a
		// list, a watch, a write) holds whoever asked: not for longer.
		ResponseHeaderTimeout: ResponseHeaderTimeout,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   25,
		IdleConnTimeout:       90 * time.Second,
	}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return noRedirects{rt} }
	return cfg, nil
}

// noRedirects turns a redirect into an error, so that net/http's client
// does not follow it, with the tenant's Authorization header, to wherever it
// points.
type noRedirects struct{ rt http.RoundTripper }

func (n noRedirects) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := n.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.StatusCode != http.StatusNotModified {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("%s %s: the server answered %s; a remote API server's redirects are not followed", req.Method, req.URL.Redacted(), resp.Status)
	}
	return resp, nil
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (n noRedirects) WrappedRoundTripper() http.RoundTripper { return n.rt }
