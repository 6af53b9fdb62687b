package kubeconfig

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
)

// ErrServerIsLocal is a connection refused because its peer is the
// manager's own API server (its key, or a certificate of its CA).
var ErrServerIsLocal = errors.New("the peer presents the key or a certificate of the CA of the manager's own API server: a remote cluster's client does not talk to it")

// ResponseHeaderTimeout is how long a remote API server has to start its
// answer to any request.
const ResponseHeaderTimeout = 30 * time.Second

// MaxResponseBytes bounds the body of a remote API server's list: a list of
// ten thousand CSRs is about 30 MiB (an error's answer, a watch's included,
// is bounded to MaxErrorResponseBytes). A
// watch is a stream of events, each bounded to MaxWatchEventBytes, and what
// the manager keeps of it is bounded where it is kept (the remote cache's
// limits in controllers/kubeletserving).
const MaxResponseBytes = 64 << 20

// MaxObjectResponseBytes bounds every other answer of a remote API server
// (one CSR read or its approval written, /version, a review): an object is
// at most what etcd stores, 1.5 MiB by default. A server that held a dozen
// such answers at the list's bound would take most of the manager's memory
// at once (review of 2026-12-05).
const MaxObjectResponseBytes = 4 << 20

// DefaultListBytes bounds the bytes of the lists being read at once from
// one tenant's servers (Local.ListBytes): each list may be
// MaxResponseBytes, and a tenant's clusters relist on their own (their
// watches broken together, say), so without a bound twenty of them would
// hold over a gigabyte in the manager, which every tenant shares, before the
// tenant's bounds (counted as the lists are decoded) could refuse them. The
// bound is the tenant's, not shared: a server that drips its list holds
// back only its own tenant's.
const DefaultListBytes = MaxResponseBytes

// byteBudget is what one tenant's lists being read hold together, and
// their bound.
type byteBudget struct {
	mu          sync.Mutex
	used, limit int64
}

// take counts n bytes more, if they fit.
func (b *byteBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return false
	}
	b.used += n
	return true
}

func (b *byteBudget) give(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
}

// listBudget is the budget every client the Local builds for tenant
// shares. A tenant's is kept for the manager's life: a few words for each
// namespace that ever named a kubeconfig.
func (l *Local) listBudget(tenant string) *byteBudget {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lists == nil {
		l.lists = map[string]*byteBudget{}
	}
	b, ok := l.lists[tenant]
	if !ok {
		limit := l.ListBytes
		if limit <= 0 {
			limit = DefaultListBytes
		}
		b = &byteBudget{limit: limit}
		l.lists[tenant] = b
	}
	return b
}

// AnswerTooLargeError is an answer (or a watch's event) of a remote API
// server beyond what the manager reads of one: the caller can tell it from
// a server that cannot be reached.
type AnswerTooLargeError struct{ msg string }

func (e *AnswerTooLargeError) Error() string { return e.msg }

func tooLarge(format string, args ...any) error {
	return &AnswerTooLargeError{msg: fmt.Sprintf(format, args...)}
}

type tooLargeKey struct{}

// WithAnswerTooLarge has told called with the error when an answer to a
// request made with the context it returns is past its bound. A watch's
// event past MaxWatchEventBytes ends the stream inside client-go, which
// keeps only its message: this is how its caller learns what it was.
func WithAnswerTooLarge(ctx context.Context, told func(error)) context.Context {
	return context.WithValue(ctx, tooLargeKey{}, told)
}

// answerTooLarge is err, told to whoever asked with WithAnswerTooLarge.
func answerTooLarge(ctx context.Context, err error) error {
	if told, ok := ctx.Value(tooLargeKey{}).(func(error)); ok {
		told(err)
	}
	return err
}

// How long a connection to a tenant's server may be silent before it is
// pinged, and how long the ping may go unanswered before the connection is
// closed: client-go's own (HTTP2_READ_IDLE_TIMEOUT_SECONDS,
// HTTP2_PING_TIMEOUT_SECONDS). Variables for the tests alone.
var (
	http2ReadIdleTimeout = 30 * time.Second
	http2PingTimeout     = 15 * time.Second
)

// checkServer refuses, whatever a bundle says, a server URL that is not
// https: over plain HTTP neither the server's identity nor whether it is
// the manager's own is checked, and the tenant's token travels in clear;
// one with a user name or password (Go's client sends it as basic
// authentication, beside the allow-listed credential, and client-go logs
// the address whole); and one longer than any real address, which the
// probe's errors and client-go's, logged at every retry of the watch,
// quote whole: 250 KiB a line for a document's worth (review 236 F2,
// review 237 F5). The error never quotes the address: it may hold a
// password, and is the tenant's to make long.
func checkServer(host string) error {
	server, err := url.Parse(host)
	switch {
	case err != nil || server.Scheme != "https":
		return errors.New("the kubeconfig's server is not https://: only an https:// server is reached")
	case server.User != nil:
		return errors.New("the kubeconfig's server URL holds a user name or password: the credential is the user's token or certificate alone")
	case len(host) > MaxServerBytes:
		return fmt.Errorf("the kubeconfig's server URL is %d bytes, more than the %d an API server's address needs", len(host), MaxServerBytes)
	}
	return nil
}

// RESTConfig is the client configuration of the document's server
// (Document.RESTConfig) whose every connection is checked, not only the
// first probe: each TLS handshake refuses a peer that presents the local API
// server's key or a chain that verifies against its CA (so a redirect, a new
// DNS answer or a reconnection cannot reach it), no connection goes to an
// address in a denied network (Local.Denied), no proxy is used (the
// client goes where the probe went), an HTTP redirect is an error, never
// followed with the tenant's credential, and an answer is read as sent
// (no compression is asked for, so a few kilobytes on the wire cannot
// inflate to gigabytes in the manager) and no further than
// MaxResponseBytes, but a watch's.
func (l *Local) RESTConfig(ctx context.Context, tenant string, d *Document, insecure bool) (*rest.Config, error) {
	if l == nil {
		return nil, errors.New("the manager's own API server is not known, so no server can be told apart from it")
	}
	cfg, err := d.RESTConfig(insecure)
	if err != nil {
		return nil, err
	}
	// The rule takes https only; so does this, whatever a bundle says:
	// over plain HTTP neither the server's identity nor whether it is the
	// manager's own is checked, and the tenant's token travels in clear.
	if err := checkServer(cfg.Host); err != nil {
		return nil, err
	}
	if _, _, err := l.load(ctx, true); err != nil {
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
		// The local API server's keys and CA as now read: this client
		// lives as long as the tenant's kubeconfig, past their rotation.
		// Read again in the background: a handshake does not wait on it.
		localKeys, roots, err := l.load(context.Background(), false)
		if err != nil {
			return err
		}
		id := identify(cs.PeerCertificates, localKeys, roots)
		if id.SameKeyAsLocal || id.VerifiesWithLocalCA {
			return ErrServerIsLocal
		}
		return nil
	}
	noProxy := func(*http.Request) (*url.URL, error) { return nil, nil }
	// A tenant names the server, so the address each connection reaches is
	// checked (DNS may answer differently for the next one): the
	// manager's loopback, the node's link, and what else the operator
	// denies, are not the tenant's to reach or to probe.
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: l.Denied.Control}
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
		// Go would ask for gzip and inflate the answer without a bound: a
		// tenant's server sent 216 KB that became 200 MB of CSRs (review
		// 28 H1).
		DisableCompression: true,
		// Go takes 10 MiB of headers an answer by default, and client-go
		// parses every Warning among them: an API server's own headers
		// are a few hundred bytes.
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		// What the server sends before client-go reads it waits in these
		// windows, outside the tenant's budget of bytes being read (which
		// counts what is read): Go's defaults, 4 MiB a stream and 1 GiB a
		// connection, would let each watch of a tenant hold megabytes
		// (review 165). A watch's events and a list's pages are read as
		// they come, so a small window costs them nothing but a round trip
		// a window.
		//
		// And a connection that goes silent is pinged, and closed when the
		// ping is not answered: client-go sets this health check on the
		// transports it makes, never on one it is given, and without it a
		// watch on a path that dropped its packets (a load balancer's
		// backend gone) held the cache synced on nothing for the TCP
		// keepalive's many minutes, or for good behind a middlebox that
		// keeps the connection (review 191).
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream:     MaxReceiveBufferPerStream,
			MaxReceiveBufferPerConnection: 4 * MaxReceiveBufferPerStream,
			SendPingTimeout:               http2ReadIdleTimeout,
			PingTimeout:                   http2PingTimeout,
		},
	}
	// A tenant's server chooses its warnings' text and number: the
	// manager's log (where the process-wide handler writes every one) is
	// not theirs to fill (review of 2026-12-05).
	cfg.WarningHandler = nil
	cfg.WarningHandlerWithContext = rest.NoWarnings{}
	// A server behind a path (a proxy's https://host/k8s/clusters/c-x) has
	// client-go put the path before every request's: a list's is the
	// collection's under it.
	host, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's server: %w", err)
	}
	prefix := strings.TrimSuffix(host.Path, "/")
	lists := l.listBudget(tenant)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return noRedirects{boundedAnswers{rt: rt, prefix: prefix, lists: lists}}
	}
	return cfg, nil
}

// boundedAnswers holds the body of a list to MaxResponseBytes, of any other
// answer but a watch's stream to MaxObjectResponseBytes, and each event of a
// JSON watch to MaxWatchEventBytes: client-go reads each whole before it
// decodes it.
type boundedAnswers struct {
	rt http.RoundTripper
	// prefix is the server's own path, before every request's.
	prefix string
	// lists is what the lists being read from the tenant's servers hold
	// together.
	lists *byteBudget
}

func (b boundedAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	watching := req.URL.Query().Get("watch") == "true"
	if watching && resp.StatusCode == http.StatusOK {
		// A watch's stream. client-go's decoder bounds a protobuf event
		// before it reads it, but a JSON event is read whole before the
		// bound is checked (review 30 H2): no event may be longer than
		// the decoder would take. Protobuf only when client-go decodes the
		// stream as protobuf: the media type itself, never a parameter or
		// a longer name that merely holds the word. Either way the event
		// being read takes its bytes from the tenant's budget (review 62).
		what := req.Method + " " + req.URL.Redacted()
		held := &heldBytes{budget: b.lists, what: what}
		contentType := resp.Header.Get("Content-Type")
		mediaType, _, _ := mime.ParseMediaType(contentType)
		switch {
		case mediaType == protobufMediaType:
			resp.Body = &boundedFrames{ReadCloser: resp.Body, what: what, ctx: req.Context(), held: held}
		case mediaType == "application/json" || contentType == "":
			// No type is JSON to client-go too.
			resp.Body = &boundedEvents{ReadCloser: resp.Body, what: what, ctx: req.Context(), held: held}
		default:
			// client-go would refuse it without closing the body, and
			// the tenant's server would hold the connection. The type
			// is the tenant's to make long: cut.
			_ = resp.Body.Close()
			return nil, fmt.Errorf("%s: a watch answered as %q, neither JSON nor protobuf", what, servingcert.Clip(contentType, 128))
		}
		return resp, nil
	}
	bound := int64(MaxObjectResponseBytes)
	var budget *byteBudget
	if path, under := strings.CutPrefix(req.URL.Path, b.prefix); req.Method == http.MethodGet && under && isCollection(path) {
		bound, budget = MaxResponseBytes, b.lists
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 || watching {
		// An error's answer, a list's or a watch's included (a watch
		// answered with anything but 200 is one to client-go): client-go
		// keeps a Status's message whole, wraps it in the errors it
		// returns and logs them (review 62).
		bound, budget = MaxErrorResponseBytes, nil
	}
	if resp.ContentLength > bound {
		_ = resp.Body.Close()
		return nil, tooLarge("%s %s: the answer is %d bytes, more than the %d a remote API server's answer may be", req.Method, req.URL.Redacted(), resp.ContentLength, bound)
	}
	resp.Body = &boundedBody{ReadCloser: resp.Body, left: bound, bound: bound, what: req.Method + " " + req.URL.Redacted(), budget: budget, lease: leaseOf(req.Context())}
	return resp, nil
}

// isCollection reports whether path names a collection of an API group
// (/api/v1/R, /apis/G/V/R, each also under /namespaces/N): a list's. Any
// other answer (one object read or written, a subresource, /version, a
// review) is bounded to MaxObjectResponseBytes.
func isCollection(path string) bool {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) > 0 && parts[0] == "api":
		parts = parts[min(2, len(parts)):]
	case len(parts) > 0 && parts[0] == "apis":
		parts = parts[min(3, len(parts)):]
	default:
		return false
	}
	if len(parts) == 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	return len(parts) == 1 && parts[0] != ""
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (b boundedAnswers) WrappedRoundTripper() http.RoundTripper { return b.rt }

// MaxErrorResponseBytes bounds a remote API server's answer that is not a
// success: an API server's Status is a few hundred bytes, and the message
// of one a tenant's server sent at a list's bound (64 MiB, three times that
// once its invalid UTF-8 is decoded) was copied into client-go's errors and
// logged whole, each time the list was asked again.
const MaxErrorResponseBytes = 64 << 10

// MaxResponseHeaderBytes bounds the headers of a remote API server's
// answer.
const MaxResponseHeaderBytes = 64 << 10

// MaxReceiveBufferPerStream is the HTTP/2 window a remote API server's
// answer is granted: what it may send before it is read. A connection's is
// four times as much.
//
// A window is what crosses a round trip: at 1 MiB a list of 40 MB (a tenant
// at --tenant-max-csrs) over 150 ms takes about 6 s, within the initial
// sync's TenantRequestTimeout, where 256 KiB took 24 s (review 167).
const MaxReceiveBufferPerStream = 1 << 20

// MaxWatchEventBytes bounds one event of a remote API server's JSON watch:
// client-go's own bound on a decoded object (16 MiB).
const MaxWatchEventBytes = 16 << 20

// protobufMediaType is the media type client-go decodes a watch's stream
// as protobuf by; every other stream is bounded as JSON.
const protobufMediaType = "application/vnd.kubernetes.protobuf"

// boundedEvents fails a read once more than MaxWatchEventBytes have come
// since the last event of a JSON watch ended. An event is a JSON value that
// client-go's decoder reads whole before it looks at its size, and JSON may
// break a value over any number of lines between its tokens: the events are
// told apart by their nesting, outside strings, not by line breaks (a
// per-line bound let an event of endless short lines through). Whatever is
// not an object or an array, whitespace between events included, counts
// toward the next event.
type boundedEvents struct {
	io.ReadCloser
	event int64 // bytes since the last event ended
	depth int   // of objects and arrays open, outside strings
	// inString and escaped follow JSON's strings, whose brackets and
	// quotes nest nothing.
	inString, escaped bool
	what              string
	// ctx is the request's, whose asker is told of an event past the
	// bound (WithAnswerTooLarge), once.
	ctx  context.Context //nolint:containedctx // the request's, for the one error it tells
	told bool
	// held charges the tenant's budget for the events being read.
	held *heldBytes
}

func (b *boundedEvents) Read(p []byte) (int, error) {
	if b.event > MaxWatchEventBytes {
		return 0, b.tooLong()
	}
	if rest := MaxWatchEventBytes - b.event; int64(len(p)) > rest+1 {
		p = p[:rest+1] // a byte past the bound tells an event of exactly it from a longer one
	}
	n, err := b.ReadCloser.Read(p)
	// peak is the longest event that ended in this read: a read may hold
	// whole events, each of which the decoder grew its buffer for.
	var peak int64
	for _, c := range p[:n] {
		if b.event++; b.event > MaxWatchEventBytes {
			return 0, b.tooLong()
		}
		switch {
		case b.inString:
			switch {
			case b.escaped:
				b.escaped = false
			case c == '\\':
				b.escaped = true
			case c == '"':
				b.inString = false
			}
		case c == '"':
			b.inString = true
		case c == '{' || c == '[':
			b.depth++
		case (c == '}' || c == ']') && b.depth > 0:
			if b.depth--; b.depth == 0 {
				peak = max(peak, b.event)
				b.event = 0
			}
		}
	}
	if err := b.held.atLeast(jsonDecoderHolds(max(peak, b.event))); err != nil {
		return 0, err
	}
	return n, err
}

// jsonDecoderHolds is what client-go keeps for a JSON watch event of n
// bytes, about: encoding/json's decoder grows its buffer by doubling to hold
// it whole, and the streaming decoder's frame buffer is a power of two
// from 1 KiB at least as long.
func jsonDecoderHolds(n int64) int64 { return 3 * frameBuffer(n) }

// frameBuffer is the buffer client-go's streaming decoder grows to for a
// frame of n bytes: 1 KiB, doubled until it holds it.
func frameBuffer(n int64) int64 {
	b := int64(1 << 10)
	for b < n {
		b <<= 1
	}
	return b
}

// Close gives back what the watch's events took of the budget.
func (b *boundedEvents) Close() error {
	b.held.release()
	return b.ReadCloser.Close()
}

// heldBytes is what a watch's stream takes of its tenant's budget (shared
// with its lists): as much as the largest event it has read, or is
// reading, until the stream is closed. The decoder reads an event whole
// before it is one, and keeps the buffer it grew for it as long as the
// watch lasts, so an event that ended holds its memory still: many
// watches of one tenant, each sending an event near the bound (ended or
// never ended), hold no more than its lists may (review 62).
type heldBytes struct {
	budget *byteBudget
	what   string
	// mu guards held and closed: Close may come from another goroutine
	// while Read waits for the stream.
	mu     sync.Mutex
	held   int64
	closed bool
}

// atLeast has the stream hold n bytes of the budget if it holds fewer:
// an error when the budget cannot.
func (h *heldBytes) atLeast(n int64) error {
	if h == nil || h.budget == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || n <= h.held {
		return nil
	}
	if !h.budget.take(n - h.held) {
		return fmt.Errorf("%s: %w (%d bytes), with this watch's events: the watch is made again", h.what, ErrListsTooLarge, h.budget.limit)
	}
	h.held = n
	return nil
}

// release gives back what the stream held, once.
func (h *heldBytes) release() {
	if h == nil || h.budget == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.budget.give(h.held)
	h.held = 0
}

// boundedFrames follows a protobuf watch's frames (a 4-byte big-endian
// length, then that many bytes): client-go's decoder grows its buffer to
// hold the length declared (frameBuffer), so that is charged to the
// tenant's budget as soon as the length is read, and a frame past MaxWatchEventBytes is refused before
// any of it is (client-go would refuse it too, only later).
type boundedFrames struct {
	io.ReadCloser
	what string
	ctx  context.Context //nolint:containedctx // the request's, for the one error it tells
	held *heldBytes
	// header is the length being read (got of its 4 bytes); left is what
	// remains of the frame it announced.
	header [4]byte
	got    int
	left   int64
	// failed is the error that ended the stream: every later read
	// answers it, rather than read the rest of a frame as headers.
	failed error
}

func (b *boundedFrames) Read(p []byte) (int, error) {
	if b.failed != nil {
		return 0, b.failed
	}
	n, err := b.ReadCloser.Read(p)
	for i := 0; i < n; {
		if b.left > 0 {
			k := min(int64(n-i), b.left)
			b.left -= k
			i += int(k)
			continue
		}
		b.header[b.got] = p[i]
		b.got++
		i++
		if b.got < len(b.header) {
			continue
		}
		b.got = 0
		size := int64(binary.BigEndian.Uint32(b.header[:]))
		if size > MaxWatchEventBytes {
			b.failed = answerTooLarge(b.ctx, tooLarge("%s: an event of the watch is %d bytes, more than the %d a remote API server's event may be", b.what, size, int64(MaxWatchEventBytes)))
			return 0, b.failed
		}
		if err := b.held.atLeast(frameBuffer(size)); err != nil {
			b.failed = err
			return 0, err
		}
		b.left = size
	}
	return n, err
}

// Close gives back what the watch's frames took of the budget.
func (b *boundedFrames) Close() error {
	b.held.release()
	return b.ReadCloser.Close()
}

func (b *boundedEvents) tooLong() error {
	err := tooLarge("%s: an event of the watch is more than the %d bytes a remote API server's event may be", b.what, int64(MaxWatchEventBytes))
	if b.told {
		return err
	}
	b.told = true
	return answerTooLarge(b.ctx, err)
}

// boundedBody fails a read past its bound, rather than ending the body
// early: a list cut short would decode as an error anyway, and this one
// says why.
type boundedBody struct {
	io.ReadCloser
	left, bound int64
	what        string
	// budget, for a list, counts what it has read (taken) until it is
	// closed, together with the tenant's other lists being read.
	budget *byteBudget
	taken  atomic.Int64
	lease  *listLease
}

// ErrListsTooLarge is a list refused because the lists being read from its
// tenant's servers at once already hold what the manager reads of them
// together: client-go asks again.
var ErrListsTooLarge = errors.New("the lists being read from the tenant's API servers hold what the manager reads of them at once")

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells an answer of exactly the bound from a longer one.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, tooLarge("%s: the answer is more than the %d bytes a remote API server's answer may be", b.what, b.bound)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.budget != nil && n > 0 {
		if !b.budget.take(int64(n)) {
			return 0, fmt.Errorf("%s: %w (%d bytes): this one is asked again", b.what, ErrListsTooLarge, b.budget.limit)
		}
		b.taken.Add(int64(n))
	}
	return n, err
}

// Close gives back what a list took of the budget, or hands it to the
// request's lease (WithListLease): client-go closes the body once it has
// read it, and decodes it after.
func (b *boundedBody) Close() error {
	if b.budget != nil {
		if n := b.taken.Swap(0); !b.lease.keep(b.budget, n) {
			b.budget.give(n)
		}
	}
	return b.ReadCloser.Close()
}

type listLeaseKey struct{}

// listLease keeps what the lists read with its context took of their
// tenant's budget until it is released.
type listLease struct {
	mu       sync.Mutex
	budget   *byteBudget
	n        int64
	released bool
}

// WithListLease is ctx carrying a lease, and its release: a list read with
// it (through a client RESTConfig built) keeps the bytes it took of its
// tenant's budget past its body's close, until release, so that the
// budget bounds the lists being read and decoded, not only read. The
// caller releases it once it has the decoded list.
func WithListLease(ctx context.Context) (context.Context, func()) {
	l := &listLease{}
	return context.WithValue(ctx, listLeaseKey{}, l), l.release
}

func leaseOf(ctx context.Context) *listLease {
	l, _ := ctx.Value(listLeaseKey{}).(*listLease)
	return l
}

// keep holds n bytes of b until the release, unless there is no lease or
// it was released already (then the caller gives them back).
func (l *listLease) keep(b *byteBudget, n int64) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released || (l.budget != nil && l.budget != b) {
		return false
	}
	l.budget = b
	l.n += n
	return true
}

func (l *listLease) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.released && l.budget != nil {
		l.budget.give(l.n)
	}
	l.released, l.n = true, 0
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
