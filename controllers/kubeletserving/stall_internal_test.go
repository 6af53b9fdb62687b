package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// Review 7 H1: after a request to a tenant's server timed out, none of its
// requesters is decided until a growing backoff has passed; then one at a
// time tries, and only a try in which the server answered and let nothing
// time out lets them all in again. Answers outside a try, refusals and
// cancellations change nothing.
func TestAStallingTenantServerHoldsItsRequestersBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	b := &stallBreaker{clock: clk}
	timeout := fmt.Errorf("put approval: %w", context.DeadlineExceeded)

	ok, probe, _ := b.enter()
	require.True(t, ok)
	require.False(t, probe, "closed: every requester goes, none is a try")
	b.observe(errors.New("connection refused"), nil)
	b.observe(context.Canceled, context.Canceled)
	require.False(t, b.stalled(), "a refusal or a cancellation is no stall")

	b.observe(timeout, nil)
	require.True(t, b.stalled())
	// Each round: nobody goes until the backoff is over, whatever answers
	// come from turns begun before; then one tries, alone, and the server
	// lets a request of it time out again.
	for _, backoff := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second} {
		ok, _, wait := b.enter()
		require.False(t, ok, "open: nobody goes")
		assert.Equal(t, backoff, wait)
		b.observe(nil, nil)
		clk.Step(backoff)
		ok, probe, _ = b.enter()
		require.True(t, ok && probe, "the backoff over: one tries")
		ok, _, _ = b.enter()
		require.False(t, ok, "a second requester went during the try")
		if backoff < 20*time.Second {
			b.observe(nil, nil) // a read answered
			b.observe(timeout, nil)
			b.leave()
			require.True(t, b.stalled(), "a try with a timeout closed the breaker")
		}
	}
	// The last try: answered, nothing timed out.
	b.observe(nil, nil)
	b.leave()
	require.False(t, b.stalled(), "a clean try did not close the breaker")
	ok, probe, _ = b.enter()
	assert.True(t, ok)
	assert.False(t, probe)

	var none *stallBreaker
	ok, probe, _ = none.enter()
	assert.True(t, ok && !probe)
	assert.False(t, none.stalled())
}

// Review 7 H1: a tenant's server holds at most its slots' worth of workers;
// a requester that finds them taken is parked once, and handed back, oldest
// first, as slots are given back.
func TestATenantHoldsNoMoreWorkersThanItsSlots(t *testing.T) {
	s := newTenantSlots(2)
	key := func(n int) requester { return requester{username: fmt.Sprintf("system:node:%d", n)} }
	require.True(t, s.take(key(1)))
	require.True(t, s.take(key(2)))
	require.False(t, s.take(key(3)))
	require.False(t, s.take(key(4)))
	require.False(t, s.take(key(3)), "parked twice")
	got, ok := s.give()
	require.True(t, ok)
	assert.Equal(t, key(3), got)
	require.True(t, s.take(key(3)), "the slot given back is free for the requester handed back")
	got, ok = s.give()
	require.True(t, ok)
	assert.Equal(t, key(4), got)
	_, ok = s.give()
	assert.False(t, ok, "nobody left parked")
	require.True(t, s.take(key(4)))
	require.True(t, s.take(key(5)), "two slots given back, one taken")
	require.False(t, s.take(key(6)))

	var none *tenantSlots
	assert.True(t, none.take(key(1)))
	_, ok = none.give()
	assert.False(t, ok)
}

// The breaker sees client-go's own timeouts: a tenant clientset's request
// that its server never answers opens it.
func TestATenantRequestThatTimesOutOpensTheBreaker(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	b := &stallBreaker{clock: clock.RealClock{}}
	cfg := &rest.Config{Host: srv.URL, Timeout: 200 * time.Millisecond}
	cfg.Wrap(b.RoundTripper)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = cs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr", metav1.GetOptions{})
	require.Error(t, err)
	assert.True(t, b.stalled(), "a request that timed out (%v) did not open the breaker", err)
}
