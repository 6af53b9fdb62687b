package kubeletserving

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/engine"
)

// Defaults of the decision workers.
const (
	// DefaultMaxConcurrentDecisions bounds the requests decided at once,
	// over every cluster: each holds a Talos read, a decision and a write.
	DefaultMaxConcurrentDecisions = 32
	// DefaultPassWait is how long a pass waits for its decisions before it
	// returns; the slow ones (a node that does not answer) go on in the
	// background and wake the cluster when they are done, so that one
	// hanging node holds up neither its cluster's other requests nor the
	// next events.
	DefaultPassWait = time.Second
)

// workers runs the decisions of requests, each request at most once at a
// time, at most a fixed number at once.
type workers struct {
	slots    chan struct{}
	mu       sync.Mutex
	inflight map[types.UID]bool
	// kicks wakes a cluster when a decision that outlived its pass wants it
	// looked at again.
	kicks chan event.GenericEvent
	// wakeUps are the clusters' wake-up timers (kickAfter), at most one a
	// cluster.
	wakeMu  sync.Mutex
	wakeUps map[types.NamespacedName]*wakeUp
	// owe marks what a wake-up of a cluster is for, before it kicks: the
	// requests to look at, or a full pass (the reconciler's dirtySet).
	owe func(cluster types.NamespacedName, requests map[string]bool, full bool)
	// requesters serializes the decisions of one requester of one cluster
	// across passes (a *sync.Mutex by cluster and spec.username, there
	// only while a pass decides that requester's requests).
	requesters sync.Map
}

// lockRequester takes the lock of a requester's decisions in a cluster, or
// says that another pass holds it. It does not wait: a pass that finds a
// requester busy leaves its requests to a later pass rather than queue a
// goroutine behind it, so that passes during a flood do not pile up. The
// entry is removed at unlock, so that the map holds only the requesters
// being decided (usernames are the requesters' to choose).
func (w *workers) lockRequester(cluster types.NamespacedName, username string) (unlock func(), ok bool) {
	key := cluster.String() + "\x00" + username
	m, _ := w.requesters.LoadOrStore(key, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	if !mu.TryLock() {
		return nil, false
	}
	// The holder before may have removed this entry between the load and
	// the lock, and another pass stored a new one: only the entry in the map
	// is the lock.
	if cur, found := w.requesters.Load(key); !found || cur != m {
		mu.Unlock()
		return nil, false
	}
	return func() {
		w.requesters.CompareAndDelete(key, m)
		mu.Unlock()
	}, true
}

// busyRequesterRecheck is when a pass that found a requester being decided
// by an earlier one looks at its requests again.
const busyRequesterRecheck = time.Second

func newWorkers(n int) *workers {
	return &workers{
		slots: make(chan struct{}, n), inflight: map[types.UID]bool{},
		kicks: make(chan event.GenericEvent, 1024), wakeUps: map[types.NamespacedName]*wakeUp{},
	}
}

// claim marks a request in flight; false when it already is.
func (w *workers) claim(uid types.UID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight[uid] {
		return false
	}
	w.inflight[uid] = true
	return true
}

func (w *workers) release(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, uid)
}

// wakeUp is a cluster's wake-up timer, when it fires, and what it is for:
// the requests whose decisions asked for a look (by name), or the whole
// cluster.
type wakeUp struct {
	at       time.Time
	timer    *time.Timer
	requests map[string]bool
	full     bool
}

// kickAfter wakes the cluster after d to look at the request csr again (the
// whole cluster when csr is ""), or sooner when it is to be woken sooner
// already. A cluster has one wake-up timer, the earliest asked for, which
// carries every request asked for until it fires: each of them is looked at
// then, and one whose wait is not over asks again (the memos keep the
// waits), so the timers are bounded by the clusters, not by the decisions
// that outlive their passes. The requests are marked dirty before the kick
// is sent, so that the reconcile it starts looks at them even if events
// brought others meanwhile; a kick the full channel drops leaves them to
// the cluster's next reconcile.
func (w *workers) kickAfter(cluster types.NamespacedName, d time.Duration, csr string) {
	d = max(d, 0)
	at := time.Now().Add(d)
	w.wakeMu.Lock()
	defer w.wakeMu.Unlock()
	wu := &wakeUp{at: at, requests: map[string]bool{}}
	if cur, ok := w.wakeUps[cluster]; ok {
		if !at.Before(cur.at) {
			cur.add(csr)
			return
		}
		// An earlier one takes the later one's requests over. If the later
		// one is firing already, they are looked at twice, which is harmless.
		cur.timer.Stop()
		maps.Copy(wu.requests, cur.requests)
		wu.full = cur.full
	}
	wu.add(csr)
	wu.timer = time.AfterFunc(d, func() {
		w.wakeMu.Lock()
		if w.wakeUps[cluster] == wu {
			delete(w.wakeUps, cluster)
		}
		requests, full := wu.requests, wu.full
		w.wakeMu.Unlock()
		if w.owe != nil {
			w.owe(cluster, requests, full)
		}
		obj := &ichorv1alpha1.TalosCluster{}
		obj.Namespace, obj.Name = cluster.Namespace, cluster.Name
		select {
		case w.kicks <- event.GenericEvent{Object: obj}:
		default:
			// Full: what the wake-up is for is marked, and the cluster's next
			// reconcile (its requeue is the resync at the latest) sees to it.
		}
	})
	w.wakeUps[cluster] = wu
}

// cancelWakeUp stops the cluster's wake-up (the cluster is gone), so that
// it marks nothing for it afterwards.
func (w *workers) cancelWakeUp(cluster types.NamespacedName) {
	w.wakeMu.Lock()
	defer w.wakeMu.Unlock()
	if cur, ok := w.wakeUps[cluster]; ok {
		cur.timer.Stop()
		delete(w.wakeUps, cluster)
	}
}

func (wu *wakeUp) add(csr string) {
	if csr == "" {
		wu.full = true
		return
	}
	wu.requests[csr] = true
}

// dispatch decides the requests concurrently and waits for them at most
// wait. A decision still running then finishes in the background, with the
// manager's context (sharded: that of this replica's hold on the cluster's
// shard), and what it asks (a retry) becomes a wake-up of the cluster.
//
// Each requester's requests are decided one after the other, oldest first,
// while different requesters' are decided at once: a node credential that
// floods holds one worker at a time, whatever it creates, so the other
// nodes' requests are not held up behind it; and the rule's count of its
// newer undecided requests is exact, so that beyond its limit the oldest are
// denied (without a Talos read) before the newest are decided on their
// merits.
func (p *pass) dispatch(ctx context.Context, csrs []certificatesv1.CertificateSigningRequest, wait time.Duration) {
	var wg sync.WaitGroup
	background := p.r.runCtx
	if p.fence != nil {
		// Sharded: the decisions end when this replica ceases to serve the
		// cluster's shard, those that outlive the pass included.
		background = p.fence.Context()
	}
	if background == nil {
		background = context.WithoutCancel(ctx)
	}
	background = log.IntoContext(background, log.FromContext(ctx))
	for _, group := range byRequester(csrs) {
		// A pass that outlived its wait may still be deciding this
		// requester's older requests: one at a time, across passes. (Decided
		// requests, whose record is all that is left to write, need no lock.)
		unlock := func() {}
		if slices.ContainsFunc(group, undecided) {
			var ok bool
			if unlock, ok = p.r.work.lockRequester(p.key(), group[0].Spec.Username); !ok {
				for _, csr := range group {
					if undecided(csr) {
						p.addPending()
					}
				}
				p.retryIn(busyRequesterRecheck, nil)
				continue
			}
		}
		// Each request is claimed before it waits for a worker: a later pass
		// (every recorded certificate makes one) leaves a request an earlier
		// one holds to it, and looks again soon, rather than queue one more
		// goroutine and copy behind the same busy workers. A full pass holds
		// only its own cluster's requests (requestsToLookAt); one of several
		// clusters (a name no machine answers to) is looked at again by the
		// others within busyRequesterRecheck. The requester's requests are
		// claimed oldest first up to the first another pass holds: that one
		// and the newer ones wait for the next look, so that they are still
		// decided oldest first (the rule counts each one's newer requests).
		claimed := make([]*certificatesv1.CertificateSigningRequest, 0, len(group))
		for _, csr := range group {
			if !p.r.work.claim(csr.UID) {
				break
			}
			claimed = append(claimed, csr)
		}
		if len(claimed) < len(group) {
			for _, csr := range group[len(claimed):] {
				if undecided(csr) {
					p.addPending()
				}
			}
			p.retryIn(busyRequesterRecheck, nil)
		}
		if len(claimed) == 0 {
			unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer unlock()
			for i, csr := range claimed {
				select {
				case p.r.work.slots <- struct{}{}:
				case <-background.Done():
					for _, left := range claimed[i:] {
						p.r.work.release(left.UID)
					}
					return
				}
				// A decision cut short because the shard went (its context
				// ended) is the new holder's to make, not a failure here.
				if err := p.handle(background, csr); err != nil && background.Err() == nil {
					p.failed(background, csr, err)
				}
				<-p.r.work.slots
				p.r.work.release(csr.UID)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		p.detach()
	case <-ctx.Done():
		p.detach()
	}
}

func undecided(csr *certificatesv1.CertificateSigningRequest) bool { return !approval.IsDecided(csr) }

// failed remembers a request whose handling failed, so that it is tried
// again with backoff rather than at every pass: one request whose write the
// API server refuses (too large, invalid) must not cost a decision, a log
// entry and a write every few seconds.
func (p *pass) failed(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, err error) {
	kind := "transient"
	if permanentWrite(err) {
		kind = "permanent"
	}
	p.r.Metrics.failure(kind)
	first, wait := p.r.failures.Pending(p.memoKey(csr), approval.Verdict{}, struct{}{}, p.now, backoff.After)
	log.FromContext(ctx).Error(err, "handle CSR", "csr", csr.Name, "kind", kind, "retry_in", wait)
	var we *writeError
	if first && kind == "permanent" && errors.As(err, &we) && we.machine != nil {
		p.event(we.machine, nil, corev1.EventTypeWarning, "DecisionNotWritten",
			engine.Clip("the decision on CSR "+csr.Name+" could not be written: "+err.Error(), "; it is tried again with backoff, up to every "+maxBackoff.String(), engine.MaxEventNote))
	}
	p.retryIn(wait, csr)
}

// permanentWrite reports whether the API server refused a write for a reason
// that retrying as it is will not change.
func permanentWrite(err error) bool {
	return apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}

// writeError is a decision that could not be written on the request.
type writeError struct {
	err     error
	machine *ichorv1alpha1.TalosMachine
}

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }
