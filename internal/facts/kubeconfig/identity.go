package kubeconfig

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ichor-dev/ichor-policy/internal/netguard"
)

// Identity is what the server of a kubeconfig is, found by a TLS handshake
// that sends no credential and no request: whether it presents the key of
// the API server the manager runs against, and whether its certificate
// chains to that API server's CA. A server that does either is the manager's
// own API server, or one its cluster's CA vouches for, whatever its URL.
type Identity struct {
	// SameKeyAsLocal is whether its certificate's public key is the local
	// API server's.
	SameKeyAsLocal bool `json:"same_key_as_local"`
	// VerifiesWithLocalCA is whether its certificate chain verifies against
	// the CA the manager trusts its own API server with (host names aside).
	VerifiesWithLocalCA bool `json:"verifies_with_local_ca"`
	// LocalCAKnown is whether the manager has a CA of its own API server to
	// verify against (none when it trusts the system's roots).
	LocalCAKnown bool `json:"local_ca_known"`
}

// ProbeTimeout bounds the handshake with a server.
const ProbeTimeout = 10 * time.Second

// Local is the identity of the API server the manager runs against: its
// serving key, read by a handshake, and its CA, read again every
// LocalRereadAfter.
type Local struct {
	// Config is the manager's own client configuration.
	Config *rest.Config
	// Denied are the networks no connection to a kubeconfig's server may
	// reach (the probe's and the client's alike), checked on each
	// connection's address after DNS. The manager's own API server is
	// reached without them.
	Denied netguard.Denied
	// ListBytes bounds the bytes of the lists being read at once from one
	// tenant's servers (DefaultListBytes if zero).
	ListBytes int64

	mu      sync.Mutex
	reading bool
	keys    [][]byte
	cas     [][]byte
	roots   *x509.CertPool
	readAt  time.Time
	lists   map[string]*byteBudget
}

// LocalRereadAfter is how long the local API server's key and CA, as last
// read, are believed before they are read again: read once, a rotation of
// either while the manager ran went unseen until a restart, and a tenant's
// kubeconfig naming the API server under its new key or CA was judged not
// local, and connected to (review 165).
const LocalRereadAfter = 10 * time.Minute

// localKept is how many keys and CAs of the local API server, the latest
// read, are kept: a rotation serves the old and the new side by side, and a
// server presenting either is the local one.
const localKept = 3

// load is the local API server's keys and CA, read again when they are
// older than LocalRereadAfter. The read is a handshake of up to
// ProbeTimeout, made outside the lock by one caller at a time, the others
// meanwhile served what was read before (review 167): a tenant's handshake
// (wait false) only starts it in the background, within its own timeout.
// A read that fails keeps what was read before, if anything was: the
// manager's own API server unreachable for a moment does not make every
// tenant's server unknowable.
func (l *Local) load(ctx context.Context, wait bool) ([][]byte, *x509.CertPool, error) {
	l.mu.Lock()
	if l.keys != nil && (l.reading || time.Since(l.readAt) < LocalRereadAfter) {
		defer l.mu.Unlock()
		return l.keys, l.roots, nil
	}
	if l.keys != nil && !wait {
		l.reading = true
		keys, roots := l.keys, l.roots
		l.mu.Unlock()
		go func() { _, _, _ = l.reread(context.WithoutCancel(ctx)) }()
		return keys, roots, nil
	}
	l.reading = true
	l.mu.Unlock()
	return l.reread(ctx)
}

// reread reads the local API server's key and CA, and keeps them beside
// those read before.
func (l *Local) reread(ctx context.Context) (keys [][]byte, roots *x509.CertPool, err error) {
	// Whatever read does, a panic too, the next load may read again.
	defer func() {
		l.mu.Lock()
		l.reading = false
		l.mu.Unlock()
	}()
	key, ca, err := l.read(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.keys != nil {
			// Tried again in a minute, not at each connection.
			l.readAt = time.Now().Add(time.Minute - LocalRereadAfter)
			return l.keys, l.roots, nil
		}
		return nil, nil, err
	}
	l.keys = kept(l.keys, key)
	if ca != nil {
		l.cas = kept(l.cas, ca)
	}
	if len(l.cas) > 0 {
		l.roots = x509.NewCertPool()
		for _, pem := range l.cas {
			l.roots.AppendCertsFromPEM(pem)
		}
	}
	l.readAt = time.Now()
	return l.keys, l.roots, nil
}

// read reads the local API server's serving key, by a handshake, and its
// CA (nil when it is trusted by the system's roots).
func (l *Local) read(ctx context.Context) ([]byte, []byte, error) {
	if l.Config == nil {
		return nil, nil, errors.New("the manager's own API server is not known")
	}
	cfg := rest.CopyConfig(l.Config)
	// The in-cluster configuration names its CA by file, which the kubelet
	// updates when the cluster's CA rotates.
	if err := rest.LoadTLSFiles(cfg); err != nil {
		return nil, nil, fmt.Errorf("the CA of the manager's own API server: %w", err)
	}
	var ca []byte
	if len(cfg.CAData) > 0 {
		if !x509.NewCertPool().AppendCertsFromPEM(cfg.CAData) {
			return nil, nil, errors.New("the CA of the manager's own API server holds no certificate")
		}
		ca = cfg.CAData
	}
	certs, err := handshake(ctx, cfg.Host, cfg.ServerName, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("the manager's own API server: %w", err)
	}
	key, err := x509.MarshalPKIXPublicKey(certs[0].PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("the manager's own API server's key: %w", err)
	}
	return key, ca, nil
}

// kept is seen with v last, once, and at most localKept of them.
func kept(seen [][]byte, v []byte) [][]byte {
	out := slices.DeleteFunc(slices.Clone(seen), func(s []byte) bool { return bytes.Equal(s, v) })
	out = append(out, v)
	return out[max(len(out)-localKept, 0):]
}

// Probe finds the identity of the server of the document's context in use
// (the rule must have allowed its fields first). An error is a server that
// could not be reached: nothing can be said of it.
func (l *Local) Probe(ctx context.Context, d *Document) (Identity, error) {
	if l == nil {
		return Identity{}, errors.New("the manager's own API server is not known, so no server can be told apart from it")
	}
	if d.cluster == nil {
		return Identity{}, errors.New("the kubeconfig has no cluster in use")
	}
	if err := checkServer(d.cluster.Server); err != nil {
		return Identity{}, err
	}
	localKeys, roots, err := l.load(ctx, true)
	if err != nil {
		return Identity{}, err
	}
	certs, err := handshake(ctx, d.cluster.Server, d.cluster.TLSServerName, l.Denied)
	if err != nil {
		return Identity{}, fmt.Errorf("the server of the kubeconfig: %w", err)
	}
	return identify(certs, localKeys, roots), nil
}

// identify is what a server presenting certs is, next to the local API
// server's keys and CA (roots, nil when unknown).
func identify(certs []*x509.Certificate, localKeys [][]byte, roots *x509.CertPool) Identity {
	id := Identity{LocalCAKnown: roots != nil}
	if key, err := x509.MarshalPKIXPublicKey(certs[0].PublicKey); err == nil {
		id.SameKeyAsLocal = slices.ContainsFunc(localKeys, func(k []byte) bool { return bytes.Equal(key, k) })
	}
	if roots != nil {
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		id.VerifiesWithLocalCA = err == nil
	}
	return id
}

// handshake is the certificates a TLS server presents. Nothing is trusted
// and nothing is sent but the handshake: no client certificate, no request;
// and nothing at all to an address in a denied network.
func handshake(ctx context.Context, server, serverName string, denied netguard.Denied) ([]*x509.Certificate, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, fmt.Errorf("server URL: %w", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	if serverName == "" {
		serverName = u.Hostname()
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{Control: denied.Control}, Config: &tls.Config{
		ServerName: serverName,
		// The certificates are looked at, not trusted: the handshake only
		// says what the server is.
		InsecureSkipVerify: true, //nolint:gosec // G402: nothing is sent over this connection
		MinVersion:         tls.VersionTLS12,
	}}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("TLS handshake with %s: %w", host, err)
	}
	defer func() { _ = conn.Close() }()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("TLS handshake with %s: no certificate", host)
	}
	return certs, nil
}
