package kubeletserving

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// reconcileWorkers is how many TalosClusters are reconciled at once.
const reconcileWorkers = 4

// remoteStarts keeps the start of remote clusters' watches from holding the
// reconcile workers, which every cluster shares (review 8 M3). A start asks
// the tenant's server (a TLS probe, the list its cache syncs from) and may
// wait up to the tenant's request bound for it. So
//   - at most one start of a tenant (a namespace) runs at a time, and at
//     most half the reconcile workers start remote watches at once; a
//     reconcile that finds no room comes back a little later, and the
//     tenants that found none are given it in the order they came (a tenant
//     whose clusters keep polling does not win it over one that waits);
//   - a cluster whose start failed is not started again, for the same
//     kubeconfig content and bundle revision, until a backoff has passed
//     (the request bound, doubling with each failure, at most 5 min),
//     however often it is reconciled meanwhile (its own status writes, its
//     machines' events: a tenant's to make at will). A failure of this
//     side (ownFailure) is not the tenant's: it waits the request bound,
//     never doubled, and counts for nothing in the tenant's backoff.
type remoteStarts struct {
	mu      sync.Mutex
	running int
	tenants map[string]bool
	failed  map[types.NamespacedName]startFailure
	// waiting are the tenants that found no room, oldest first, each with
	// when it last asked: one that stops asking (its clusters gone, or
	// started) is dropped after a few of its waits.
	waiting []waitingTenant
}

type waitingTenant struct {
	namespace string
	asked     time.Time
}

// startFailure is a cluster's failed start: of which content and revision,
// how many in a row, and when the next may begin.
type startFailure struct {
	sum      [sha256.Size]byte
	revision string
	n        int
	until    time.Time
	err      error
	// afterStart: a failure came after a start that succeeded
	// (remoteStarts.fail). A start that succeeds then keeps the count, so
	// a server that answers its start small and then grows is started
	// again at a doubling interval, not every bound; the count is
	// forgotten once no failure came for maxBackoff past its wait.
	afterStart bool
}

// startDeferredError says a remote cluster's watch is not started in this
// reconcile, and when to look again; the cluster's conditions still say why
// the last start failed, if one did.
type startDeferredError struct {
	wait  time.Duration
	cause error
}

func (e *startDeferredError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("the watch of the cluster's API server is started again in %s; it last failed: %v", e.wait, e.cause)
	}
	return fmt.Sprintf("another watch of the tenant's API servers is starting; this one starts in %s", e.wait)
}

// Unwrap is the last start's failure, if that is why.
func (e *startDeferredError) Unwrap() error { return e.cause }

// begin says whether key's watch may start now; if it may, end must be
// called with the start's outcome.
func (s *remoteStarts) begin(key types.NamespacedName, sum [sha256.Size]byte, revision string, now time.Time, busyWait time.Duration) (end func(now time.Time, bound time.Duration, err error), _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.failed[key]; ok && f.sum == sum && f.revision == revision && now.Before(f.until) {
		return nil, &startDeferredError{wait: f.until.Sub(now), cause: f.err}
	} else if ok && f.afterStart && now.Sub(f.until) > maxBackoff {
		delete(s.failed, key)
	}
	if s.tenants[key.Namespace] {
		return nil, &startDeferredError{wait: busyWait}
	}
	if !s.takeTurn(key.Namespace, now, busyWait) {
		return nil, &startDeferredError{wait: busyWait}
	}
	if s.tenants == nil {
		s.tenants = map[string]bool{}
	}
	s.tenants[key.Namespace] = true
	s.running++
	return func(now time.Time, bound time.Duration, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.tenants, key.Namespace)
		s.running--
		if err == nil {
			if f, ok := s.failed[key]; !ok || !f.afterStart || f.sum != sum || f.revision != revision {
				delete(s.failed, key)
			}
			return
		}
		s.failLocked(key, sum, revision, now, bound, err)
	}, nil
}

// fail counts a failure of key's watch after its start (its tenant's server
// grew past the limits the manager keeps), as if its start had failed: it
// is not started again for that content and revision until the backoff has
// passed, and a reconcile meanwhile says why (startDeferredError's cause).
func (s *remoteStarts) fail(key types.NamespacedName, sum [sha256.Size]byte, revision string, now time.Time, bound time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(key, sum, revision, now, bound, err)
	f := s.failed[key]
	f.afterStart = true
	s.failed[key] = f
}

func (s *remoteStarts) failLocked(key types.NamespacedName, sum [sha256.Size]byte, revision string, now time.Time, bound time.Duration, err error) {
	f := s.failed[key]
	if f.sum != sum || f.revision != revision {
		f = startFailure{sum: sum, revision: revision}
	}
	f.err = err
	if f.afterStart && now.Sub(f.until) > maxBackoff {
		// No failure for a quiet while past its wait: counted afresh,
		// whether a start or a running watch notices (review 33 L2).
		f.n = 0
	}
	if errors.As(err, new(ownFailure)) {
		// Not the tenant's: the same wait every time, and its
		// failures before stay as they were.
		f.until = now.Add(bound)
	} else {
		f.until = now.Add(min(bound<<min(f.n, 10), maxBackoff))
		f.n++
	}
	if s.failed == nil {
		s.failed = map[types.NamespacedName]startFailure{}
	}
	s.failed[key] = f
}

// takeTurn says whether the tenant in namespace may start now: there is
// room, and no tenant that waited longer is owed it. A tenant turned away
// is kept in line. Called with mu held.
func (s *remoteStarts) takeTurn(namespace string, now time.Time, busyWait time.Duration) bool {
	live := s.waiting[:0]
	for _, w := range s.waiting {
		if w.namespace == namespace || now.Sub(w.asked) <= 3*busyWait {
			live = append(live, w)
		}
	}
	clear(s.waiting[len(live):])
	s.waiting = live
	room := max(1, reconcileWorkers/2) - s.running
	at := slices.IndexFunc(s.waiting, func(w waitingTenant) bool { return w.namespace == namespace })
	switch {
	case at >= 0 && at < room:
		s.waiting = slices.Delete(s.waiting, at, at+1)
		return true
	case at < 0 && len(s.waiting) < room:
		return true
	case at >= 0:
		s.waiting[at].asked = now
	default:
		s.waiting = append(s.waiting, waitingTenant{namespace: namespace, asked: now})
	}
	return false
}

// wake lets one cluster of stopped's tenant start now rather than after its
// backoff: the one due soonest of those whose start failed for what the
// tenant's servers held together (tenantBoundError). stopped's watch has
// ended and given its share back. The failure's count is kept, so a start
// that fails again backs off longer; a failure after a start that
// succeeded (afterStart: a server that grew past the bound while watched)
// is never woken, nor stopped itself. So two clusters that take turns at
// crossing the bound wait for their backoffs, and a watch stopped at will
// (its kubeconfig rewritten) starts at most one sibling's list besides its
// own.
func (s *remoteStarts) wake(stopped types.NamespacedName, now time.Time) (types.NamespacedName, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		woken types.NamespacedName
		found bool
	)
	for key, f := range s.failed {
		if key.Namespace != stopped.Namespace || key == stopped || f.afterStart || !now.Before(f.until) || !errors.As(f.err, new(tenantBoundError)) {
			continue
		}
		if !found || f.until.Before(s.failed[woken].until) || (f.until.Equal(s.failed[woken].until) && key.Name < woken.Name) {
			woken, found = key, true
		}
	}
	if found {
		f := s.failed[woken]
		f.until = now
		s.failed[woken] = f
	}
	return woken, found
}

// forget drops what is kept of a cluster's failed starts.
func (s *remoteStarts) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failed, key)
}
