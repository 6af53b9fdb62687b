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

// tenantGate keeps the API server of a TalosCluster with a kubeconfigRef,
// which its tenant controls, from holding the decision workers that every
// cluster shares. Each request to such a server is bounded
// (TenantRequestTimeout), but the tenant names its own requesters, so
// without a gate a server that stalls would hold a worker that long for
// each of them, again and again. The gate
//   - lets at most slots turns of the tenant (the clusters with a
//     kubeconfigRef in one namespace) run at once, and the pool's slots
//     bound every tenant's together; a requester that finds them taken is
//     parked (in the pool, oldest first), and handed back (queued again)
//     when a turn ends;
//   - is the cluster's breaker: once a request to its server stalled (it
//     timed out, or took longer than stallAfter, answer included), no turn
//     of the cluster runs until a backoff has passed (5 s, doubling with
//     each stalled try, at most 5 min; forgiven after a clean try, or twice
//     that without a stall). A requester turned away meanwhile comes back
//     when it ends; then one turn tries, alone, and asks the server
//     something cheap first; only a try the server answered without a stall
//     closes the breaker, and the cluster's parked requesters are handed
//     back as slots allow.
//
// The requesters a tenant's gates hold (parked, or turned away until a
// backoff ends, each a name its server chose) are bounded as its cache is
// (TenantMaxCSRs and TenantMaxCSRBytes): a server that stalls while its
// watch streams requests under ever new names would otherwise have the
// manager keep each name until the backoff ends, without bound. A requester
// of whom the cache holds no request is not held at all (the worker looks
// first), and runs only as the breaker's try; past the bound one is not
// held either: the cluster's resync, a minute at most, queues it again if it
// still has a request.
//
// Slots are the tenant's, so that a second TalosCluster does not bring
// fresh ones; the breaker is the cluster's, so that one broken server holds
// back its own requesters and not its neighbours'. The gate lasts across
// kubeconfig rewrites (a new watch keeps the breaker), and is forgotten with
// the cluster (deleted, or its shard gone), its parked requesters with it.
// The nil gate lets everything through (the local API server).
type tenantGate struct {
	pool       *remotePool
	slots      *tenantSlots
	clock      clock.PassiveClock
	stallAfter time.Duration

	// The fields below are guarded by pool.mu.
	// open: a request stalled; until is when the next try may begin, and
	// trips counts the stalled tries that set it. closedAt is when a try
	// last closed it: stalls of requests sent before are old news.
	open      bool
	trips     int
	until     time.Time
	lastStall time.Time
	closedAt  time.Time
	// probing: a try runs since probeStart; answered and stalled are what
	// the server did meanwhile, to the requests sent since.
	probing, answered, stalled bool
	probeStart                 time.Time
	// gone: the cluster was forgotten; a worker that still found its old
	// target is not parked under it, but comes back to the new one.
	gone bool
	// turnedAway are the requesters sent off until the backoff ends
	// (counted in slots.held until they come back, or the next backoff
	// or a close, when they have).
	turnedAway map[requester]struct{}
	// dropped: a requester was not held since the last notice, given at
	// noticed (dropNotice).
	dropped bool
	noticed time.Time
}

// tenantSlots are the turns one tenant may run at once (free of max);
// gates counts the clusters that share them. Guarded by pool.mu.
type tenantSlots struct {
	namespace string
	free, max int
	gates     int
	// held and heldBytes are the requesters the tenant's gates hold
	// (parked or turned away), and about the memory their keys take.
	held      int
	heldBytes int64
}

// remotePool is what every tenant's turns share: the slots of all of them
// together, each tenant's own, and the requesters parked, oldest first.
type remotePool struct {
	mu       sync.Mutex
	free     int
	tenants  map[string]*tenantSlots
	parked   []parkedKey
	isParked map[requester]bool
	// maxHeld and maxHeldBytes bound each tenant's held requesters
	// (tenantSlots.held); zero: DefaultTenantMaxCSRs and
	// DefaultTenantMaxCSRBytes.
	maxHeld      int
	maxHeldBytes int64
}

type parkedKey struct {
	gate *tenantGate
	key  requester
}

func newRemotePool(slots int) *remotePool {
	return &remotePool{free: slots, tenants: map[string]*tenantSlots{}, isParked: map[requester]bool{}}
}

// newGate is a new breaker for a cluster of the tenant in namespace, which
// shares the tenant's slots (slots of them, if it is the tenant's first).
func (p *remotePool) newGate(clk clock.PassiveClock, namespace string, slots int, stallAfter time.Duration) *tenantGate {
	if stallAfter <= 0 {
		stallAfter = DefaultTenantRequestTimeout / 3
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.tenants[namespace]
	if !ok {
		s = &tenantSlots{namespace: namespace, free: slots, max: slots}
		p.tenants[namespace] = s
	}
	s.gates++
	return &tenantGate{pool: p, slots: s, clock: clk, stallAfter: stallAfter}
}

// forget drops a gate whose cluster this replica no longer judges: its
// parked requesters, and its tenant's slots once no cluster shares them and
// no turn holds one (a turn of a forgotten cluster still counts against
// them, so that forgetting a cluster and starting it again brings the
// tenant no fresh slots).
func (p *remotePool) forget(g *tenantGate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := make([]parkedKey, 0, len(p.parked))
	for _, pk := range p.parked {
		if pk.gate == g {
			delete(p.isParked, pk.key)
			p.release(g.slots, pk.key)
			continue
		}
		kept = append(kept, pk)
	}
	p.parked = kept
	g.comeBack()
	g.gone = true
	g.slots.gates--
	p.dropIdle(g.slots)
}

// dropIdle forgets a tenant's slots once no cluster shares them and no turn
// holds one. Called with mu held.
func (p *remotePool) dropIdle(s *tenantSlots) {
	if s.gates <= 0 && s.free >= s.max && p.tenants[s.namespace] == s {
		delete(p.tenants, s.namespace)
	}
}

// heldSize is about what holding key costs: its names, and the key's and
// the map entry's own words.
func heldSize(key requester) int64 {
	return int64(len(key.username)+len(key.cluster.Namespace)+len(key.cluster.Name)) + 64
}

// hold counts key among the tenant's held requesters, unless that would
// take them past the bound. Called with mu held.
func (p *remotePool) hold(s *tenantSlots, key requester) bool {
	maxHeld, maxBytes := p.heldBounds()
	size := heldSize(key)
	if s.held >= maxHeld || s.heldBytes+size > maxBytes {
		return false
	}
	s.held++
	s.heldBytes += size
	return true
}

// heldBounds are the bounds of each tenant's held requesters in effect.
func (p *remotePool) heldBounds() (maxHeld int, maxBytes int64) {
	maxHeld, maxBytes = p.maxHeld, p.maxHeldBytes
	if maxHeld <= 0 {
		maxHeld = DefaultTenantMaxCSRs
	}
	if maxBytes <= 0 {
		maxBytes = DefaultTenantMaxCSRBytes
	}
	return maxHeld, maxBytes
}

// release counts key no longer held. Called with mu held.
func (p *remotePool) release(s *tenantSlots, key requester) {
	s.held--
	s.heldBytes -= heldSize(key)
}

// comeBack forgets the requesters turned away: their backoff is over.
// Called with pool.mu held.
func (g *tenantGate) comeBack() {
	for key := range g.turnedAway {
		g.pool.release(g.slots, key)
	}
	g.turnedAway = nil
}

// dropNotice reports, at most once a minute while they go on, that the
// gate did not hold requesters: its tenant holds as many as it may (the
// bounds are said with it).
func (g *tenantGate) dropNotice() (notice bool, maxHeld int, maxBytes int64) {
	if g == nil {
		return false, 0, 0
	}
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	now := g.clock.Now()
	if !g.dropped || !g.noticed.IsZero() && now.Sub(g.noticed) < time.Minute {
		return false, 0, 0
	}
	g.dropped, g.noticed = false, now
	maxHeld, maxBytes = g.pool.heldBounds()
	return true, maxHeld, maxBytes
}

// enter says whether key's turn runs now, and whether it is the try of a
// stalled server (then the turn asks the server something cheap first).
// When it does not run, wait is when it comes back (the cluster's backoff
// runs), or zero: it is parked, and handed back by a later leave, or not
// held at all. has says whether the requester has a request in the cache:
// one that has none is never held, and runs only as the try, which the
// requesters parked behind it are owed.
func (g *tenantGate) enter(key requester, has bool) (ok, probe bool, wait time.Duration) {
	if g == nil {
		return true, false, 0
	}
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	now := g.clock.Now()
	if g.gone {
		return false, false, minBackoff
	}
	backingOff := g.open && now.Before(g.until)
	if _, ok := g.turnedAway[key]; ok && !backingOff {
		// Back once the backoff ended: held again only if it waits
		// again (parked), not twice meanwhile.
		delete(g.turnedAway, key)
		g.pool.release(g.slots, key)
	}
	free := g.slots.free > 0 && g.pool.free > 0
	switch {
	case backingOff && !has:
		return false, false, 0
	case backingOff:
		// Every requester turned away comes back when the backoff
		// ends: no single one is trusted to wake the others.
		if _, ok := g.turnedAway[key]; !ok {
			if !g.pool.hold(g.slots, key) {
				g.dropped = true
				return false, false, 0
			}
			if g.turnedAway == nil {
				g.turnedAway = map[requester]struct{}{}
			}
			g.turnedAway[key] = struct{}{}
		}
		return false, false, g.until.Sub(now)
	case g.open && !g.probing && free:
		g.take()
		g.probing, g.answered, g.stalled, g.probeStart = true, false, false, now
		return true, true, 0
	case !has:
		return false, false, 0
	case !g.open && free:
		g.take()
		return true, false, 0
	}
	if !g.pool.isParked[key] {
		if !g.pool.hold(g.slots, key) {
			g.dropped = true
			return false, false, 0
		}
		g.pool.isParked[key] = true
		g.pool.parked = append(g.pool.parked, parkedKey{gate: g, key: key})
	}
	return false, false, 0
}

func (g *tenantGate) take() {
	g.slots.free--
	g.pool.free--
}

// leave ends a turn enter let run; aborted: it ended for a reason of this
// side (the kubeconfig changed, the shard went), before the server was
// asked anything, and says nothing about the server. It returns the
// requesters to queue again (of any tenant: the slot given back is the
// pool's too); and, while the cluster's backoff runs, when this requester
// comes back.
func (g *tenantGate) leave(probe, aborted bool) (handBack []requester, wait time.Duration) {
	if g == nil {
		return nil, 0
	}
	g.pool.mu.Lock()
	defer g.pool.mu.Unlock()
	g.slots.free++
	g.pool.free++
	g.pool.dropIdle(g.slots)
	now := g.clock.Now()
	if probe {
		g.probing = false
		switch {
		case g.stalled:
			// observe armed the next backoff.
		case g.answered:
			g.open = false
			g.trips = 0
			g.closedAt = now
			g.comeBack()
		case !aborted:
			// Not answered, not stalled (refused): tried again later.
			g.arm(now)
		}
	}
	if g.open && now.Before(g.until) {
		wait = g.until.Sub(now)
	}
	return g.pool.handBack(now), wait
}

// handBack unparks, oldest first, the requesters whose cluster can run a
// turn now, as many as the pool's and their tenant's slots allow; of a
// cluster whose backoff is over, one, to try. Called with mu held.
func (p *remotePool) handBack(now time.Time) []requester {
	var out []requester
	taken := map[*tenantSlots]int{}
	trying := map[*tenantGate]bool{}
	kept := p.parked[:0]
	for _, pk := range p.parked {
		g := pk.gate
		room := len(out) < p.free && g.slots.free-taken[g.slots] > 0
		switch {
		case room && !g.open,
			room && !now.Before(g.until) && !g.probing && !trying[g]:
			out = append(out, pk.key)
			taken[g.slots]++
			trying[g] = g.open
			delete(p.isParked, pk.key)
			p.release(g.slots, pk.key)
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

// observe notes the outcome of one request to the cluster's server: err
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
	sent := now.Add(-took)
	switch {
	case g.probing && sent.Before(g.probeStart):
		// A request from before the try says nothing of it.
	case stalled && !g.open && sent.Before(g.closedAt):
		// Nor, once a try closed the breaker, a request from before.
	case stalled:
		// A stall opens the breaker, or fails the try; the stalls of
		// turns begun before it opened count once.
		if !g.open || g.probing && !g.stalled {
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
	// Those turned away came back when the last backoff ended (a backoff
	// begins only after the last).
	g.comeBack()
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
