package kubeletserving

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// tenantGate keeps the API servers of one tenant (the TalosClusters with a
// kubeconfigRef in one namespace) from holding the decision workers, which
// every cluster shares. Each request to such a server is bounded
// (TenantRequestTimeout), but the tenant names its own requesters, so
// without a gate a server that stalls would hold a worker that long for
// each of them, again and again. The gate
//   - lets at most slots turns of the tenant run at once, and the pool's
//     slots bound every tenant's together; a requester that finds them
//     taken is parked (in the pool, oldest first), and handed back (queued
//     again) when a turn ends;
//   - is a breaker: once a request stalled (it timed out, or took longer
//     than stallAfter, answer included), no turn runs until a backoff has
//     passed (5 s, doubling with each stalled try, at most 5 min; forgiven
//     after a clean try, or twice that without a stall). One requester
//     turned away waits for it (the waker), the others are parked; then one
//     turn tries, alone, and asks the server something cheap first; only a
//     try the server answered without a stall closes the breaker, and the
//     parked requesters are handed back as slots allow.
//
// It is kept per namespace, not per watch, so that a rewritten kubeconfig
// Secret or a second TalosCluster does not get fresh slots or a closed
// breaker. The nil gate lets everything through (the local API server).
type tenantGate struct {
	pool       *remotePool
	clock      clock.PassiveClock
	stallAfter time.Duration

	// The fields below are guarded by pool.mu.
	free int
	// open: a request stalled; until is when the next try may begin, and
	// trips counts the stalled tries that set it.
	open      bool
	trips     int
	until     time.Time
	lastStall time.Time
	// probing: a try runs; answered and stalled are what the server did
	// meanwhile.
	probing, answered, stalled bool
	// wakerDue is when the requester turned away while the breaker is
	// open comes back to try; zero: none does.
	wakerDue time.Time
}

// remotePool is what every tenant's turns share: the slots of all of them
// together, and the requesters parked, oldest first.
type remotePool struct {
	mu       sync.Mutex
	free     int
	parked   []parkedKey
	isParked map[requester]bool
}

type parkedKey struct {
	gate *tenantGate
	key  requester
}

func newRemotePool(slots int) *remotePool {
	return &remotePool{free: slots, isParked: map[requester]bool{}}
}

func (p *remotePool) newGate(clk clock.PassiveClock, slots int, stallAfter time.Duration) *tenantGate {
	if stallAfter <= 0 {
		stallAfter = DefaultTenantRequestTimeout / 3
	}
	return &tenantGate{pool: p, clock: clk, stallAfter: stallAfter, free: slots}
}

// enter says whether key's turn runs now, and whether it is the try of a
// stalled server (then the turn asks the server something cheap first).
// When it does not run, wait is when it comes back (it is the waker), or
// zero: it is parked, and handed back by a later leave.
func (g *tenantGate) enter(key requester) (ok, probe bool, wait time.Duration) {
	if g == nil {
		return true, false, 0
	}
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	now := g.clock.Now()
	free := g.free > 0 && g.pool.free > 0
	switch {
	case g.open && now.Before(g.until):
		if g.wakerDue.IsZero() || now.After(g.wakerDue.Add(minBackoff)) {
			// No waker, or it was lost on the way (its cluster gone).
			g.wakerDue = g.until
			return false, false, g.until.Sub(now)
		}
	case g.open && !g.probing && free:
		g.free--
		g.pool.free--
		g.probing, g.answered, g.stalled = true, false, false
		g.wakerDue = time.Time{}
		return true, true, 0
	case !g.open && free:
		g.free--
		g.pool.free--
		return true, false, 0
	}
	if !g.pool.isParked[key] {
		g.pool.isParked[key] = true
		g.pool.parked = append(g.pool.parked, parkedKey{gate: g, key: key})
	}
	return false, false, 0
}

// leave ends a turn enter let run. It returns the requesters to queue
// again (of any tenant: the slot given back is the pool's too); and after
// a try the server did not pass, when its requester comes back (it is the
// waker).
func (g *tenantGate) leave(probe bool) (handBack []requester, wait time.Duration) {
	if g == nil {
		return nil, 0
	}
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	g.free++
	g.pool.free++
	now := g.clock.Now()
	if probe {
		g.probing = false
		switch {
		case g.answered && !g.stalled:
			g.open = false
			g.trips = 0
		case !g.stalled:
			// Not answered, not stalled (refused): tried again later.
			g.arm(now)
		}
		if g.open {
			g.wakerDue = g.until
			wait = g.until.Sub(now)
		}
	}
	return g.pool.handBack(now), wait
}

// handBack unparks, oldest first, the requesters whose tenant can run a
// turn now, as many as the pool's slots; and of a tenant whose backoff is
// over and whose waker was parked, one, to try. Called with mu held.
func (p *remotePool) handBack(now time.Time) []requester {
	var out []requester
	taken := map[*tenantGate]int{}
	kept := p.parked[:0]
	for _, pk := range p.parked {
		g := pk.gate
		room := len(out) < p.free && g.free-taken[g] > 0
		switch {
		case room && !g.open,
			room && !now.Before(g.until) && !g.probing && taken[g] == 0:
			out = append(out, pk.key)
			taken[g]++
			delete(p.isParked, pk.key)
		default:
			kept = append(kept, pk)
		}
	}
	clear(p.parked[len(kept):])
	p.parked = kept
	return out
}

// halted reports whether the rest of a turn waits: the breaker opened (for
// a try: the server stalled in it).
func (g *tenantGate) halted(probe bool) bool {
	if g == nil {
		return false
	}
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	return g.open && (!probe || g.stalled)
}

// observe notes the outcome of one request to a server of the tenant: err
// (the transport's or the body's), the request's context after it, and how
// long it took, answer included.
func (g *tenantGate) observe(err, ctxErr error, took time.Duration) {
	if g == nil {
		return
	}
	var netErr net.Error
	stalled := took >= g.stallAfter || errors.Is(err, context.DeadlineExceeded) || errors.Is(ctxErr, context.DeadlineExceeded) ||
		(errors.As(err, &netErr) && netErr.Timeout())
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	now := g.clock.Now()
	switch {
	case stalled:
		// A stall opens the breaker, or fails the try; the stalls of
		// turns begun before it opened count once.
		if !g.open || (g.probing && !g.stalled) {
			if !g.lastStall.IsZero() && now.Sub(g.lastStall) > 2*maxBackoff {
				g.trips = 0
			}
			g.arm(now)
		}
		if g.probing {
			g.stalled = true
		}
		g.lastStall = now
	case err == nil && g.probing:
		g.answered = true
	}
}

// arm opens the breaker for the next backoff.
func (g *tenantGate) arm(now time.Time) {
	g.open = true
	g.until = now.Add(backoff.After(g.trips))
	g.trips++
}

// RoundTripper observes every request sent through rt, and takes the
// Retry-After off the answers: client-go would otherwise wait and send again
// within one bounded request, for as long as the server asks.
func (g *tenantGate) RoundTripper(rt http.RoundTripper) http.RoundTripper {
	return observed{rt: rt, g: g}
}

type observed struct {
	rt http.RoundTripper
	g  *tenantGate
}

func (o observed) RoundTrip(req *http.Request) (*http.Response, error) {
	start := o.g.clock.Now()
	resp, err := o.rt.RoundTrip(req)
	if err != nil {
		o.g.observe(err, req.Context().Err(), o.g.clock.Since(start))
		return nil, err
	}
	resp.Header.Del("Retry-After")
	resp.Body = &observedBody{ReadCloser: resp.Body, done: func(readErr error) {
		o.g.observe(readErr, req.Context().Err(), o.g.clock.Since(start))
	}}
	return resp, nil
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (o observed) WrappedRoundTripper() http.RoundTripper { return o.rt }

// observedBody tells, once closed, how reading it ended.
type observedBody struct {
	io.ReadCloser
	done func(error)
	once sync.Once
	err  error
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.err = err
	}
	return n, err
}

func (b *observedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.done(b.err) })
	return err
}
