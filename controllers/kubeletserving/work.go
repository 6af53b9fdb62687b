package kubeletserving

import (
	"context"
	"errors"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/engine"
)

// DefaultMaxConcurrentDecisions is the number of decision workers, over
// every cluster: each holds a Talos read, a decision and a write.
const DefaultMaxConcurrentDecisions = 32

// requester is the key of the decision queue: one requester (spec.username)
// of one cluster. The queue hands a key to one worker at a time, so a
// requester's requests are decided one after the other, oldest first, while
// different requesters' are decided at once: a node credential that floods
// holds one worker, whatever it creates, so the other nodes' requests are not
// held up behind it; and the rule's count of its newer undecided requests is
// exact, so that beyond its limit the oldest are denied (without a Talos
// read) before the newest are decided on their merits.
type requester struct {
	cluster  types.NamespacedName
	username string
}

// newQueue is the decision queue: client-go's, deduplicating keys, with the
// backoff of failed keys (the rate limiter) and the wake-ups a decision asks
// (AddAfter, the earliest kept).
func newQueue(clk clock.WithTicker) workqueue.TypedRateLimitingInterface[requester] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[requester](minBackoff, maxBackoff),
		workqueue.TypedRateLimitingQueueConfig[requester]{Name: "kubeletserving_requests", Clock: clk})
}

// enqueue asks for a requester's requests in a cluster to be decided, as
// controller-runtime queues a key on an event: at once, whether or not the key
// is backing off after a failure to list them. An event is never dropped: one
// that comes while the key's turn runs (the retry of a failed list among them)
// turns the key again once that turn is done, so a request the turn listed too
// early to see does not wait for the resync (review 21). What backs off on its
// own is each request that failed (see failed) and a tenant's server that
// stalls (the gate); a key's list fails only in a cache, so an event's turn
// of a key backing off costs what any turn costs before its first request.
func (r *Reconciler) enqueue(key requester) {
	r.queue.Add(key)
}

// workers run the queue's keys, a fixed number at once, until the manager
// stops: then the queue is shut down and they are waited for, so that none
// outlives it.
type workers struct {
	r *Reconciler
	n int
	// leader: without sharding, only the leader decides.
	leader bool
}

// NeedLeaderElection says whether only the leader runs the workers.
func (w workers) NeedLeaderElection() bool { return w.leader }

// Start runs the workers until ctx ends.
func (w workers) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.n {
		wg.Go(func() {
			for w.r.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.r.queue.ShutDown()
	wg.Wait()
	return nil
}

// next decides the next key of the queue; false once the queue is shut down.
func (r *Reconciler) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	if ctx.Err() != nil {
		// Stopping: what is left in the queue is not decided.
		return true
	}
	wait, err := r.decideRequester(ctx, key)
	if err != nil {
		r.queue.AddRateLimited(key)
	} else {
		r.queue.Forget(key)
	}
	if wait > 0 {
		r.queue.AddAfter(key, wait)
	}
	return true
}

// decideRequester gathers, decides, acts and records for each of a
// requester's requests in a cluster, oldest first, and says when to look at
// them again (zero: only on an event), or that they could not be listed (then
// the key backs off). A request whose handling failed waits out its own
// backoff, the others of its requester are decided meanwhile: a request the
// API server refuses for good does not hold up the node's next one, and an
// event does not bring it back early (a decision, a log entry and a refused
// write each time); another bundle does, once, since it may decide
// otherwise. It decides nothing for a cluster this replica does not serve,
// and a decision runs under this replica's hold on the cluster's shard: it
// ends when the shard goes.
func (r *Reconciler) decideRequester(ctx context.Context, key requester) (again time.Duration, _ error) {
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("taloscluster", key.cluster, "requester", key.username))
	p, ok, err := r.passFor(ctx, key.cluster)
	if err != nil || !ok {
		return 0, err
	}
	if p.fence != nil {
		ctx = log.IntoContext(p.fence.Context(), log.FromContext(ctx))
	}
	has := true
	if p.target.gate != nil {
		// A requester the tenant's server has no request of (any more)
		// takes no room among those its gate holds (see tenantGate).
		if has, err = p.hasRequests(ctx, key.username); err != nil {
			return 0, err
		}
	}
	// The tenant's gate before anything else: a requester turned away
	// costs no request to any server.
	ok, probe, wait := p.target.gate.enter(key, has)
	if !ok {
		if notice, maxHeld, maxBytes := p.target.gate.dropNotice(); notice {
			log.FromContext(ctx).Info("the tenant's API server is held back, and so are as many of its requesters as its bound allows: the others come back with the cluster's resync, if they still have a request",
				"maxHeld", maxHeld, "maxHeldBytes", maxBytes)
		}
		return wait, nil
	}
	shard := ctx
	if p.target.watch != nil {
		// A turn ends with its target: through a kubeconfig withdrawn, or
		// a cluster forgotten, nothing more is sent.
		turn, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(p.target.watch, cancel)()
		ctx = turn
	}
	// aborted: the turn ends for a reason of this side, before the
	// server is asked anything; it says nothing about the server.
	aborted := true
	defer func() {
		handBack, wait := p.target.gate.leave(probe, aborted || ctx.Err() != nil)
		for _, k := range handBack {
			r.queue.Add(k)
		}
		if wait > 0 {
			// The cluster's backoff runs: this requester comes back
			// when it ends, not before.
			again = wait
		}
	}()
	if !p.target.local && !r.targetStillAllowed(ctx, p.cluster, p.target) {
		return 0, nil
	}
	aborted = false
	if probe {
		// The try of a server that stalled asks it something cheap
		// first, so that the try says whether it answers. An answer
		// that is an error (a proxy's 503, RBAC's 403) is an answer: the
		// server does not stall, and the turn goes on.
		err := p.target.clientset.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
		var status apierrors.APIStatus
		if err != nil && !errors.As(err, &status) {
			log.FromContext(ctx).Info("the tenant's API server stalled, and does not answer yet", "error", err)
			return 0, nil
		}
		if p.target.gate.halted(true) {
			// It answered, but stalled doing so: the try failed.
			return 0, nil
		}
	}
	csrs, err := p.requestsOf(ctx, key.username)
	if err != nil {
		return 0, err
	}
	epoch, revision := r.machineEpoch.Get(), r.revision()
	for i := range csrs {
		csr := &csrs[i]
		if wait, skip := r.failures.Skip(p.memoKey(csr), csr.ResourceVersion, epoch, revision, p.now); skip {
			p.retryIn(wait)
			continue
		}
		err := p.handle(ctx, csr)
		if shard.Err() != nil {
			// A decision cut short because the shard went (its context
			// ended) is the new holder's to make, not a failure here.
			return 0, nil
		}
		if errors.Is(err, errClusterChanged) {
			// Turned off, deleted or moved since the turn read it: the
			// rest are looked at again through what it is now.
			return p.wait, nil
		}
		if err != nil {
			// Cut short with its target, it is still this replica's: its
			// write may have been applied, and is settled at the next
			// look (through the cluster's next target).
			p.failed(shard, csr, approval.Verdict{ResourceVersion: csr.ResourceVersion, Epoch: epoch, Revision: revision}, err)
			if errors.Is(err, context.DeadlineExceeded) {
				// A request's whole bound ran out, across client-go's
				// own retries: a stall, however quick each round trip.
				p.target.gate.observe(err, nil, r.TenantRequestTimeout)
			}
		}
		if ctx.Err() != nil {
			// The target ended: the rest wait for the cluster's next.
			return 0, nil
		}
		if p.target.gate.halted(probe) {
			// The tenant's server stalls: the rest wait for it, not
			// this worker.
			p.retryIn(minBackoff)
			break
		}
	}
	return p.wait, nil
}

// failed remembers a request whose handling failed on facts, and when to
// look at it again: with backoff, unless it changes (or the machines or the
// bundle do) meanwhile. A write answered with an error may have been applied
// all the same, so its verdict in effect is recorded (settle) at that next
// look.
func (p *pass) failed(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, facts approval.Verdict, err error) {
	kind := "transient"
	if permanentWrite(err) {
		kind = "permanent"
	}
	p.r.Metrics.failure(kind)
	first, wait := p.r.failures.Pending(p.memoKey(csr), facts, struct{}{}, p.now, backoff.After)
	p.retryIn(wait)
	log.FromContext(ctx).Error(err, "handle CSR", "csr", csr.Name, "kind", kind)
	var we *writeError
	if first && kind == "permanent" && errors.As(err, &we) && we.machine != nil {
		// Keyed by the API's reason, a bounded set: a tenant's server that
		// refuses every write of requests it makes up gets one Event a
		// reason on the machine, not one a request (review 204 F3).
		p.event(we.machine, nil, corev1.EventTypeWarning, "DecisionNotWritten", engine.EventAction("Write", string(apierrors.ReasonForError(err))),
			engine.Clip("the decision on CSR "+csr.Name+" could not be written: "+err.Error(), "; it is tried again with backoff, up to every "+maxBackoff.String(), engine.MaxEventNote))
	}
}

// permanentWrite reports whether the API server refused a write for a reason
// that retrying as it is will not change. A 403 on the decision's own write
// is such a reason too until a person acts (the manager's, or a tenant
// kubeconfig's, rights lack approve on the signer; an admission policy
// denies): before 2026-12-06 it was transient, and only the log said so.
// A 403 on a read, and a 401 (a rotated token is read again at the next
// request), stay transient.
func permanentWrite(err error) bool {
	var we *writeError
	return apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		(apierrors.IsForbidden(err) && errors.As(err, &we))
}

// writeError is a decision that could not be written on the request.
type writeError struct {
	err     error
	machine *ichorv1alpha1.TalosMachine
}

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }
