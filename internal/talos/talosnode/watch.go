package talosnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	cosiclient "github.com/cosi-project/runtime/pkg/state/protobuf/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/flowcontrol"
)

const (
	// DefaultWatchMaxAge is the freshness bound when WatchOptions.MaxAge is
	// zero.
	DefaultWatchMaxAge = 2 * time.Minute

	// DefaultWatchDials is WatchOptions.Dials when zero.
	DefaultWatchDials = 8
)

// WatchOptions configures the watches of a Reader.
type WatchOptions struct {
	// MaxAge is the freshness bound: an identity is taken from a watch for
	// at most MaxAge after the watch's connection was made, then the watch
	// is made anew (a new connection, the credential of the moment, the
	// node's state read again). A node whose changes stopped reaching Ichor
	// (a stream stalled in between, or a node that says one thing in its
	// events and another when asked) is read afresh within MaxAge. Zero
	// means DefaultWatchMaxAge; it is capped at the reader's renewal margin
	// less a read timeout, so that no connection outlives the credential it
	// was made with, and must be longer than a read timeout.
	MaxAge time.Duration

	// Dials bounds how many watches are being established at once, so that
	// a start with thousands of machines is not thousands of handshakes at
	// the same moment. Zero means DefaultWatchDials.
	Dials int

	// Ended, if set, is told why each watch ended (not when Keep or Stop
	// ended it): a watch's failure is otherwise seen only as the live
	// watches falling (review 261 F3). It is called from each node's
	// watch, concurrently, and must not block.
	Ended func(WatchEnd)
}

// WatchEnd is why a watch ended, as a metric's label says it.
type WatchEnd string

const (
	// WatchAged: the watch reached its age, synced, and is made anew.
	WatchAged WatchEnd = "aged"
	// WatchLost: its connection could not be made or failed (a node
	// down, a stream broken, a GOAWAY), the node sent an error, or the
	// reader's credential could not be issued.
	WatchLost WatchEnd = "lost"
	// WatchNotSynced: it was not established, or not synced, within its
	// bounds (a read's timeout, its age): a node that takes the connection
	// and never answers, or an address that never answers at all.
	WatchNotSynced WatchEnd = "not_synced"
	// WatchRefused: the node sent more than a watch takes (events or
	// messages), an identity beyond its bounds, or ResourceExhausted.
	WatchRefused WatchEnd = "refused"
)

// errNotSynced and errRefused mark a watch's end for WatchEnd.
var (
	errNotSynced = errors.New("watch not synced")
	errRefused   = errors.New("watch refused")
)

// watchEnd is why a watch that returned err ended.
func watchEnd(err error) WatchEnd {
	switch {
	case err == nil:
		return WatchAged
	case errors.Is(err, errNotSynced):
		return WatchNotSynced
	case errors.Is(err, errRefused) || status.Code(err) == codes.ResourceExhausted:
		return WatchRefused
	}

	return WatchLost
}

// Source says where an identity came from.
type Source string

const (
	// FromWatch: the node's live watch, established, synced and younger
	// than the bound.
	FromWatch Source = "watch"
	// FromRead: a direct read (Reader.Read), because the node had no such
	// watch.
	FromRead Source = "read"
)

// Watches keeps one live COSI watch per node it is told to watch, over the
// authenticated Talos API with the reader's credential, and answers identity
// reads from it: the node's NodeIP "kubelet", Nodename and HostnameStatus as
// the node last reported them, without a handshake per decision. Whenever a
// node's watch is not established, not synced (the three initial states not
// all read) or older than MaxAge, Read reads the node directly, so an
// identity is never older than the bound and never comes from anything but
// the node (ADR 0125).
//
// It is safe for concurrent use. Stop ends every watch.
type Watches struct {
	ended   func(WatchEnd)
	reader  *Reader
	maxAge  time.Duration
	dials   chan struct{}
	backoff wait.Backoff

	ctx    context.Context //nolint:containedctx // the watches' lifetime, ended by Stop
	cancel context.CancelFunc

	mu    sync.Mutex
	nodes map[string]*nodeWatch
	wg    sync.WaitGroup
}

// nodeWatch is the watch of one endpoint and what it last saw.
type nodeWatch struct {
	cancel context.CancelFunc

	mu sync.Mutex
	// conn is the connection of the established watch (nil when none).
	conn *grpc.ClientConn
	// since is when the current watch's connection was made: its age.
	since time.Time
	// The node's resources as the watch last saw them; nil when absent.
	nodeIP   *k8s.NodeIPSpec
	nodename *k8s.NodenameSpec
	hostname *network.HostnameStatusSpec
	// id is the identity of the three, kept ready for reads.
	id Identity
}

// The three resources a watch follows.
var identityPointers = []resource.Pointer{
	k8s.NewNodeIP(k8s.NamespaceName, k8s.KubeletID).Metadata(),
	k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID).Metadata(),
	network.NewHostnameStatus(network.NamespaceName, network.HostnameID).Metadata(),
}

// CheckWatchMaxAge says whether a watch's freshness bound can be used by a
// reader of that certificate lifetime and read timeout (each zero for its
// default), so that a wrong flag is refused when the manager starts rather
// than by every cluster's reader later.
func CheckWatchMaxAge(maxAge, lifetime, timeout time.Duration) error {
	if lifetime == 0 {
		lifetime = DefaultCertificateLifetime
	}
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	_, err := watchMaxAge(maxAge, lifetime, timeout)
	return err
}

// watchMaxAge is the freshness bound a reader of that lifetime and timeout
// uses for maxAge (zero: DefaultWatchMaxAge).
func watchMaxAge(maxAge, lifetime, timeout time.Duration) (time.Duration, error) {
	switch {
	case maxAge == 0:
		maxAge = DefaultWatchMaxAge
	case maxAge < 0:
		return 0, fmt.Errorf("talosnode: watch max age %s is negative", maxAge)
	}
	// A watch starts its age when it connects, and may take a timeout to
	// be established: it ends before the credential it was made with is
	// renewed.
	maxAge = min(maxAge, renewBefore(lifetime, timeout)-timeout)
	if maxAge <= timeout {
		return 0, fmt.Errorf("talosnode: watch max age %s is not longer than the read timeout %s (or the credential lives too short for a watch)", maxAge, timeout)
	}
	return maxAge, nil
}

// Watches makes the reader's set of watches, empty until Keep names nodes.
func (r *Reader) Watches(opts WatchOptions) (*Watches, error) {
	maxAge, err := watchMaxAge(opts.MaxAge, r.lifetime, r.timeout)
	if err != nil {
		return nil, err
	}

	dials := opts.Dials
	switch {
	case dials == 0:
		dials = DefaultWatchDials
	case dials < 0:
		return nil, fmt.Errorf("talosnode: watch dials %d is negative", dials)
	}

	ctx, cancel := context.WithCancel(context.Background())

	ended := opts.Ended
	if ended == nil {
		ended = func(WatchEnd) {}
	}

	return &Watches{
		ended:   ended,
		reader:  r,
		maxAge:  maxAge,
		dials:   make(chan struct{}, dials),
		backoff: wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 30 * time.Second},
		ctx:     ctx,
		cancel:  cancel,
		nodes:   map[string]*nodeWatch{},
	}, nil
}

// MaxAge is the freshness bound in effect.
func (w *Watches) MaxAge() time.Duration {
	return w.maxAge
}

// Keep watches exactly these endpoints: it starts the watches of new ones and
// ends those of endpoints not named. After Stop it does nothing.
func (w *Watches) Keep(endpoints []string) {
	w.mu.Lock()
	defer w.mu.Unlock()

	if w.ctx.Err() != nil {
		return
	}

	keep := make(map[string]struct{}, len(endpoints))
	for _, endpoint := range endpoints {
		keep[endpoint] = struct{}{}
	}

	for endpoint, n := range w.nodes {
		if _, ok := keep[endpoint]; !ok {
			n.cancel()
			delete(w.nodes, endpoint)
		}
	}

	for _, endpoint := range endpoints {
		if _, ok := w.nodes[endpoint]; ok || endpoint == "" {
			continue
		}

		ctx, cancel := context.WithCancel(w.ctx)
		n := &nodeWatch{cancel: cancel}
		w.nodes[endpoint] = n

		w.wg.Go(func() { w.run(ctx, endpoint, n) })
	}
}

// Stop ends every watch and waits until their connections are closed.
func (w *Watches) Stop() {
	w.mu.Lock()
	w.cancel()
	w.nodes = map[string]*nodeWatch{}
	w.mu.Unlock()

	w.wg.Wait()
}

// Count is how many nodes are watched, and of those how many have an
// established, synced watch younger than the bound.
func (w *Watches) Count() (watched, live int) {
	w.mu.Lock()
	defer w.mu.Unlock()

	now := w.reader.clock()

	for _, n := range w.nodes {
		if _, ok := n.identity(now, w.maxAge); ok {
			live++
		}
	}

	return len(w.nodes), live
}

// Live reports whether the endpoint has an established, synced watch younger
// than the bound.
func (w *Watches) Live(endpoint string) bool {
	w.mu.Lock()
	n := w.nodes[endpoint]
	w.mu.Unlock()

	if n == nil {
		return false
	}

	_, ok := n.identity(w.reader.clock(), w.maxAge)

	return ok
}

// Read returns the node's identity from its watch when that is established,
// synced and younger than the bound, and otherwise reads the node directly
// (Reader.Read, with its errors).
func (w *Watches) Read(ctx context.Context, endpoint string) (Identity, Source, error) {
	w.mu.Lock()
	n := w.nodes[endpoint]
	w.mu.Unlock()

	if n != nil {
		if id, ok := n.identity(w.reader.clock(), w.maxAge); ok {
			return id, FromWatch, nil
		}
	}

	id, err := w.reader.Read(ctx, endpoint)

	return id, FromRead, err
}

// run keeps the node's watch until ctx ends: each watch lasts until an error
// (then a backoff) or until the bound (then a new one at once).
func (w *Watches) run(ctx context.Context, endpoint string, n *nodeWatch) {
	backoff := w.backoff

	for ctx.Err() == nil {
		// Only a watch that lived to its age resets the backoff: a node
		// that ends each watch soon after it is synced (a flood of events,
		// a dropped connection) does not get a handshake a second.
		err := w.watchOnce(ctx, endpoint, n)
		n.drop()

		if ctx.Err() != nil {
			return // ended by Keep or Stop
		}

		w.ended(watchEnd(err))

		if err == nil {
			backoff = w.backoff

			continue
		}

		select {
		case <-ctx.Done():
		case <-time.After(backoff.Step()):
		}
	}
}

// watchOnce establishes one watch of the node and follows it until it fails,
// ctx ends, or it reaches its age (then it returns nil, if it had synced).
func (w *Watches) watchOnce(ctx context.Context, endpoint string, n *nodeWatch) error {
	select {
	case w.dials <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}

	dialing := true
	release := func() {
		if dialing {
			dialing = false
			<-w.dials
		}
	}
	defer release()

	// The events are few and small: no 32 KiB buffers per connection held
	// for as long as the watch lives. The connection's age, and so the
	// identity's, starts now.
	connected := w.reader.clock()
	age := time.NewTimer(jittered(w.maxAge))
	defer age.Stop()

	// Each stream's messages are counted as they arrive, events or none:
	// a node that sends empty answers without end is refused as one that
	// sends too many events (review 159).
	c, err := w.reader.connect(ctx, endpoint, grpc.WithReadBufferSize(0), grpc.WithWriteBufferSize(0), grpc.WithStreamInterceptor(limitMessages))
	if err != nil {
		return err
	}

	defer c.Close() //nolint:errcheck // nothing was written; a close error changes nothing

	watchCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Establishing is bounded like a read: a node that accepts and never
	// answers holds a dial slot no longer than that.
	setup := time.AfterFunc(w.reader.timeout, func() {
		cancel(fmt.Errorf("talos node %s: %w: not established within %s", endpoint, errNotSynced, w.reader.timeout))
	})
	defer setup.Stop()

	// Without the adapter's own retries: a broken stream must end this
	// watch at once, so reads go to the node until a new one is synced.
	st := state.WrapCore(cosiclient.NewAdapter(cosiv1alpha1.NewStateClient(c.Conn()), cosiclient.WithDisableWatchRetry()))
	updates := make(chan state.Event, len(identityPointers))

	// The three streams are opened beside the loop below, which reads
	// their events (and counts them) from the first: read only once all
	// three were open, a node holding back the last one's answer had the
	// first two's adapters blocked on updates, and gRPC buffered what it
	// sent them meanwhile, up to Talos's client's window of 2 MiB a
	// stream (review 159).
	subscribed := make(chan error, 1)
	go func() {
		for _, ptr := range identityPointers {
			if err := st.Watch(watchCtx, ptr, updates); err != nil {
				subscribed <- fmt.Errorf("talos node %s: watch %s %s/%s: %w", endpoint, ptr.Type(), ptr.Namespace(), ptr.ID(), err)

				return
			}
		}
		subscribed <- nil
	}()

	// A node's identity changes seldom; a node that sends more than this
	// is refused its watch (and read at decision time until a new one).
	events := flowcontrol.NewTokenBucketRateLimiter(eventsPerSecond, eventsBurst)
	// Synced once every stream is open and every resource was seen: a node
	// may send one resource on another's stream, and a watch believed
	// before its last stream opened would leave that stream's set-up
	// unbounded (review 160).
	open, synced := false, false
	trySync := func() {
		if !synced && open && n.complete() {
			synced = true

			setup.Stop()
			release()
			n.establish(c.Conn(), connected)
		}
	}

	for {
		select {
		case err := <-subscribed:
			subscribed = nil
			if err == nil {
				open = true
				trySync()

				continue
			}

			if cause := context.Cause(watchCtx); cause != nil && ctx.Err() == nil {
				return cause
			}

			return err
		case <-watchCtx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}

			return context.Cause(watchCtx)
		case <-age.C:
			if !synced {
				return fmt.Errorf("talos node %s: %w within its age %s", endpoint, errNotSynced, w.maxAge)
			}

			return nil
		case ev := <-updates:
			if ev.Type == state.Errored {
				// A stream ended by the set-up's bound says that bound,
				// not the cancellation it saw (review 262 F3).
				if cause := context.Cause(watchCtx); cause != nil && ctx.Err() == nil {
					return cause
				}

				return fmt.Errorf("talos node %s: watch: %w", endpoint, ev.Error)
			}

			if !events.TryAccept() {
				return fmt.Errorf("talos node %s: %w: more than %d events at once, %d a second after", endpoint, errRefused, eventsBurst, eventsPerSecond)
			}

			if err := n.apply(ev); err != nil {
				return fmt.Errorf("talos node %s: %w: %w", endpoint, errRefused, err)
			}

			trySync()
		}
	}
}

// The events a watch takes: the three initial states and a few changes at
// once, then one a second.
const (
	eventsBurst     = 30
	eventsPerSecond = 1
)

// limitMessages is a watch connection's stream interceptor: each stream
// takes messages as a watch takes events (eventsBurst, then eventsPerSecond),
// and fails once a node sends more. The event limit alone does not see a
// message that holds no event, and decoding such messages without end costs
// the manager's CPU for as long as the watch lives.
func limitMessages(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}

	return &limitedStream{ClientStream: s, messages: flowcontrol.NewTokenBucketRateLimiter(eventsPerSecond, eventsBurst)}, nil
}

type limitedStream struct {
	grpc.ClientStream
	messages flowcontrol.RateLimiter
}

func (s *limitedStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}

	if !s.messages.TryAccept() {
		return status.Errorf(codes.ResourceExhausted, "more than %d messages at once on the stream, %d a second after", eventsBurst, eventsPerSecond)
	}

	return nil
}

// jittered is d less up to a tenth, so that watches made at one moment (a
// start) are not all made anew at one moment.
func jittered(d time.Duration) time.Duration {
	return wait.Jitter(d*9/10, 1.0/9)
}

// apply takes an event of the watch in. An event about anything but the
// three resources (a node may send what it likes on its streams) is ignored;
// one beyond what an identity may hold is an error, which ends the watch.
func (n *nodeWatch) apply(ev state.Event) error {
	if ev.Resource == nil || !watched(ev.Resource.Metadata()) {
		return nil
	}

	// Only a resource's arrival, change or end is news of it: another
	// event that carries one (Bootstrapped, Noop: COSI sends them without)
	// is not taken for its arrival (review 261 F5).
	switch ev.Type {
	case state.Created, state.Updated, state.Destroyed:
	default:
		return nil
	}

	n.mu.Lock()
	defer n.mu.Unlock()

	gone := ev.Type == state.Destroyed

	var err error

	switch r := ev.Resource.(type) {
	case *k8s.NodeIP:
		n.nodeIP, err = kept(gone, r.TypedSpec(), checkNodeIP)
	case *k8s.Nodename:
		n.nodename, err = kept(gone, r.TypedSpec(), checkNodename)
	case *network.HostnameStatus:
		n.hostname, err = kept(gone, r.TypedSpec(), checkHostname)
	default:
		return nil
	}

	if err != nil {
		return err
	}

	if n.nodeIP != nil && n.nodename != nil && n.hostname != nil {
		n.id = Identity{
			Nodename:  n.nodename.Nodename,
			Hostname:  n.hostname.Hostname,
			Addresses: canonicalAddresses(n.nodeIP.Addresses),
		}
	}

	return nil
}

// kept is what a watch keeps of a resource's spec: nothing once the resource
// is gone, or one beyond its check; else a copy, since the spec's pointer
// keeps the whole resource, its metadata (labels, finalizers) included, for
// the watch's life.
func kept[T any](gone bool, spec *T, check func(*T) error) (*T, error) {
	if gone {
		return nil, nil
	}

	if err := check(spec); err != nil {
		return nil, err
	}

	c := *spec

	return &c, nil
}

func watched(md *resource.Metadata) bool {
	return slices.ContainsFunc(identityPointers, func(p resource.Pointer) bool {
		return md.Namespace() == p.Namespace() && md.Type() == p.Type() && md.ID() == p.ID()
	})
}

func (n *nodeWatch) complete() bool {
	n.mu.Lock()
	defer n.mu.Unlock()

	return n.nodeIP != nil && n.nodename != nil && n.hostname != nil
}

func (n *nodeWatch) establish(conn *grpc.ClientConn, at time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.conn, n.since = conn, at
}

// drop forgets the ended watch and all it saw.
func (n *nodeWatch) drop() {
	n.mu.Lock()
	defer n.mu.Unlock()

	n.conn, n.nodeIP, n.nodename, n.hostname, n.id = nil, nil, nil, nil, Identity{}
}

// identity is the watched identity, if the watch is established, its
// connection up, all three resources present and the watch younger than
// maxAge at now (its age counted from its connection).
func (n *nodeWatch) identity(now time.Time, maxAge time.Duration) (Identity, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()

	switch {
	case n.conn == nil, n.nodeIP == nil, n.nodename == nil, n.hostname == nil:
		return Identity{}, false
	case now.Sub(n.since) >= maxAge || now.Before(n.since):
		return Identity{}, false
	case n.conn.GetState() != connectivity.Ready:
		return Identity{}, false
	}

	return Identity{Nodename: n.id.Nodename, Hostname: n.id.Hostname, Addresses: slices.Clone(n.id.Addresses)}, true
}
