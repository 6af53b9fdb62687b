// Package talosnode reads a node's identity from the node itself, over the
// authenticated Talos API, at the moment a decision needs it.
//
// The kubelet-serving approver must not trust the CSR or the Kubernetes Node
// object for a node's names and addresses: a compromised kubelet writes both
// (ADR 0125). Talos computes them independently (k8s.NodeIP "kubelet" is what it
// passes the kubelet as --node-ip), so this package asks Talos, with a
// credential that can read and nothing else.
package talosnode

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/client/dialer"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"

	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/talos/taloscert"
)

const (
	// ReaderRole is the only Talos role the reader's credential ever carries: it
	// reads non-sensitive resources and cannot change, reboot or read secrets.
	ReaderRole = string(role.Reader)

	// MaxCertificateLifetime bounds the reader's credential, so a leaked one is
	// useless within minutes.
	MaxCertificateLifetime = 15 * time.Minute

	// DefaultCertificateLifetime is used when Options.CertificateLifetime is zero.
	DefaultCertificateLifetime = 10 * time.Minute

	// DefaultTimeout bounds one Read (dial, handshake and the three reads) when
	// Options.Timeout is zero.
	DefaultTimeout = 10 * time.Second

	// maxBackdate is the clock skew between controller and node the credential
	// tolerates.
	maxBackdate = 30 * time.Second

	// maxMessage bounds a message from a node: one resource of an identity
	// (its metadata, and its spec in YAML and protobuf) is under a
	// kilobyte at the bounds of checkNodeIP and checkHostname. More costs
	// the decoder: COSI copies a resource's finalizers at each one it adds,
	// so a message of tiny finalizers costs the square of its size (64 KiB
	// of them was seconds of CPU and gigabytes of copies; review of
	// 2026-12-06).
	maxMessage = 4 << 10
	// maxHeaderList bounds a response's headers from a node: Talos sends
	// a few hundred bytes.
	maxHeaderList = 16 << 10
)

// Identity is what the node says about itself. Addresses are canonical
// netip strings (IPv4 dotted, IPv6 compressed, no zone, IPv4-mapped unmapped),
// deduplicated, in the node's order; never nil, so an empty list is [] in JSON.
type Identity struct {
	Nodename  string   `json:"nodename"`
	Hostname  string   `json:"hostname"`
	Addresses []string `json:"addresses"`
}

// Options configures a Reader.
type Options struct {
	// CACertPEM and CAKeyPEM are the cluster's OS CA (certs.os of the Talos
	// secrets bundle), which signs the reader's credential and is the only CA
	// trusted for the node's serving certificate.
	CACertPEM []byte
	CAKeyPEM  []byte

	// CertificateLifetime of the reader's own client certificate; zero means
	// DefaultCertificateLifetime, above MaxCertificateLifetime is an error.
	CertificateLifetime time.Duration

	// Timeout bounds each Read; zero means DefaultTimeout.
	Timeout time.Duration

	// Clock is the time source for issuing and renewing the credential;
	// time.Now if nil.
	Clock func() time.Time

	// Denied are the networks no read or watch connects to, checked on each
	// connection's address after DNS: whoever writes a machine's endpoint
	// names the address and port. Nil denies none.
	Denied netguard.Denied

	// HoldTimedOut is how long a read that ran into Timeout is answered,
	// for the same endpoint, with its error rather than read again; zero
	// reads again at once. A node whose Talos API hangs costs its caller
	// the whole Timeout on each read, and a node's several requests (a
	// requester's up to max_undecided_per_requester) each read it: held,
	// they cost one (review 211 F1). Only a read that ran out of its own
	// time is held: a node that refuses, or answers wrongly, answers at once.
	// Every caller of the Reader shares the hold (the kubelet-serving
	// audit's reads too): a read within it gets the held error.
	HoldTimedOut time.Duration

	// HoldTimedOutMax is what the hold grows to: each timeout of an
	// endpoint in a row doubles the last (HoldTimedOut, twice that, four
	// times...), less up to a tenth at random, up to HoldTimedOutMax; a
	// read that succeeds, or fails otherwise, starts it again. Zero means
	// HoldTimedOut: no growth. And once a hold is over, one read of the
	// endpoint at a time tries the node again: the others meanwhile get the
	// held error. A node that keeps hanging costs a caller Timeout once per
	// hold, not once per caller, so that many such nodes take few callers
	// (review 211 F1 rest: 32 nodes that hang took the 32 decision workers
	// 10 s of every 13; review 216). A timeout timeoutKept (10 minutes)
	// past its hold without a read since is forgotten, and so is every hold
	// of a Reader made anew.
	HoldTimedOutMax time.Duration
}

// Reader reads node identities. It is safe for concurrent use; its credential is
// shared by all reads and renewed before it expires.
type Reader struct {
	ca       *taloscert.CA
	roots    *x509.CertPool
	lifetime time.Duration
	timeout  time.Duration
	clock    func() time.Time
	denied   netguard.Denied

	mu   sync.Mutex
	cert *tls.Certificate

	holdTimedOut    time.Duration
	holdTimedOutMax time.Duration
	heldMu          sync.Mutex
	held            map[string]heldRead
}

// heldRead is a read that ran into the timeout, its error given again
// until the time, and the time a read of the endpoint last succeeded, so
// that a read that started before it and times out after it is not held
// (the node answers); how many timeouts in a row the endpoint's reads
// ran into, the last when, and whether a read tries it again now that the
// hold is over.
type heldRead struct {
	err      error
	until    time.Time
	okAt     time.Time
	timeouts int
	heldAt   time.Time
	retrying bool
}

// stale reports whether the entry's timeout no longer says anything of its
// node at now: timeoutKept past its hold, without a read since (its node
// may have been read through its watch meanwhile, which records nothing
// here).
func (h heldRead) stale(now time.Time) bool {
	return h.err != nil && !h.retrying && now.Sub(h.until) > timeoutKept
}

// ErrHeld marks an error given again for a read that timed out
// (Options.HoldTimedOut): nothing was sent to the node, so it says
// nothing new of it, nor how long a read takes.
var ErrHeld = errors.New("a read that timed out, given again without a read")

// held is a timed-out read's error given again: the same words (a
// condition, an Event, a decision's input say the same), and ErrHeld.
type held struct{ error }

func (h held) Unwrap() []error { return []error{h.error, ErrHeld} }

// maxHeld is the size past which each record sweeps out the entries that
// no longer matter (a held read's endpoint may never be read again); the
// entries that still do stay, so it is a threshold, not a bound: there is
// one at most per endpoint read within the timeout, or whose last timeout
// is within its hold and timeoutKept.
const maxHeld = 256

// timeoutKept is how long past its hold the timeout of an endpoint not read
// since says something of its node: read again within it, the node goes on
// with its growing hold (and one read at a time tries it); later, it is
// read as any node, and its next timeout holds it HoldTimedOut again.
const timeoutKept = 10 * time.Minute

// NewReader validates opts and parses the CA; it issues no credential yet.
func NewReader(opts Options) (*Reader, error) {
	lifetime := opts.CertificateLifetime
	switch {
	case lifetime == 0:
		lifetime = DefaultCertificateLifetime
	case lifetime < 0:
		return nil, fmt.Errorf("talosnode: certificate lifetime %s is negative", lifetime)
	case lifetime > MaxCertificateLifetime:
		// Refused rather than capped: a caller who asked for more must learn it
		// did not get it.
		return nil, fmt.Errorf("talosnode: certificate lifetime %s exceeds the maximum of %s", lifetime, MaxCertificateLifetime)
	}

	timeout := opts.Timeout
	switch {
	case timeout == 0:
		timeout = DefaultTimeout
	case timeout < 0:
		return nil, fmt.Errorf("talosnode: timeout %s is negative", timeout)
	}

	ca, err := taloscert.ParseCA(opts.CACertPEM, opts.CAKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("talosnode: %w", err)
	}

	clock := opts.Clock
	if clock == nil {
		clock = time.Now
	}

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	if opts.HoldTimedOut < 0 {
		return nil, fmt.Errorf("talosnode: hold of a timed-out read %s is negative", opts.HoldTimedOut)
	}

	holdMax := opts.HoldTimedOutMax
	switch {
	case holdMax == 0:
		holdMax = opts.HoldTimedOut
	case holdMax < opts.HoldTimedOut:
		return nil, fmt.Errorf("talosnode: the longest hold of a timed-out read %s is shorter than the first %s", holdMax, opts.HoldTimedOut)
	}

	return &Reader{
		ca: ca, roots: roots, lifetime: lifetime, timeout: timeout, clock: clock, denied: opts.Denied,
		holdTimedOut: opts.HoldTimedOut, holdTimedOutMax: holdMax,
	}, nil
}

// Read connects to the node's Talos API at endpoint (host or host:port; Talos's
// port 50000 if none) and reads its NodeIP "kubelet", Nodename and
// HostnameStatus. Any failure is an error naming the endpoint and the resource:
// a caller must treat the node as unreadable, never as having no identity.
func (r *Reader) Read(ctx context.Context, endpoint string) (Identity, error) {
	err, retry := r.beginRead(endpoint)
	if err != nil {
		return Identity{}, err
	}

	if retry {
		defer r.endRetry(endpoint)
	}

	start := r.clock()
	readCtx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()

	id, err := r.read(readCtx, endpoint)
	// A read its caller cut short (its turn ended) says nothing of the
	// node and changes nothing here; of the others, only one that ran out
	// of its own time is held.
	if ctx.Err() == nil {
		r.hold(endpoint, start, err, errors.Is(readCtx.Err(), context.DeadlineExceeded))
	}

	return id, err
}

// beginRead is the error of the endpoint's read that timed out while it is
// held, or while another read tries the node again; otherwise nil, and
// whether this read is the one that tries it again (then endRetry is owed).
func (r *Reader) beginRead(endpoint string) (err error, retry bool) {
	if r.holdTimedOut == 0 {
		return nil, false
	}

	r.heldMu.Lock()
	defer r.heldMu.Unlock()

	h, ok := r.held[endpoint]
	now := r.clock()

	switch {
	case !ok || h.err == nil:
		return nil, false
	case h.stale(now):
		delete(r.held, endpoint)
		return nil, false
	case h.retrying || now.Before(h.until):
		return held{h.err}, false
	}

	h.retrying = true
	r.held[endpoint] = h

	return nil, true
}

// endRetry ends the read that tried the endpoint again, whatever it came to.
func (r *Reader) endRetry(endpoint string) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()

	if h, ok := r.held[endpoint]; ok {
		h.retrying = false
		r.held[endpoint] = h
	}
}

// holdFor is the hold after the endpoint's nth timeout in a row: the first
// hold doubled for each before it, less up to a tenth at random so that
// nodes that hung at one moment are not all tried again at one moment, up
// to the longest.
func (r *Reader) holdFor(n int) time.Duration {
	d := r.holdTimedOut
	for i := 1; i < n && d < r.holdTimedOutMax; i++ {
		d *= 2
	}

	d = min(d, r.holdTimedOutMax)
	if n > 1 {
		d = max(jittered(d), r.holdTimedOut)
	}

	return d
}

// hold records the outcome of the endpoint's read that started at start: a
// success is remembered, a timeout held unless a read that started later
// has succeeded since (another caller's, while this one hung), any other
// failure ends a hold (the node answered, if only to refuse) and keeps
// the success's time.
func (r *Reader) hold(endpoint string, start time.Time, err error, timedOut bool) {
	if r.holdTimedOut == 0 {
		return
	}

	r.heldMu.Lock()
	defer r.heldMu.Unlock()

	now := r.clock()
	if len(r.held) >= maxHeld {
		for e, h := range r.held {
			// A success matters only to the reads that started before it,
			// which end within the timeout; a timeout, to the reads of its
			// endpoint within timeoutKept of its hold's end.
			if !h.retrying && (h.err == nil || h.stale(now)) && now.Sub(h.okAt) > r.timeout {
				delete(r.held, e)
			}
		}
	}

	if r.held == nil {
		r.held = map[string]heldRead{}
	}

	h := r.held[endpoint]
	switch {
	case err == nil:
		h = heldRead{okAt: now, retrying: h.retrying}
	case !timedOut:
		h.err, h.timeouts = nil, 0
	case h.okAt.After(start):
		// The node answered another read since this one started.
		return
	case h.err != nil && start.Before(h.heldAt):
		// A read under way when the node's last timeout was held (the
		// node's own request beside the audit's read, say) is not another
		// timeout in a row: the hold stands.
		return
	default:
		h.timeouts++
		h.err, h.until, h.heldAt = err, now.Add(r.holdFor(h.timeouts)), now
	}
	r.held[endpoint] = h
}

func (r *Reader) read(ctx context.Context, endpoint string) (Identity, error) {
	c, err := r.connect(ctx, endpoint, grpc.WithReadBufferSize(0))
	if err != nil {
		return Identity{}, err
	}

	defer c.Close() //nolint:errcheck // nothing was written; a close error changes nothing

	nodeIP, err := safe.StateGetByID[*k8s.NodeIP](ctx, c.COSI, k8s.KubeletID)
	if err != nil {
		return Identity{}, fmt.Errorf("talos node %s: read %s %s/%s: %w", endpoint, k8s.NodeIPType, k8s.NamespaceName, k8s.KubeletID, err)
	}

	nodename, err := safe.StateGetByID[*k8s.Nodename](ctx, c.COSI, k8s.NodenameID)
	if err != nil {
		return Identity{}, fmt.Errorf("talos node %s: read %s %s/%s: %w", endpoint, k8s.NodenameType, k8s.NamespaceName, k8s.NodenameID, err)
	}

	hostname, err := safe.StateGetByID[*network.HostnameStatus](ctx, c.COSI, network.HostnameID)
	if err != nil {
		return Identity{}, fmt.Errorf("talos node %s: read %s %s/%s: %w", endpoint, network.HostnameStatusType, network.NamespaceName, network.HostnameID, err)
	}

	if err := answeredAsAsked(nodeIP.Metadata(), nodename.Metadata(), hostname.Metadata()); err != nil {
		return Identity{}, fmt.Errorf("talos node %s: %w", endpoint, err)
	}

	if err := checkNodeIP(nodeIP.TypedSpec()); err != nil {
		return Identity{}, fmt.Errorf("talos node %s: %w", endpoint, err)
	}

	if err := checkNodename(nodename.TypedSpec()); err != nil {
		return Identity{}, fmt.Errorf("talos node %s: %w", endpoint, err)
	}

	if err := checkHostname(hostname.TypedSpec()); err != nil {
		return Identity{}, fmt.Errorf("talos node %s: %w", endpoint, err)
	}

	return Identity{
		Nodename:  nodename.TypedSpec().Nodename,
		Hostname:  hostname.TypedSpec().Hostname,
		Addresses: canonicalAddresses(nodeIP.TypedSpec().Addresses),
	}, nil
}

// answeredAsAsked refuses an answer that is not the resource asked for: a
// Get is answered with whatever the node sends, checked only for its Go
// type, so a NodeIP of another ID (etcd's addresses for the kubelet's) or
// namespace passed, where a watch ignores it (review 261 F2).
func answeredAsAsked(mds ...*resource.Metadata) error {
	for _, md := range mds {
		if !watched(md) {
			return fmt.Errorf("asked for the identity's resources, answered %s %s/%s", md.Type(), md.Namespace(), md.ID())
		}
	}

	return nil
}

// What a node's identity may hold, far above what Talos reports (a name of
// at most 253 bytes, as DNS allows; the kubelet's addresses, one or two) and
// below what costs the manager: within the 64 KiB a message could be then,
// a node sent 32,000 empty addresses, each kept decoded, listed and logged,
// about 1.5 MB a watch and a thousand watches at once (review of
// 2026-12-06). An identity beyond them is unreadable, its watch ended.
const (
	MaxAddresses = 16
	MaxNameBytes = 253
)

func checkNodeIP(spec *k8s.NodeIPSpec) error {
	if n := len(spec.Addresses); n > MaxAddresses {
		return fmt.Errorf("%s %s/%s lists %d addresses, more than the %d a node is read with", k8s.NodeIPType, k8s.NamespaceName, k8s.KubeletID, n, MaxAddresses)
	}

	return nil
}

func checkNodename(spec *k8s.NodenameSpec) error {
	if n := len(spec.Nodename); n > MaxNameBytes {
		return fmt.Errorf("%s %s/%s is %d bytes, more than the %d a name may be", k8s.NodenameType, k8s.NamespaceName, k8s.NodenameID, n, MaxNameBytes)
	}

	return nil
}

// checkHostname bounds the domain name too: the spec is kept whole while a
// watch lives.
func checkHostname(spec *network.HostnameStatusSpec) error {
	if n := max(len(spec.Hostname), len(spec.Domainname)); n > MaxNameBytes {
		return fmt.Errorf("%s %s/%s holds a name of %d bytes, more than the %d a name may be", network.HostnameStatusType, network.NamespaceName, network.HostnameID, n, MaxNameBytes)
	}

	return nil
}

// connect makes a client of the node's Talos API with the reader's
// credential; gRPC dials on the first call. A connection that carries a few
// small reads and is closed wants grpc.WithReadBufferSize(0): gRPC's 32 KiB
// read buffer per connection was a sixteenth of all the manager allocated in
// a burst, and TLS reads whole records into its own buffer, so the framer
// reads from it directly.
func (r *Reader) connect(ctx context.Context, endpoint string, opts ...grpc.DialOption) (*client.Client, error) {
	cert, err := r.credential()
	if err != nil {
		return nil, fmt.Errorf("talos node %s: %w", endpoint, err)
	}

	once := &oneConnection{dial: r.dial}

	c, err := client.New(ctx,
		client.WithEndpoints(endpoint),
		client.WithTLSConfig(&tls.Config{
			RootCAs:          r.roots,
			Certificates:     []tls.Certificate{*cert},
			MinVersion:       tls.VersionTLS12,
			VerifyConnection: once.verifyOnce,
		}),
		// An identity is a few hundred bytes: a node gets no more than
		// this for an answer or an event (gRPC's default is 4 MiB, Talos's
		// client sets 32). The connection goes to the endpoint itself,
		// never through $HTTPS_PROXY (whose address the guard would
		// check instead), and only outside the denied networks; and no
		// service config is taken from the endpoint's DNS (a TXT record
		// whoever names the endpoint may write). Its headers are bounded
		// too (gRPC's default is 16 MiB, kept for a stream's life and, as
		// a status message, in every error: the hostile review of
		// 2026-12-05).
		// One connection a client (oneConnection): the three reads of an
		// identity, and a watch's three streams, are each one node's.
		client.WithGRPCDialOptions(append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)), grpc.WithMaxHeaderListSize(maxHeaderList), grpc.WithNoProxy(), grpc.WithContextDialer(once.dialOnce), grpc.WithDisableServiceConfig())...),
	)
	if err != nil {
		return nil, fmt.Errorf("talos node %s: connect: %w", endpoint, err)
	}

	return c, nil
}

// oneConnection keeps a gRPC client to the first node whose certificate it
// verified. An endpoint several nodes answer (a name in DNS round robin, a
// VIP in every control plane's certSANs) would otherwise let gRPC's
// reconnection after a dropped connection or a GOAWAY reach another node
// between one read and the next, or between a watch's streams, and an
// identity be put together from two nodes' answers: one node's addresses
// under another's name (review 261 F1). Until a node's certificate is
// verified every address a name resolves to may be tried, in parallel as
// gRPC's pick_first tries them, and a handshake that fails (a CA rotated, a
// host that is no node) leaves the next address to be tried; once one is,
// no dial is made and no other handshake is accepted, so a read or a watch
// whose connection is lost fails, and the next one connects anew (review
// 262 F1, F2).
type oneConnection struct {
	dial func(context.Context, string) (net.Conn, error)

	mu       sync.Mutex
	verified bool
}

// errConnectionLost refuses a dial, or a handshake, after the client's node
// was verified.
var errConnectionLost = errors.New("the connection to the node was lost: a read or a watch is one connection to one node, never made again")

func (o *oneConnection) dialOnce(ctx context.Context, addr string) (net.Conn, error) {
	o.mu.Lock()
	verified := o.verified
	o.mu.Unlock()

	if verified {
		return nil, errConnectionLost
	}

	return o.dial(ctx, addr)
}

// verifyOnce is the TLS configuration's VerifyConnection, called once the
// node's certificate chain was verified: the first node is the client's,
// any later handshake is refused.
func (o *oneConnection) verifyOnce(tls.ConnectionState) error {
	o.mu.Lock()
	defer o.mu.Unlock()

	if o.verified {
		return errConnectionLost
	}

	o.verified = true

	return nil
}

// dial connects to a node's address as Talos's client does (TCP keepalives),
// refusing an address in a denied network before anything is sent.
func (r *Reader) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := dialer.NetDialerWithTCPKeepalive()
	d.Control = r.denied.Control
	return d.DialContext(ctx, "tcp", addr)
}

// credential returns the cached client certificate, issuing a new one when it
// has less than a third of its lifetime (or one read timeout) left, so a read
// never starts with a credential about to expire.
func (r *Reader) credential() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()

	now := r.clock()

	if r.cert != nil && now.Before(r.cert.Leaf.NotAfter.Add(-r.renewBefore())) && !now.Before(r.cert.Leaf.NotBefore) {
		return r.cert, nil
	}

	cert, err := r.issue(now)
	if err != nil {
		return nil, err
	}

	r.cert = cert

	return cert, nil
}

func (r *Reader) renewBefore() time.Duration {
	return renewBefore(r.lifetime, r.timeout)
}

// renewBefore is how long before its expiry a credential of that lifetime
// is renewed: a third of it, and never less than one read's timeout.
func renewBefore(lifetime, timeout time.Duration) time.Duration {
	return max(lifetime/3, timeout)
}

// issue makes a fresh key for every credential: it never leaves memory, so
// there is nothing to rotate or revoke but the certificate itself.
func (r *Reader) issue(now time.Time) (*tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate reader key: %w", err)
	}

	// Start the validity a little in the past so a node whose clock runs behind
	// ours does not refuse a fresh credential; the whole window stays r.lifetime.
	backdate := min(maxBackdate, r.lifetime/10)

	certPEM, err := r.ca.Issue(taloscert.ClientCertificate{
		Role:       ReaderRole,
		PublicKey:  pub,
		CommonName: "ichor-policy-talosnode",
		NotBefore:  now.Add(-backdate),
		Lifetime:   r.lifetime,
	})
	if err != nil {
		return nil, fmt.Errorf("issue reader certificate: %w", err)
	}

	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode reader key: %w", err)
	}

	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return nil, fmt.Errorf("load reader certificate: %w", err)
	}

	if cert.Leaf == nil {
		return nil, errors.New("load reader certificate: no parsed leaf")
	}

	return &cert, nil
}

func canonicalAddresses(addrs []netip.Addr) []string {
	out := []string{}
	seen := map[netip.Addr]struct{}{}

	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}

		a = a.Unmap().WithZone("")

		if _, dup := seen[a]; dup {
			continue
		}

		seen[a] = struct{}{}
		out = append(out, a.String())
	}

	return out
}
