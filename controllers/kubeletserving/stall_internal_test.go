package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

func tenantKey(n int) requester { return requester{username: fmt.Sprintf("system:node:%d", n)} }

// Review 7 H1, review 8: once a request to a tenant's server stalled, none
// of its requesters runs until a backoff has passed; one turned away waits
// for it, the others are parked; then one tries, alone; a try that stalls,
// or is refused, doubles the backoff (the stalls of turns begun before
// count once); only a try the server answered cleanly lets the parked ones
// back in; a long quiet forgives the past.
func TestAStallingTenantServerHoldsItsRequestersBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	g := newRemotePool(32).newGate(clk, 2, 10*time.Second)
	timeout := fmt.Errorf("put approval: %w", context.DeadlineExceeded)

	ok, probe, _ := g.enter(tenantKey(1))
	require.True(t, ok && !probe, "closed: a requester runs, and is no try")
	g.observe(errors.New("connection refused"), nil, time.Millisecond)
	g.observe(context.Canceled, context.Canceled, time.Millisecond)
	g.observe(nil, nil, time.Second)
	require.False(t, g.halted(false), "a refusal, a cancellation or a quick answer is no stall")

	g.observe(timeout, nil, 30*time.Second)
	require.True(t, g.halted(false), "a timeout opens the breaker")
	g.observe(nil, context.DeadlineExceeded, 30*time.Second) // another turn's, begun before
	ok, _, wait := g.enter(tenantKey(2))
	require.False(t, ok)
	assert.Equal(t, 5*time.Second, wait, "the first turned away waits for the backoff (the stalls of turns begun before count once)")
	for _, n := range []int{3, 3, 4} {
		ok, _, wait = g.enter(tenantKey(n))
		require.False(t, ok)
		assert.Zero(t, wait, "the others are parked")
	}
	handBack, wait := g.leave(false)
	assert.Empty(t, handBack, "a turn ending while the breaker is open hands nobody back")
	assert.Zero(t, wait)

	// Each try: it runs alone, the server stalls (a slow answer) or
	// refuses, and the backoff doubles.
	for _, c := range []struct {
		backoff time.Duration
		outcome func()
	}{
		{5 * time.Second, func() { g.observe(nil, nil, time.Millisecond); g.observe(nil, nil, 11*time.Second) }},
		{10 * time.Second, func() { g.observe(errors.New("connection reset"), nil, time.Millisecond) }},
	} {
		clk.Step(c.backoff)
		ok, probe, _ = g.enter(tenantKey(2))
		require.True(t, ok && probe, "the backoff over, the waker tries")
		ok, _, wait = g.enter(tenantKey(5))
		require.False(t, ok, "a second requester ran during the try")
		assert.Zero(t, wait)
		c.outcome()
		handBack, wait = g.leave(true)
		assert.Empty(t, handBack)
		assert.Equal(t, 2*c.backoff, wait, "the try failed: its requester waits the doubled backoff")
		require.True(t, g.halted(false))
	}
	clk.Step(20 * time.Second)
	ok, probe, _ = g.enter(tenantKey(2))
	require.True(t, ok && probe)
	g.observe(nil, nil, time.Millisecond)
	require.False(t, g.halted(true), "a clean try goes on")
	handBack, wait = g.leave(true)
	assert.Zero(t, wait)
	assert.Equal(t, []requester{tenantKey(3), tenantKey(4)}, handBack, "closed: the parked are handed back, oldest first, as slots allow")
	ok, probe, _ = g.enter(tenantKey(3))
	assert.True(t, ok && !probe)

	// Long after, a new stall starts from the first backoff again.
	clk.Step(11 * time.Minute)
	g.observe(timeout, nil, 30*time.Second)
	_, _, wait = g.enter(tenantKey(6))
	assert.Equal(t, 5*time.Second, wait)

	var none *tenantGate
	ok, probe, _ = none.enter(tenantKey(1))
	assert.True(t, ok && !probe)
	handBack, wait = none.leave(false)
	assert.Empty(t, handBack)
	assert.Zero(t, wait)
	assert.False(t, none.halted(false))
}

// Review 7 H1: a tenant holds at most its slots' worth of workers; a
// requester that finds them taken is parked once, and handed back, oldest
// first, as turns end.
func TestATenantHoldsNoMoreWorkersThanItsSlots(t *testing.T) {
	g := newRemotePool(32).newGate(clock.RealClock{}, 2, time.Minute)
	for n, want := range []bool{true, true, false, false, false} {
		ok, _, wait := g.enter(tenantKey([]int{1, 2, 3, 4, 3}[n]))
		require.Equal(t, want, ok, "turn %d", n)
		assert.Zero(t, wait)
	}
	handBack, _ := g.leave(false)
	assert.Equal(t, []requester{tenantKey(3)}, handBack, "parked twice, or not handed back")
	ok, _, _ := g.enter(tenantKey(3))
	require.True(t, ok)
	handBack, _ = g.leave(false)
	assert.Equal(t, []requester{tenantKey(4)}, handBack)
	handBack, _ = g.leave(false)
	assert.Empty(t, handBack, "nobody left parked")
}

// Review 9 H2: every tenant together holds at most the pool's slots; a slot
// given back by one tenant hands back another's parked requester.
func TestTenantsTogetherHoldNoMoreWorkersThanThePool(t *testing.T) {
	pool := newRemotePool(3)
	a := pool.newGate(clock.RealClock{}, 2, time.Minute)
	b := pool.newGate(clock.RealClock{}, 2, time.Minute)
	key := func(ns string, n int) requester {
		return requester{cluster: types.NamespacedName{Namespace: ns, Name: "c"}, username: fmt.Sprint(n)}
	}
	for _, c := range []struct {
		g    *tenantGate
		key  requester
		runs bool
	}{
		{a, key("a", 1), true}, {a, key("a", 2), true}, {b, key("b", 1), true},
		{b, key("b", 2), false}, // the pool's three are taken
		{a, key("a", 3), false},
	} {
		ok, _, wait := c.g.enter(c.key)
		require.Equal(t, c.runs, ok, "%v", c.key)
		assert.Zero(t, wait)
	}
	handBack, _ := a.leave(false)
	assert.Equal(t, []requester{key("b", 2)}, handBack, "the slot a gave back is b's parked requester's, the oldest")
	ok, _, _ := b.enter(key("b", 2))
	require.True(t, ok)
	handBack, _ = b.leave(false)
	assert.Equal(t, []requester{key("a", 3)}, handBack)
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
	g := newRemotePool(32).newGate(clock.RealClock{}, 1, time.Second)
	_, err := clientFor(g).CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr", metav1.GetOptions{})
	require.Error(t, err)
	assert.True(t, g.halted(false), "a request that timed out (%v) did not open the gate", err)

	g = newRemotePool(32).newGate(clock.RealClock{}, 1, 200*time.Millisecond)
	_, err = clientFor(g).CertificatesV1().CertificateSigningRequests().Get(context.Background(), "slow", metav1.GetOptions{})
	t.Logf("slow answer: %v", err)
	assert.True(t, g.halted(false), "an answer whose body took longer than stallAfter did not open the gate")

	g = newRemotePool(32).newGate(clock.RealClock{}, 1, time.Minute)
	before := hits.Load()
	_, err = clientFor(g).CertificatesV1().CertificateSigningRequests().Get(context.Background(), "retry", metav1.GetOptions{})
	require.Error(t, err)
	assert.Equal(t, int64(1), hits.Load()-before, "client-go obeyed the tenant's Retry-After")
}
