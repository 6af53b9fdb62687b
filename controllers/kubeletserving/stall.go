package kubeletserving

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// stallBreaker keeps a tenant's API server from holding the decision
// workers, which every cluster shares: each request to it is bounded
// (TenantRequestTimeout), but a server that lets every write time out would
// otherwise hold a worker that long for each of its requesters, which it
// names itself, again and again. After a request to it timed out, none of
// its requesters is decided until a backoff has passed (5 s, doubling, at
// most 5 min, while it keeps timing out); then one requester at a time
// tries, and the first try in which it answered and let nothing time out
// closes the breaker. (tenantSlots bounds what it can hold before that.)
// The nil breaker never opens (the local API server).
type stallBreaker struct {
	clock clock.PassiveClock

	mu sync.Mutex
	// timeouts counts the requests that timed out since the breaker last
	// closed; zero: closed.
	timeouts int
	// until is when the next try may begin.
	until time.Time
	// probing: a try is running; answered and timedOut are what the
	// server did during it.
	probing, answered, timedOut bool
}

// enter reports whether a requester's requests may be decided through the
// server now, and whether this turn is the one try of a server that stalled
// (then leave must be called); when not, how long to wait.
func (b *stallBreaker) enter() (ok, probe bool, wait time.Duration) {
	if b == nil {
		return true, false, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	switch {
	case b.timeouts == 0:
		return true, false, 0
	case now.Before(b.until):
		return false, false, b.until.Sub(now)
	case b.probing:
		return false, false, minBackoff
	}
	b.probing, b.answered, b.timedOut = true, false, false
	return true, true, 0
}

// leave ends the try enter allowed: the breaker closes if the server
// answered in it and let nothing time out.
func (b *stallBreaker) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.answered && !b.timedOut {
		b.timeouts = 0
	}
	b.probing = false
}

// stalled reports whether the breaker is open: the rest of a turn waits.
func (b *stallBreaker) stalled() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.timeouts > 0
}

// observe notes the outcome of one request to the server: err, and the
// request's context after it.
func (b *stallBreaker) observe(err, ctxErr error) {
	var netErr net.Error
	timedOut := err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(ctxErr, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()))
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case timedOut:
		b.until = b.clock.Now().Add(backoff.After(b.timeouts))
		b.timeouts++
		b.timedOut = true
	case err == nil:
		b.answered = true
	}
}

// RoundTripper observes every request sent through rt.
func (b *stallBreaker) RoundTripper(rt http.RoundTripper) http.RoundTripper {
	return observed{rt: rt, b: b}
}

type observed struct {
	rt http.RoundTripper
	b  *stallBreaker
}

func (o observed) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.rt.RoundTrip(req)
	o.b.observe(err, req.Context().Err())
	return resp, err
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (o observed) WrappedRoundTripper() http.RoundTripper { return o.rt }

// tenantSlots bounds how many decision workers one tenant's API server
// holds at once, whatever it does: a requester that finds them taken is
// parked, and queued again when one is given back, rather than wait in a
// worker or come back again and again. The nil slots never run out (the
// local API server).
type tenantSlots struct {
	mu       sync.Mutex
	free     int
	parked   []requester
	isParked map[requester]bool
}

func newTenantSlots(n int) *tenantSlots {
	return &tenantSlots{free: n, isParked: map[requester]bool{}}
}

// take takes a slot for key, or parks key and reports false.
func (s *tenantSlots) take(key requester) bool {
	if s == nil {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free > 0 {
		s.free--
		return true
	}
	if !s.isParked[key] {
		s.isParked[key] = true
		s.parked = append(s.parked, key)
	}
	return false
}

// give gives a slot back, and returns the parked requester to queue again,
// if any.
func (s *tenantSlots) give() (requester, bool) {
	if s == nil {
		return requester{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free++
	if len(s.parked) == 0 {
		return requester{}, false
	}
	key := s.parked[0]
	s.parked = s.parked[1:]
	delete(s.isParked, key)
	return key, true
}
