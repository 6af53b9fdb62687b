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
//   - a cluster whose start failed is not started again until a backoff
//     has passed (the request bound, doubling with each failure, at most
//     5 min), however often it is reconciled meanwhile (its own status
//     writes, its machines' events: a tenant's to make at will). A failure
//     of this side (ownFailure) is not the tenant's: it waits the request
//     bound, never doubled, and counts for nothing in the tenant's backoff;
//   - the count is the cluster's, not its kubeconfig content's: another
//     content (the tenant's fix, or a rewrite to reset the backoff: the
//     Secret is the tenant's to write at will) is started before the
//     backoff has passed once per backoff, a start that succeeds (or
//     whose content the rule refuses) ends the wait but keeps the count,
//     and a cluster deleted and made again under its name keeps it too;
//     only another bundle revision (the operator's), or no failure for
//     maxBackoff past the wait, starts the count afresh. So alternating a
//     failing content with one that starts, or that is refused, starts the
//     failing one once per doubling wait.
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

// startFailure is a cluster's failed starts: of which bundle revision, the
// content last started, how many since the count began, and when the next
// may begin.
type startFailure struct {
	sum      [sha256.Size]byte
	revision string
	n        int
	until    time.Time
	err      error
	// afterStart: a failure came after a start that succeeded
	// (remoteStarts.fail): a server that answers its start small and
	// then grows. Such a cluster is never woken early (wake).
	afterStart bool
	// wait is the backoff until ends, and early when a start of another
	// content was last let in before until: at most one such start per
	// wait, so that rewriting the kubeconfig does not undo the backoff.
	wait  time.Duration
	early time.Time
	// forgotten: the cluster went (deleted, disabled, no longer remote).
	// Its count is kept for one made again under its name, and dropped
	// once no failure came for maxBackoff past its wait.
	forgotten bool
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
	return fmt.Sprintf("other watches of API servers are starting (this tenant's one at a time, and as many as the manager starts at once); this one starts in %s", e.wait)
}

// Unwrap is the last start's failure, if that is why.
func (e *startDeferredError) Unwrap() error { return e.cause }

// begin says whether key's watch may start now; if it may, end must be
// called with the start's outcome.
func (s *remoteStarts) begin(key types.NamespacedName, sum [sha256.Size]byte, revision string, now time.Time, busyWait time.Duration) (end func(now time.Time, bound time.Duration, err error), _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.failed[key]
	if ok && now.Sub(f.until) > maxBackoff {
		// No failure for a quiet while past its wait: counted afresh.
		delete(s.failed, key)
		ok = false
	}
	if ok && f.forgotten {
		// Made again under its name: held to the count of the one that
		// went, and woken like any other.
		f.forgotten = false
		s.failed[key] = f
	}
	early := false
	switch {
	case ok && f.revision == revision && now.Before(f.until) && f.sum == sum:
		return nil, &startDeferredError{wait: f.until.Sub(now), cause: f.err}
	case ok && f.revision == revision && now.Before(f.until):
		// Another content within the backoff: let in once a wait.
		if next := f.early.Add(f.wait); !f.early.IsZero() && now.Before(next) {
			return nil, &startDeferredError{wait: min(next.Sub(now), f.until.Sub(now)), cause: f.err}
		}
		early = true
	}
	// Waiting for room after a failed start of this content, whose wait
	// is over: the cluster goes on saying that failure, not only that its
	// start waits (review 205 F5: the condition flapped between the two).
	var last error
	if ok && f.revision == revision && f.sum == sum {
		last = f.err
	}
	if s.tenants[key.Namespace] {
		return nil, &startDeferredError{wait: busyWait, cause: last}
	}
	if !s.takeTurn(key.Namespace, now, busyWait) {
		return nil, &startDeferredError{wait: busyWait, cause: last}
	}
	if s.tenants == nil {
		s.tenants = map[string]bool{}
	}
	s.tenants[key.Namespace] = true
	s.running++
	if early {
		f.early = now
		s.failed[key] = f
	}
	return func(now time.Time, bound time.Duration, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.tenants, key.Namespace)
		s.running--
		if err == nil {
			f, ok := s.failed[key]
			if !ok || f.revision != revision {
				delete(s.failed, key)
				return
			}
			// The wait is over, the count is kept: a success (or a
			// refusal, which targetFor reports as one) must not let a
			// failing content back at once (alternating the two), nor a
			// server that answers its start small and then grows.
			f.sum, f.err = sum, nil
			if now.Before(f.until) {
				f.until = now
			}
			s.failed[key] = f
			return
		}
		s.failLocked(key, sum, revision, now, bound, err)
	}, nil
}

// fail counts a failure of key's watch after its start (its tenant's server
// grew past the limits the manager keeps), as if its start had failed: it
// is not started again until the backoff has passed, and a reconcile
// meanwhile says why (startDeferredError's cause).
func (s *remoteStarts) fail(key types.NamespacedName, sum [sha256.Size]byte, revision string, now time.Time, bound time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(key, sum, revision, now, bound, err)
	f := s.failed[key]
	f.afterStart = true
	s.failed[key] = f
}

func (s *remoteStarts) failLocked(key types.NamespacedName, sum [sha256.Size]byte, revision string, now time.Time, bound time.Duration, err error) {
	f, ok := s.failed[key]
	if !ok || f.revision != revision {
		// Another bundle is the operator's: counted afresh. Another
		// content is the tenant's, and counts on.
		f = startFailure{revision: revision}
	}
	f.sum, f.err = sum, err
	if ok && now.Sub(f.until) > maxBackoff {
		// No failure for a quiet while past its wait (or the start
		// that ended it): counted afresh, whether a start or a running
		// watch notices (review 33 L2).
		f.n, f.early = 0, time.Time{}
	}
	if errors.As(err, new(ownFailure)) {
		// Not the tenant's: the same wait every time, and its
		// failures before stay as they were.
		f.wait = bound
	} else {
		f.wait = min(bound<<min(f.n, 10), maxBackoff)
		f.n++
	}
	f.until = now.Add(f.wait)
	if s.failed == nil {
		s.failed = map[types.NamespacedName]startFailure{}
	}
	s.failed[key] = f
	// The counts kept of clusters gone, once quiet, go with them.
	for k, g := range s.failed {
		if g.forgotten && now.Sub(g.until) > maxBackoff {
			delete(s.failed, k)
		}
	}
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
		if key.Namespace != stopped.Namespace || key == stopped || f.afterStart || f.forgotten || !now.Before(f.until) || !errors.As(f.err, new(tenantBoundError)) {
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

// forget marks what is kept of a cluster's failed starts as the cluster's
// that went: a cluster made again under its name (by a tenant, to start
// afresh) is still held to the backoff, and the count is dropped once quiet.
func (s *remoteStarts) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.failed[key]; ok {
		f.forgotten = true
		s.failed[key] = f
	}
}
