package kubeletserving

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ichor-dev/ichor-policy/engine"
)

func tenantKey(n int) requester { return requester{username: fmt.Sprintf("system:node:%d", n)} }

// Review 7 H1, reviews 8 and 9: once a request to a cluster's server
// stalled, none of its requesters runs until a backoff has passed, and each
// turned away comes back when it ends; then one tries, alone, the others
// are parked; a try that stalls, or is refused, doubles the backoff (the
// stalls of turns begun before count once); a try cut short on this side
// doubles nothing; only a try the server answered cleanly lets the parked
// ones back in, and a stall of a request sent before that try is old news;
// a long quiet forgives the past.
func TestAStallingTenantServerHoldsItsRequestersBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	g := newRemotePool(32).newGate(clk, "ns", 2, 10*time.Second)
	timeout := fmt.Errorf("put approval: %w", context.DeadlineExceeded)
	// observe, as the transport does: a request sent took ago, ending now.
	observe := func(err, ctxErr error, took time.Duration) {
		clk.Step(took)
		g.observe(err, ctxErr, took)
	}

	ok, probe, _ := g.enter(tenantKey(1), true)
	require.True(t, ok && !probe, "closed: a requester runs, and is no try")
	observe(errors.New("connection refused"), nil, time.Millisecond)
	observe(context.Canceled, context.Canceled, time.Millisecond)
	observe(nil, nil, time.Second)
	require.False(t, g.halted(false), "a refusal, a cancellation or a quick answer is no stall")

	observe(timeout, nil, 30*time.Second)
	require.True(t, g.halted(false), "a timeout opens the breaker")
	g.observe(nil, context.DeadlineExceeded, 30*time.Second) // another turn's, begun before
	for _, n := range []int{2, 3, 3} {
		ok, _, wait := g.enter(tenantKey(n), true)
		require.False(t, ok)
		assert.Equal(t, 5*time.Second, wait, "every requester turned away comes back when the backoff ends (the stalls of turns begun before count once)")
	}
	handBack, wait := g.leave(false, false)
	assert.Empty(t, handBack, "a turn ending while the breaker is open hands nobody back")
	assert.Equal(t, 5*time.Second, wait, "the stalled turn's requester comes back when the backoff ends")

	// Each try: it runs alone, the server stalls (a slow answer) or
	// refuses, and the backoff doubles.
	for _, c := range []struct {
		backoff time.Duration
		outcome func()
	}{
		{5 * time.Second, func() { observe(nil, nil, time.Millisecond); observe(nil, nil, 11*time.Second) }},
		{10 * time.Second, func() { observe(errors.New("connection reset"), nil, time.Millisecond) }},
	} {
		clk.Step(c.backoff)
		ok, probe, _ = g.enter(tenantKey(2), true)
		require.True(t, ok && probe, "the backoff over, a requester tries")
		for _, n := range []int{3, 4} {
			ok, _, wait = g.enter(tenantKey(n), true)
			require.False(t, ok, "a second requester ran during the try")
			assert.Zero(t, wait, "parked")
		}
		c.outcome()
		handBack, wait = g.leave(true, false)
		assert.Empty(t, handBack)
		assert.Equal(t, 2*c.backoff, wait, "the try failed: its requester waits the doubled backoff")
		require.True(t, g.halted(false))
	}

	// A try this side cuts short (the kubeconfig changed) says nothing of
	// the server: no longer backoff, and another requester tries at once.
	clk.Step(20 * time.Second)
	ok, probe, _ = g.enter(tenantKey(2), true)
	require.True(t, ok && probe)
	handBack, wait = g.leave(true, true)
	assert.Zero(t, wait, "a try cut short here was held against the server")
	assert.Equal(t, []requester{tenantKey(3)}, handBack, "after a try cut short, the oldest parked tries next")

	ok, probe, _ = g.enter(tenantKey(3), true)
	require.True(t, ok && probe)
	g.observe(nil, nil, time.Minute) // sent before the try: says nothing of it
	require.False(t, g.halted(true), "a request sent before the try failed it")
	observe(nil, nil, time.Millisecond)
	require.False(t, g.halted(true), "a clean try goes on")
	handBack, wait = g.leave(true, false)
	assert.Zero(t, wait)
	assert.Equal(t, []requester{tenantKey(4)}, handBack, "closed: the parked are handed back, oldest first, as slots allow")
	g.observe(timeout, nil, 30*time.Second)
	assert.False(t, g.halted(false), "a stall of a request sent before the breaker closed opened it again")
	ok, probe, _ = g.enter(tenantKey(4), true)
	assert.True(t, ok && !probe)

	// The clean try forgave the stalls before it: a new one starts from
	// the first backoff again.
	observe(timeout, nil, 30*time.Second)
	_, _, wait = g.enter(tenantKey(5), true)
	assert.Equal(t, 5*time.Second, wait, "a try the server answered did not forgive the stalls before it")
	g.leave(false, false)

	// So does a long quiet without one: a try that stalls long after the
	// last stall starts from the first backoff again, and not from the
	// doubled one.
	clk.Step(5 * time.Second)
	ok, probe, _ = g.enter(tenantKey(5), true)
	require.True(t, ok && probe)
	observe(nil, nil, 11*time.Second)
	_, wait = g.leave(true, false)
	require.Equal(t, 10*time.Second, wait)
	clk.Step(11 * time.Minute)
	ok, probe, _ = g.enter(tenantKey(5), true)
	require.True(t, ok && probe)
	observe(nil, nil, 11*time.Second)
	_, wait = g.leave(true, false)
	assert.Equal(t, 5*time.Second, wait, "ten minutes without a stall did not forgive the past")

	var none *tenantGate
	ok, probe, _ = none.enter(tenantKey(1), true)
	assert.True(t, ok && !probe)
	handBack, wait = none.leave(false, false)
	assert.Empty(t, handBack)
	assert.Zero(t, wait)
	assert.False(t, none.halted(false))
}

// Review 7 H1: a tenant holds at most its slots' worth of workers; a
// requester that finds them taken is parked once, and handed back, oldest
// first, as turns end.
func TestATenantHoldsNoMoreWorkersThanItsSlots(t *testing.T) {
	g := newRemotePool(32).newGate(clock.RealClock{}, "ns", 2, time.Minute)
	for n, want := range []bool{true, true, false, false, false} {
		ok, _, wait := g.enter(tenantKey([]int{1, 2, 3, 4, 3}[n]), true)
		require.Equal(t, want, ok, "turn %d", n)
		assert.Zero(t, wait)
	}
	handBack, _ := g.leave(false, false)
	assert.Equal(t, []requester{tenantKey(3)}, handBack, "parked twice, or not handed back")
	ok, _, _ := g.enter(tenantKey(3), true)
	require.True(t, ok)
	handBack, _ = g.leave(false, false)
	assert.Equal(t, []requester{tenantKey(4)}, handBack)
	handBack, _ = g.leave(false, false)
	assert.Empty(t, handBack, "nobody left parked")
}

func clusterKey(ns, cluster string, n int) requester {
	return requester{cluster: types.NamespacedName{Namespace: ns, Name: cluster}, username: fmt.Sprint(n)}
}

// Review 9 H2: every tenant together holds at most the pool's slots; a slot
// given back by one tenant hands back another's parked requester.
func TestTenantsTogetherHoldNoMoreWorkersThanThePool(t *testing.T) {
	pool := newRemotePool(3)
	a := pool.newGate(clock.RealClock{}, "a", 2, time.Minute)
	b := pool.newGate(clock.RealClock{}, "b", 2, time.Minute)
	for _, c := range []struct {
		g    *tenantGate
		key  requester
		runs bool
	}{
		{a, clusterKey("a", "c", 1), true}, {a, clusterKey("a", "c", 2), true}, {b, clusterKey("b", "c", 1), true},
		{b, clusterKey("b", "c", 2), false}, // the pool's three are taken
		{a, clusterKey("a", "c", 3), false},
	} {
		ok, _, wait := c.g.enter(c.key, true)
		require.Equal(t, c.runs, ok, "%v", c.key)
		assert.Zero(t, wait)
	}
	handBack, _ := a.leave(false, false)
	assert.Equal(t, []requester{clusterKey("b", "c", 2)}, handBack, "the slot a gave back is b's parked requester's, the oldest")
	ok, _, _ := b.enter(clusterKey("b", "c", 2), true)
	require.True(t, ok)
	handBack, _ = b.leave(false, false)
	assert.Equal(t, []requester{clusterKey("a", "c", 3)}, handBack)
}

// Review 9 M1: the clusters of one tenant share its slots, but each has its
// own breaker: one whose server stalls holds back its own requesters, not
// its neighbours'.
func TestOneStallingClusterDoesNotHoldBackItsNeighbours(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	pool := newRemotePool(32)
	broken := pool.newGate(clk, "ns", 2, 10*time.Second)
	healthy := pool.newGate(clk, "ns", 2, 10*time.Second)

	ok, _, _ := broken.enter(clusterKey("ns", "broken", 1), true)
	require.True(t, ok)
	ok, _, _ = healthy.enter(clusterKey("ns", "healthy", 1), true)
	require.True(t, ok)
	ok, _, wait := healthy.enter(clusterKey("ns", "healthy", 2), true)
	require.False(t, ok, "a second cluster of the tenant brought fresh slots")
	assert.Zero(t, wait, "parked")

	clk.Step(30 * time.Second)
	broken.observe(context.DeadlineExceeded, nil, 30*time.Second)
	require.True(t, broken.halted(false))
	require.False(t, healthy.halted(false), "one cluster's stall halted its neighbour")
	handBack, wait := broken.leave(false, false)
	assert.Equal(t, 5*time.Second, wait)
	assert.Equal(t, []requester{clusterKey("ns", "healthy", 2)}, handBack, "the stalled cluster's slot is its neighbour's")
	ok, _, _ = healthy.enter(clusterKey("ns", "healthy", 2), true)
	assert.True(t, ok, "the neighbour of a stalled cluster was turned away")
	ok, _, wait = broken.enter(clusterKey("ns", "broken", 2), true)
	assert.False(t, ok)
	assert.Equal(t, 5*time.Second, wait)
}

// Review 9 L2: a cluster forgotten (deleted, or its shard gone) leaves no
// parked requester behind, nor, once it was its tenant's last, the tenant's
// slots.
func TestAForgottenClusterLeavesNothingParked(t *testing.T) {
	pool := newRemotePool(32)
	gone := pool.newGate(clock.RealClock{}, "ns", 1, time.Minute)
	kept := pool.newGate(clock.RealClock{}, "ns", 1, time.Minute)
	ok, _, _ := gone.enter(clusterKey("ns", "gone", 1), true)
	require.True(t, ok)
	for n := 2; n < 100; n++ {
		ok, _, _ = gone.enter(clusterKey("ns", "gone", n), true)
		require.False(t, ok)
	}
	ok, _, _ = kept.enter(clusterKey("ns", "kept", 1), true)
	require.False(t, ok)

	pool.forget(gone)
	pool.mu.Lock()
	assert.Len(t, pool.parked, 1, "the forgotten cluster's parked requesters are kept")
	assert.Len(t, pool.isParked, 1)
	assert.Contains(t, pool.tenants, "ns", "the tenant's slots went with one of its clusters")
	pool.mu.Unlock()
	handBack, _ := gone.leave(false, false) // its turn, still running, ends
	assert.Equal(t, []requester{clusterKey("ns", "kept", 1)}, handBack)

	pool.forget(kept)
	pool.mu.Lock()
	defer pool.mu.Unlock()
	assert.Empty(t, pool.parked)
	assert.Empty(t, pool.tenants, "the tenant's slots outlived its last cluster")
	assert.Equal(t, 32, pool.free, "a slot of the pool was lost")
}

// The hostile review of 2026-12-05: a tenant's server that stalls while its
// watch streams requests under ever new requester names (each taken back
// once queued) had the manager keep every name until the backoff ended, and
// every name parked behind a slow turn until a slot came free: memory
// without bound, at the pace of the tenant's watch. What a tenant's gates
// hold, turned away or parked, is bounded in count and in bytes as its cache
// is; past the bound a requester is not held (its cluster's resync queues it
// again), the held are counted until they come back, and a notice is given
// once a minute at most.
func TestATenantsHeldRequestersAreBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	pool := newRemotePool(32)
	pool.maxHeld, pool.maxHeldBytes = 3, 1024
	g := pool.newGate(clk, "ns", 1, 10*time.Second)
	sibling := pool.newGate(clk, "ns", 1, 10*time.Second)
	held := func() (int, int64) {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return g.slots.held, g.slots.heldBytes
	}

	// Turned away while the breaker's backoff runs.
	ok, _, _ := g.enter(tenantKey(0), true)
	require.True(t, ok)
	g.observe(context.DeadlineExceeded, nil, 30*time.Second)
	_, wait := g.leave(false, false)
	require.Equal(t, 5*time.Second, wait)
	notice, _, _ := g.dropNotice()
	assert.False(t, notice, "a notice with nothing dropped")
	for n := range 100 {
		ok, _, wait := g.enter(tenantKey(n), true)
		require.False(t, ok)
		if n < 3 {
			assert.Equal(t, 5*time.Second, wait, "a requester within the bound was not held until the backoff ends")
		} else {
			assert.Zero(t, wait, "requester %d past the bound was held", n)
		}
	}
	_, _, wait = g.enter(tenantKey(1), true)
	assert.Equal(t, 5*time.Second, wait, "a requester held already was counted again, and not held")
	n, bytes := held()
	assert.Equal(t, 3, n)
	assert.Equal(t, 3*heldSize(tenantKey(0)), bytes)
	notice, maxHeld, maxBytes := g.dropNotice()
	assert.True(t, notice, "no notice of the requesters dropped")
	assert.Equal(t, 3, maxHeld)
	assert.Equal(t, int64(1024), maxBytes)
	notice, _, _ = g.dropNotice()
	assert.False(t, notice, "a second notice within the minute")
	// A requester without a request (taken back) is not held either, and
	// is no drop.
	ok, _, wait = g.enter(tenantKey(500), false)
	assert.False(t, ok)
	assert.Zero(t, wait)
	clk.Step(30 * time.Second)
	notice, _, _ = g.dropNotice()
	assert.False(t, notice, "a requester without a request was said dropped")
	ok, _, _ = sibling.enter(clusterKey("ns", "sibling", 1), true)
	require.True(t, ok)
	sibling.observe(context.DeadlineExceeded, nil, 30*time.Second)
	sibling.leave(false, false)
	ok, _, wait = sibling.enter(clusterKey("ns", "sibling", 2), true)
	assert.False(t, ok)
	assert.Zero(t, wait, "the bound is the tenant's: its second cluster brought fresh room")

	// The backoff over, a try; the others are parked, within the same
	// bound; an answered try closes the breaker and they come back.
	clk.Step(5 * time.Second)
	ok, probe, _ := g.enter(tenantKey(0), true)
	require.True(t, ok && probe)
	n, _ = held()
	assert.Equal(t, 2, n, "the requester trying is still counted as turned away")
	for n := range 3 {
		ok, _, _ := g.enter(tenantKey(100+n), true)
		require.False(t, ok)
	}
	clk.Step(time.Millisecond)
	g.observe(nil, nil, time.Millisecond)
	handBack, _ := g.leave(true, false)
	require.False(t, g.halted(false), "the answered try did not close the breaker")
	assert.Equal(t, []requester{tenantKey(100)}, handBack, "the requesters parked are not those within the bound (the turned-away ones are counted until the breaker closes)")
	n, _ = held()
	assert.Zero(t, n, "the closed breaker's requesters are still counted as held")

	// Parked behind a slow turn: the same bound, and a name longer than
	// the bytes allow is not held whatever the count.
	ok, _, _ = g.enter(tenantKey(0), true)
	require.True(t, ok)
	long := requester{username: strings.Repeat("x", 1024)}
	ok, _, wait = g.enter(long, true)
	assert.False(t, ok)
	assert.Zero(t, wait)
	pool.mu.Lock()
	assert.Empty(t, pool.parked, "a name past the bytes' bound was parked")
	pool.mu.Unlock()
	for n := range 10 {
		ok, _, _ := g.enter(tenantKey(200+n), true)
		require.False(t, ok)
	}
	pool.mu.Lock()
	assert.Len(t, pool.parked, 3)
	pool.mu.Unlock()
	handBack, _ = g.leave(false, false)
	assert.Equal(t, []requester{tenantKey(200)}, handBack)
	n, _ = held()
	assert.Equal(t, 2, n, "a requester handed back is still counted as held")

	// Forgotten: nothing of it is held.
	pool.forget(g)
	n, bytes = held()
	assert.Zero(t, n)
	assert.Zero(t, bytes)

	// The notice comes again after a minute while requesters are still
	// dropped, and not without a drop.
	pool = newRemotePool(32)
	pool.maxHeld = 1
	g = pool.newGate(clk, "ns", 1, 10*time.Second)
	for n := range 3 {
		ok, _, _ := g.enter(tenantKey(n), true)
		require.Equal(t, n == 0, ok)
	}
	notice, _, _ = g.dropNotice()
	require.True(t, notice)
	clk.Step(time.Minute)
	notice, _, _ = g.dropNotice()
	assert.False(t, notice, "a notice with nothing dropped since the last")
	g.enter(tenantKey(3), true)
	notice, _, _ = g.dropNotice()
	assert.True(t, notice, "no notice a minute after the last while requesters are still dropped")
}

// Review 10 F1, F2: forgetting a cluster while its turns run, then starting
// it again (disabled and enabled, deleted and created), brings its tenant
// no fresh slots: the old turns still count until they end. And a worker
// that still found the forgotten gate is not parked under it, where no turn
// of the new one would hand it back: it comes back shortly.
func TestForgettingAClusterBringsItsTenantNoFreshSlots(t *testing.T) {
	pool := newRemotePool(32)
	old := pool.newGate(clock.RealClock{}, "ns", 2, time.Minute)
	for n := range 2 {
		ok, _, _ := old.enter(clusterKey("ns", "c", n), true)
		require.True(t, ok)
	}
	pool.forget(old)
	ok, _, wait := old.enter(clusterKey("ns", "c", 9), true)
	assert.False(t, ok, "a turn ran under a forgotten gate")
	assert.Equal(t, minBackoff, wait, "a worker that found a forgotten gate was parked under it")

	again := pool.newGate(clock.RealClock{}, "ns", 2, time.Minute)
	ok, _, wait = again.enter(clusterKey("ns", "c", 2), true)
	require.False(t, ok, "the cluster started again got fresh slots while its old turns run")
	assert.Zero(t, wait, "parked")
	handBack, _ := old.leave(false, false)
	assert.Equal(t, []requester{clusterKey("ns", "c", 2)}, handBack, "an old turn's end does not make room for the new gate")
	ok, _, _ = again.enter(clusterKey("ns", "c", 2), true)
	require.True(t, ok)
	_, _ = old.leave(false, false)
	pool.forget(again)
	pool.mu.Lock()
	assert.Contains(t, pool.tenants, "ns", "the tenant's slots went while a turn held one")
	pool.mu.Unlock()
	_, _ = again.leave(false, false)
	pool.mu.Lock()
	defer pool.mu.Unlock()
	assert.Empty(t, pool.tenants, "the tenant's slots outlived its clusters and their turns")
	assert.Equal(t, 32, pool.free)
}

// The gate sees what client-go does with a tenant's server: a request it
// never answers (client-go's own timeout) and an answer whose body comes
// slowly each open it, by how long they took; a Retry-After is not obeyed (client-go would wait
// and send again, inside the one bounded request).
func TestATenantRequestThatStallsOpensTheGate(t *testing.T) {
	release := make(chan struct{})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch path.Base(r.URL.Path) {
		case "retry":
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		case "slow":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			time.Sleep(300 * time.Millisecond)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`))
		default:
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	clientFor := func(g *tenantGate) kubernetes.Interface {
		cfg := &rest.Config{Host: srv.URL, Timeout: 2 * time.Second}
		cfg.Wrap(g.RoundTripper)
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		return cs
	}

	// stallAfter is below the request's bound, as the manager sets it
	// (a third of it): whichever of client-go's timers ends the request,
	// it took that long.
	g := newRemotePool(32).newGate(clock.RealClock{}, "ns", 1, time.Second)
	_, err := clientFor(g).CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr", metav1.GetOptions{})
	require.Error(t, err)
	assert.True(t, g.halted(false), "a request that timed out (%v) did not open the gate", err)

	g = newRemotePool(32).newGate(clock.RealClock{}, "ns", 1, 200*time.Millisecond)
	_, err = clientFor(g).CertificatesV1().CertificateSigningRequests().Get(context.Background(), "slow", metav1.GetOptions{})
	t.Logf("slow answer: %v", err)
	assert.True(t, g.halted(false), "an answer whose body took longer than stallAfter did not open the gate")

	g = newRemotePool(32).newGate(clock.RealClock{}, "ns", 1, time.Minute)
	before := hits.Load()
	_, err = clientFor(g).CertificatesV1().CertificateSigningRequests().Get(context.Background(), "retry", metav1.GetOptions{})
	require.Error(t, err)
	assert.Equal(t, int64(1), hits.Load()-before, "client-go obeyed the tenant's Retry-After")
}

// tenantServer is a tenant's API server for the workers' tests: it serves
// /version as version says, reads of its CSRs, and approvals, which it holds
// unanswered while stalling is set (client-go's timeout ends them).
type tenantServer struct {
	mu       sync.Mutex
	csrs     map[string]certificatesv1.CertificateSigningRequest
	approved map[string]bool
	puts     int
	stalling atomic.Bool
	version  http.HandlerFunc
	// done ends the requests held at the test's end.
	done chan struct{}
}

func (s *tenantServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	const prefix = "/apis/certificates.k8s.io/v1/certificatesigningrequests/"
	name, approval := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, prefix), "/approval")
	write := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
	case r.URL.Path == "/version":
		s.version(w, r)
	case !strings.HasPrefix(r.URL.Path, prefix):
		http.NotFound(w, r)
	case approval && r.Method == http.MethodPut:
		s.mu.Lock()
		s.puts++
		s.mu.Unlock()
		if s.stalling.Load() {
			select {
			case <-r.Context().Done():
			case <-s.done:
			}
			return
		}
		var csr certificatesv1.CertificateSigningRequest
		if err := json.NewDecoder(r.Body).Decode(&csr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.approved[name] = true
		s.mu.Unlock()
		write(&csr)
	case r.Method == http.MethodGet:
		s.mu.Lock()
		csr, ok := s.csrs[name]
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		write(&csr)
	default:
		http.Error(w, "not served here", http.StatusMethodNotAllowed)
	}
}

// versionRefused is /version on a hardened server: RBAC refuses it, which
// is an answer all the same.
func versionRefused(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden,
	})
}

func (s *tenantServer) allApproved() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.approved) == len(s.csrs)
}

// dueQueue is the decision queue, watched: it knows when each key put off
// is due, and how many keys the workers hold, so that a test on a fake
// clock can move it to the next wake-up once the workers are done with the
// last, and can tell a requester lost (nothing queued, held or due, and
// requests still wait) from one that comes back.
type dueQueue struct {
	workqueue.TypedRateLimitingInterface[requester]
	clk     *clocktesting.FakeClock
	limiter workqueue.TypedRateLimiter[requester]

	mu   sync.Mutex
	due  map[requester]time.Time
	held int
	// events counts keys taken and given back, so that a settled look
	// can be checked again: a worker may have taken a key from the queue
	// and not yet counted it held.
	events int
}

func newDueQueue(clk *clocktesting.FakeClock) *dueQueue {
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[requester](minBackoff, maxBackoff)
	return &dueQueue{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(limiter,
			workqueue.TypedRateLimitingQueueConfig[requester]{Name: "test", Clock: clk}),
		clk: clk, limiter: limiter, due: map[requester]time.Time{},
	}
}

func (q *dueQueue) AddAfter(k requester, d time.Duration) {
	if d > 0 {
		q.mu.Lock()
		at := q.clk.Now().Add(d)
		if cur, ok := q.due[k]; !ok || at.Before(cur) {
			q.due[k] = at
		}
		q.mu.Unlock()
	}
	q.TypedRateLimitingInterface.AddAfter(k, d)
}

// AddRateLimited is the queue's own (the same limiter's wait), seen.
func (q *dueQueue) AddRateLimited(k requester) { q.AddAfter(k, q.limiter.When(k)) }

func (q *dueQueue) Get() (requester, bool) {
	k, quit := q.TypedRateLimitingInterface.Get()
	q.mu.Lock()
	defer q.mu.Unlock()
	if at, ok := q.due[k]; ok && !at.After(q.clk.Now()) {
		delete(q.due, k)
	}
	if !quit {
		q.held++
		q.events++
	}
	return k, quit
}

// Done lets the queue take the key back (and queue it again, if it was
// added meanwhile) before the worker no longer counts as holding it.
func (q *dueQueue) Done(k requester) {
	q.TypedRateLimitingInterface.Done(k)
	q.mu.Lock()
	q.held--
	q.events++
	q.mu.Unlock()
}

// settled: no key is queued ready, held by a worker, or due by now, twice
// over 20 ms with nothing taken or given back between; next is the earliest
// key due later (zero: none).
func (q *dueQueue) settled() (ok bool, next time.Time) {
	ok, next, events := q.look()
	if !ok {
		return false, time.Time{}
	}
	time.Sleep(20 * time.Millisecond)
	again, _, after := q.look()
	return again && after == events, next
}

func (q *dueQueue) look() (ok bool, next time.Time, events int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.Len() > 0 || q.held > 0 {
		return false, time.Time{}, q.events
	}
	now := q.clk.Now()
	for _, at := range q.due {
		if !at.After(now) {
			return false, time.Time{}, q.events
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return true, next, q.events
}

// stalledTenant is a replica deciding, through a tenant's gate, the
// requests of six requesters (one each, or more) of a cluster whose API
// server is srv, reached by a real client-go clientset; the workers' queue
// is watched (dueQueue), and the fake clock moves only when the test says.
type stalledTenant struct {
	f      *queueFixture
	clk    *clocktesting.FakeClock
	queue  *dueQueue
	srv    *tenantServer
	gate   *tenantGate
	target *target
}

func newStalledTenant(t *testing.T, timeout time.Duration, version http.HandlerFunc, csrsEach int) *stalledTenant {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	var csrs []certificatesv1.CertificateSigningRequest
	for n := range 6 {
		for i := range csrsEach {
			csrs = append(csrs, csrOf(fmt.Sprintf("system:node:%d", n), fmt.Sprintf("csr-%d-%d", n, i), clk.Now().Add(time.Duration(i)*time.Second)))
		}
	}
	f := newQueueFixture(t, clk, csrs...)
	queue := newDueQueue(clk)
	f.r.queue = queue
	srv := &tenantServer{csrs: map[string]certificatesv1.CertificateSigningRequest{}, approved: map[string]bool{}, version: version, done: make(chan struct{})}
	for _, c := range csrs {
		c.TypeMeta = metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "CertificateSigningRequest"}
		c.UID = types.UID("uid-" + c.Name)
		srv.csrs[c.Name] = c
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(func() { close(srv.done) })

	f.r.MaxConcurrentDecisions = 8 // a tenant's slots: 2
	f.r.TenantRequestTimeout = timeout
	gate := f.r.gateOf(f.cluster)
	// JSON, which the test's server speaks; client-go would send protobuf.
	cfg := &rest.Config{Host: hs.URL, Timeout: timeout, ContentConfig: rest.ContentConfig{ContentType: "application/json"}}
	cfg.Wrap(gate.RoundTripper)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	watch, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tg := &target{
		reader: f.r.Client, clientset: cs, names: &nodeNames{}, counts: &floodCounts{}, gate: gate,
		watch: watch, cancel: cancel,
	}
	f.judgeRemotely(t, "kubeconfig", tg, engine.KubeconfigDecision{Allowed: true})
	return &stalledTenant{f: f, clk: clk, queue: queue, srv: srv, gate: gate, target: tg}
}

// settle waits for the workers to be done with what is due now; next is
// the earliest wake-up after it (zero: none).
func (s *stalledTenant) settle(t *testing.T) (next time.Time) {
	t.Helper()
	require.Eventually(t, func() bool {
		var ok bool
		ok, next = s.queue.settled()
		return ok
	}, 10*time.Second, time.Millisecond, "the workers did not settle")
	return next
}

// stallEveryRequester has the server stall, starts four workers and queues
// the six requesters, and waits until their stalled approvals have opened
// the gate.
func (s *stalledTenant) stallEveryRequester(t *testing.T) {
	t.Helper()
	s.srv.stalling.Store(true)
	s.f.start(t, 4)
	for n := range 6 {
		s.f.add(fmt.Sprintf("system:node:%d", n))
	}
	require.Eventually(t, func() bool { return s.gate.halted(false) }, 10*time.Second, 10*time.Millisecond, "the stalled approvals did not open the gate")
}

// recoverAndApproveAll lets the server answer again and moves the fake
// clock to each wake-up in turn, once the workers are done with the last
// (each request's and the breaker's backoffs are counted in it), until every
// request is approved; lost says what it means when nothing is queued, held
// or due and requests still wait. It returns how long that took.
func (s *stalledTenant) recoverAndApproveAll(t *testing.T, lost string) time.Duration {
	t.Helper()
	s.srv.stalling.Store(false)
	recovered := s.clk.Now()
	for !s.srv.allApproved() {
		next := s.settle(t)
		if s.srv.allApproved() {
			break
		}
		require.False(t, next.IsZero(), "%s (approved: %v)", lost, s.srv.approved)
		require.Less(t, next.Sub(recovered), 10*time.Minute, "not approved 10 minutes after the server recovered")
		s.clk.SetTime(next)
	}
	return s.clk.Since(recovered)
}

// Review 9 T1, H1, L1, L4, review 10 T: the workers and a tenant's gate
// together, with nothing queued again from outside (no resync, no event).
// Six requesters of a tenant with two slots; the tenant's server stalls
// every approval, then recovers, and answers /version as each case says.
// Every request is approved once the backoff has passed: no requester is
// lost on the way, parked, turned away or trying.
func TestEveryRequesterOfAStalledTenantComesBackWithoutAResync(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version func(resets *atomic.Int64) http.HandlerFunc
	}{
		{"RBAC refuses /version", func(*atomic.Int64) http.HandlerFunc { return versionRefused }},
		{"the first tries' /version is reset", func(resets *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				if resets.Add(1) <= 2 {
					c, _, err := w.(http.Hijacker).Hijack()
					if err == nil {
						_ = c.Close()
					}
					return
				}
				versionRefused(w, r)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var resets atomic.Int64
			s := newStalledTenant(t, 500*time.Millisecond, tc.version(&resets), 1)
			s.stallEveryRequester(t)
			took := s.recoverAndApproveAll(t, "a requester was lost: nothing is queued, held or due, and requests wait")
			t.Logf("every request approved %s after the server recovered", took)
		})
	}
}

// The hostile review of 2026-12-05, through the workers: while a tenant's
// server stalls, the requester names its watch brought and took back are
// not kept (each would be until the backoff ends), and the requesters with
// requests are, and are all approved once the server recovers.
func TestNamesATenantTookBackAreNotHeldWhileItStalls(t *testing.T) {
	s := newStalledTenant(t, 500*time.Millisecond, versionRefused, 1)
	s.gate.pool.mu.Lock()
	s.gate.pool.maxHeld = 8
	s.gate.pool.mu.Unlock()
	s.stallEveryRequester(t)
	s.settle(t)
	// Names of requests the server no longer has, as many as its watch
	// can bring while the backoff runs.
	for n := range 1000 {
		s.f.add(fmt.Sprintf("gone:%d", n))
	}
	s.settle(t)
	var kept []string
	s.queue.mu.Lock()
	for k := range s.queue.due {
		kept = append(kept, k.username)
	}
	s.queue.mu.Unlock()
	s.gate.pool.mu.Lock()
	for _, pk := range s.gate.pool.parked {
		kept = append(kept, pk.key.username)
	}
	held := s.gate.slots.held
	s.gate.pool.mu.Unlock()
	assert.ElementsMatch(t, []string{"system:node:0", "system:node:1", "system:node:2", "system:node:3", "system:node:4", "system:node:5"}, kept,
		"the requesters kept until the server answers are not those with requests")
	assert.LessOrEqual(t, held, 8)

	s.recoverAndApproveAll(t, "a requester held within the bound was lost")
}

// The review of the bound: a requester whose request went while it was
// turned away still runs the breaker's try when the backoff ends, so that
// the requesters parked behind it come back then, not at a resync; and it
// is counted as held no longer.
func TestARequesterWhoseRequestWentStillTriesForThoseParked(t *testing.T) {
	s := newStalledTenant(t, 500*time.Millisecond, versionRefused, 1)
	s.stallEveryRequester(t)
	s.settle(t)
	// The requesters whose turns stalled come back when the backoff ends;
	// the others are parked. The ones coming back lose their requests.
	var back []string
	s.queue.mu.Lock()
	for k := range s.queue.due {
		back = append(back, k.username)
	}
	s.queue.mu.Unlock()
	require.NotEmpty(t, back)
	s.gate.pool.mu.Lock()
	parked := len(s.gate.pool.parked)
	s.gate.pool.mu.Unlock()
	require.Positive(t, parked, "nobody is parked behind the stalled turns")
	s.srv.mu.Lock()
	for name, csr := range s.srv.csrs {
		if slices.Contains(back, csr.Spec.Username) {
			require.NoError(t, s.f.r.Client.Delete(context.Background(), &csr))
			delete(s.srv.csrs, name)
		}
	}
	s.srv.mu.Unlock()

	s.recoverAndApproveAll(t, "the parked requesters wait for a resync: nobody tried")
	s.gate.pool.mu.Lock()
	defer s.gate.pool.mu.Unlock()
	assert.Zero(t, s.gate.slots.held, "requesters are still counted as held once every request is approved")
}

// Review 10 T (M16): once a request of a turn stalled, the turn stops; the
// requester's other requests wait for the backoff, not the worker.
func TestAStallEndsTheTurn(t *testing.T) {
	s := newStalledTenant(t, 500*time.Millisecond, versionRefused, 3)
	s.srv.stalling.Store(true)
	s.f.start(t, 4)
	s.f.add("system:node:0")
	require.Eventually(t, func() bool { return s.gate.halted(false) }, 10*time.Second, time.Millisecond)
	next := s.settle(t)
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	assert.Equal(t, 1, s.srv.puts, "the turn went on after its request stalled")
	assert.Equal(t, 5*time.Second, next.Sub(s.clk.Now()), "the requester does not come back when the backoff ends")
}

// Review 10 F1: a turn ends with its target. Once the kubeconfig is
// withdrawn or the cluster forgotten (the target's watch ends), the request
// in flight is given up (and remembered as failed: it may have been
// applied) and nothing more is sent to that server, however long its bound.
func TestATurnEndsWithItsTarget(t *testing.T) {
	s := newStalledTenant(t, time.Hour, versionRefused, 3)
	s.srv.stalling.Store(true)
	s.f.start(t, 4)
	s.f.add("system:node:0")
	require.Eventually(t, func() bool {
		s.srv.mu.Lock()
		defer s.srv.mu.Unlock()
		return s.srv.puts == 1
	}, 10*time.Second, time.Millisecond, "the first approval was not sent")
	s.target.cancel()
	s.settle(t)
	// Review 11 M1: the write cut short may have been applied; the
	// request is remembered, to be settled at its next look.
	assert.True(t, s.f.r.failures.Has(memoKey{cluster: s.f.cluster, uid: "uid-csr-0-0"}), "the approval cut short was forgotten")
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	assert.Equal(t, 1, s.srv.puts, "a turn went on through a target that ended")
	s.gate.pool.mu.Lock()
	defer s.gate.pool.mu.Unlock()
	assert.False(t, s.gate.open, "a turn this side ended was held against the server")
}

// Review 9 M1, L2: the manager keeps one gate per remote cluster, sharing
// its tenant's slots, through every new watch of its server; a cluster
// forgotten (deleted, disabled, its shard gone) takes its gate with it.
func TestEachRemoteClusterHasItsGateUntilItIsForgotten(t *testing.T) {
	r := &Reconciler{MaxConcurrentDecisions: 32, TenantRequestTimeout: DefaultTenantRequestTimeout, Clock: clock.RealClock{}}
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	ga, gb := r.gateOf(a), r.gateOf(b)
	require.NotSame(t, ga, gb, "two clusters share a breaker")
	assert.Same(t, ga.slots, gb.slots, "two clusters of a tenant do not share its slots")
	assert.Same(t, ga, r.gateOf(a), "a new watch of the cluster's server got a fresh breaker")

	r.targets.drop(a, false)
	assert.Same(t, ga, r.gateOf(a), "a watch restarted (the kubeconfig rewritten, refused) reset the breaker")
	r.targets.stop(a)
	assert.NotSame(t, ga, r.gateOf(a), "a forgotten cluster kept its gate")
	r.targets.stop(a)
	r.targets.stop(b)
	r.targets.mu.Lock()
	defer r.targets.mu.Unlock()
	assert.Empty(t, r.targets.gates)
	assert.Empty(t, r.targets.pool.tenants, "a tenant's slots outlived its clusters")
}

// Review 11: a try whose /version is answered, but only after the stall
// bound, has failed. The turn ends there (nothing is asked of the server
// that just stalled), the breaker stays open for the next, longer backoff,
// and the requester comes back when it ends.
func TestATryAnsweredOnlyAfterTheStallBoundFails(t *testing.T) {
	var clk *clocktesting.FakeClock
	var slow atomic.Bool
	s := newStalledTenant(t, 600*time.Millisecond, func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			// The answer takes twice the stall bound (a third of the
			// request bound), within the request bound.
			clk.Step(400 * time.Millisecond)
		}
		versionRefused(w, r)
	}, 1)
	clk = s.clk
	s.srv.stalling.Store(true)
	s.f.start(t, 4)
	s.f.add("system:node:0")
	require.Eventually(t, func() bool { return s.gate.halted(false) }, 10*time.Second, time.Millisecond, "the stalled approval did not open the gate")

	// The server no longer stalls approvals, but answers the try's
	// /version late.
	s.srv.stalling.Store(false)
	slow.Store(true)
	s.clk.SetTime(s.settle(t))
	next := s.settle(t)
	s.srv.mu.Lock()
	puts := s.srv.puts
	s.srv.mu.Unlock()
	assert.Equal(t, 1, puts, "the try went on to approve through a server that stalled in it")
	assert.Equal(t, 10*time.Second, next.Sub(s.clk.Now()), "the failed try did not double the backoff, or its requester does not come back when it ends")

	// Answered in time, the next try approves.
	slow.Store(false)
	s.clk.SetTime(next)
	s.settle(t)
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	assert.True(t, s.srv.approved["csr-0-0"], "the request was not approved once the server answered in time")
}
