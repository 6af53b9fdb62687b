package manualact

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
)

// maxLoggedName bounds a name quoted in the manager's log.
const maxLoggedName = 256

// Revocations records the deletions of admin bindings the admin-bindings
// watch sees (controllers/credentials.AdminBindings.Revocations), once the
// binding is gone: with the attempts the webhook kept of its DELETE, which
// name the revoker when one person asked.
//
// A record is tried at once, in the caller; one that fails (a read or a
// write of the API server, the records' key, a decision log's sink) is
// tried again by Start's worker, from client-go's rate-limited queue,
// later each time (RetryBase doubled up to RetryMax), until it is made: the binding is
// gone, so nothing lists it again, and a record not tried again is a
// revocation no one can read of (review 240, F3). The attempts are read
// again for up to attemptsPatience, then the revoker is recorded unknown.
// The rule is asked once a revocation: a try after the record's Event
// failed writes the Event alone, unless the record is found marked by then
// (the write stored after all, or another replica's record), and a record
// the rule makes without its documented shape, or whose entry the bundle's
// mask fails on, is not tried again (the input will not change, and such a
// record, logged before it is refused, would be logged at every try).
// What is queued when the manager stops is lost with it, which its log
// says (the webhook's attempt Events still name the DELETE, for an hour).
type Revocations struct {
	Recorder *Recorder

	once    sync.Once
	queue   workqueue.TypedRateLimitingInterface[types.UID]
	mu      sync.Mutex
	pending map[types.UID]*pendingRevocation
	// stopped is set once the worker has said what it leaves unrecorded:
	// a try that fails after it says so itself.
	stopped bool
}

// pendingRevocation is a revocation being recorded: the binding as it was
// last seen, when it was seen gone, its attempts, and the record once the
// rule made it.
type pendingRevocation struct {
	binding *rbacv1.ClusterRoleBinding
	seen    time.Time
	// The attempts the webhook kept, once read (or given up on).
	attemptsRead bool
	attempts     []engine.ManualAttempt
	incomplete   bool
	rec          *engine.ManualRecord
}

// attemptsPatience is how long a revocation's attempts that cannot be read
// hold its record back: past it, the revoker is recorded unknown rather
// than the revocation later still (or never, should the manager stop).
const attemptsPatience = time.Minute

// tryTimeout bounds one try of the worker, which tries every revocation
// in turn: a read that hangs holds back no other for longer.
const tryTimeout = 30 * time.Second

// Revoked records the deletion of b, if it is one of Ichor's admin
// bindings; another labelled binding's deletion is only logged. A record
// that fails is queued for Start's worker; a binding whose record is being
// tried or queued already is left to that.
func (r *Revocations) Revoked(ctx context.Context, b *rbacv1.ClusterRoleBinding) {
	if !IsAdminBinding(b) {
		LogIgnored(ctx, b)
		return
	}
	p := r.begin(b)
	if p == nil {
		return
	}
	if err := r.try(ctx, p); err != nil {
		r.failed(ctx, b.UID, p, err)
		return
	}
	r.end(b.UID)
}

// Start tries the failed records again until ctx ends. It runs on every
// replica: the webhook's replicas record too.
func (r *Revocations) Start(ctx context.Context) error {
	q := r.workQueue()
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	logger := log.FromContext(ctx).WithValues("controller", "admin-revocations")
	for {
		uid, shutdown := q.Get()
		if shutdown {
			r.unrecorded(logger)
			return nil
		}
		r.mu.Lock()
		p := r.pending[uid]
		r.mu.Unlock()
		if p != nil {
			tryCtx, cancel := context.WithTimeout(log.IntoContext(ctx, logger), tryTimeout)
			if err := r.try(tryCtx, p); err != nil {
				r.failed(tryCtx, uid, p, err)
			} else {
				r.end(uid)
			}
			cancel()
		}
		q.Done(uid)
	}
}

// unrecorded says, as the manager stops, which revocations it could not
// record: no one else will (the bindings are gone), so the operator reads
// them here, and the DELETEs in the API server's audit log.
func (r *Revocations) unrecorded(logger logr.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, p := range r.pending {
		logUnrecorded(logger, p)
	}
}

func logUnrecorded(logger logr.Logger, p *pendingRevocation) {
	identity, _ := credentials.AdminBindingIdentity(p.binding)
	logger.Error(nil, "the manager stops before it could record an admin binding's revocation (unless a try under way still makes it): it is not recorded; the API server's audit log has the DELETE",
		"binding", engine.Clip(p.binding.Name, "", maxLoggedName), "identity", engine.Clip(identity, "", maxLoggedName), "seen_gone", p.seen)
}

// NeedLeaderElection is false: the webhook of every replica records.
func (r *Revocations) NeedLeaderElection() bool { return false }

func (r *Revocations) workQueue() workqueue.TypedRateLimitingInterface[types.UID] {
	r.once.Do(func() {
		r.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](RetryBase, RetryMax),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "admin-revocations"})
	})
	return r.queue
}

// begin makes the pending revocation of b, or returns nil when one is
// being tried or queued already (the first copy seen is recorded).
func (r *Revocations) begin(b *rbacv1.ClusterRoleBinding) *pendingRevocation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pending[b.UID]; ok {
		return nil
	}
	if r.pending == nil {
		r.pending = map[types.UID]*pendingRevocation{}
	}
	p := &pendingRevocation{binding: b, seen: r.Recorder.now()}
	r.pending[b.UID] = p
	return p
}

// failed queues the revocation again, later, unless err says it never can
// be recorded.
func (r *Revocations) failed(ctx context.Context, uid types.UID, p *pendingRevocation, err error) {
	logger := log.FromContext(ctx)
	if errors.Is(err, reconcile.TerminalError(nil)) {
		logger.Error(err, "record an admin binding's revocation: not tried again", "binding", engine.Clip(p.binding.Name, "", maxLoggedName))
		r.end(uid)
		return
	}
	// Under the lock unrecorded holds: a failure queued while the worker
	// stops is said by it (a queue shut down drops what is added), one
	// after it, here.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		logger.Error(err, "record an admin binding's revocation", "binding", engine.Clip(p.binding.Name, "", maxLoggedName))
		logUnrecorded(logger, p)
		delete(r.pending, uid)
		return
	}
	logger.Error(err, "record an admin binding's revocation: tried again later", "binding", engine.Clip(p.binding.Name, "", maxLoggedName))
	r.workQueue().AddRateLimited(uid)
}

func (r *Revocations) end(uid types.UID) {
	r.mu.Lock()
	delete(r.pending, uid)
	r.mu.Unlock()
	r.workQueue().Forget(uid)
}

// try records the revocation: the rule's record (once), then its Event.
func (r *Revocations) try(ctx context.Context, p *pendingRevocation) error {
	b := p.binding
	regarding := BindingReference(b)
	if regarding.UID == "" {
		return reconcile.TerminalError(errors.New("the binding has no UID to record the act under"))
	}
	var key []byte
	if r.Recorder.Keys != nil {
		var err error
		if key, err = r.Recorder.Keys.Key(ctx); err != nil {
			return fmt.Errorf("the records' key: %w", err)
		}
	}
	// Marked already: by another replica's record, or, on a try after
	// the record's Event failed, by that write stored all the same (a
	// timeout).
	if key != nil {
		if recorded, err := r.Recorder.recorded(ctx, key, regarding.UID, engine.ActionRevoke); err != nil || recorded != "" {
			return err
		}
	}
	if p.rec == nil {
		if err := r.readAttempts(ctx, p); err != nil {
			return err
		}
		in := BindingDeletion(b, nil)
		in.Attempts, in.AttemptsIncomplete = p.attempts, p.incomplete
		rec, err := r.Recorder.evaluate(ctx, &in)
		switch {
		case errors.Is(err, engine.ErrRecordShape) || errors.Is(err, engine.ErrEntryNotLogged):
			return reconcile.TerminalError(err)
		case err != nil || rec == nil:
			return err
		}
		p.rec = rec
		Log(ctx, "binding", b.Name)(rec, nil)
	}
	if err := r.Recorder.event(ctx, key, regarding, engine.ActionRevoke, *p.rec); err != nil {
		return fmt.Errorf("the record's Event: %w", err)
	}
	return nil
}

// readAttempts reads the DELETEs the webhook kept of the binding's deletion
// that count: admitted shortly before the binding was seen gone, or before
// its deletion was asked for when finalizers held it. Those that cannot be
// read are an error for attemptsPatience, then leave the revoker unknown.
func (r *Revocations) readAttempts(ctx context.Context, p *pendingRevocation) error {
	if p.attemptsRead {
		return nil
	}
	b := p.binding
	since := p.seen
	if b.DeletionTimestamp != nil && b.DeletionTimestamp.Time.Before(since) {
		since = b.DeletionTimestamp.Time
	}
	attempts, incomplete, err := r.Recorder.RevocationAttempts(ctx, b.UID, since.Add(-RevocationWindow))
	if err != nil {
		if r.Recorder.now().Sub(p.seen) < attemptsPatience {
			return fmt.Errorf("read the attempts of its deletion: %w", err)
		}
		log.FromContext(ctx).Error(err, "read the attempts of an admin binding's deletion: the revoker is recorded unknown", "binding", engine.Clip(b.Name, "", maxLoggedName))
		attempts, incomplete = nil, true
	}
	p.attemptsRead, p.attempts, p.incomplete = true, attempts, incomplete
	return nil
}

// LogIgnored logs, at debug level, the deletion of a labelled binding that
// is not one of Ichor's admin bindings: no revocation, so no record.
func LogIgnored(ctx context.Context, b *rbacv1.ClusterRoleBinding) {
	log.FromContext(ctx).V(1).Info("a labelled ClusterRoleBinding that is not an admin binding of Ichor's was deleted: not recorded as a revocation",
		"binding", engine.Clip(b.Name, "", maxLoggedName), "role", engine.Clip(b.RoleRef.Name, "", maxLoggedName))
}

// Log logs a record, or the error of making it; kind and name say what the
// act was on.
// Every string is cut: the actor is as long as the cluster's authenticator
// makes it.
func Log(ctx context.Context, kind, name string) func(*engine.ManualRecord, error) {
	return func(rec *engine.ManualRecord, err error) {
		logger := log.FromContext(ctx).WithValues(kind, engine.Clip(name, "", maxLoggedName))
		if rec != nil {
			logger = logger.WithValues("decision_id", rec.DecisionID, "action", rec.Action, "actor", engine.Clip(rec.Actor, "", maxLoggedName))
		}
		if err != nil {
			logger.Error(err, "record a person's act")
			return
		}
		if rec != nil {
			logger.Info("recorded a person's act", "kind", rec.Kind, "actor_source", rec.ActorSource)
		}
	}
}

// ReadsAsIchors reports whether a condition's message ends as an approver's
// does, with a decision id and a policy revision: the watch takes such a
// condition as Ichor's own and records no person's act. The webhook refuses a
// person's write of one (review 4, R1), so that a person cannot pass their
// decision off as Ichor's while the webhook runs.
func ReadsAsIchors(message string) bool {
	_, ok := engine.DecisionOfMessage(message)
	return ok
}

// CSRDecisions watches the requests of the signers Ichor decides and records
// each decision that Ichor's approvers did not write, as it is stored: the
// request seen going from undecided to decided, with the attempts the
// webhook kept from the version the stored write replaced (the informer's
// old object), from which the rule names who acted, or says the actor is
// unknown. A request the watch first sees already decided (the requests it
// lists as it starts: after a leader change or a restart, when no manager
// watched the change) is recorded too, unless its mark is there: the actor
// unknown, as the version the write replaced is not known. That costs, as
// the watch starts, one GET of a mark per request of those signers decided
// by someone other than Ichor (the API server's kube-controller-manager
// deletes decided requests after an hour or two). A condition that reads as
// an approver's (its message ends with the decision and the policy
// revision) is taken as Ichor's own, so a person's attempt that lost to it
// is no record at all.
//
// The handlers only queue the decision, keyed by the request's UID and the
// verdict; the record is made by the controller's worker, from client-go's
// rate-limited work queue, which tries it again, later each time (up to
// RetryMax apart), for as long as a read, the rule or a write fails
// (review 4, R3): an act is recorded once it can be, and never twice by one
// manager. What a manager has queued and not recorded when it stops, the
// next leader's watch finds decided, unmarked, as it starts.
type CSRDecisions struct {
	Recorder *Recorder
	// Signers are the signers whose requests Ichor decides here.
	Signers []string

	mu       sync.Mutex
	pending  map[decisionKey]*pendingDecision
	requests client.Reader
}

// The delays between the tries of one record: from RetryBase, doubled each
// time, up to RetryMax.
const (
	RetryBase = 200 * time.Millisecond
	RetryMax  = 5 * time.Minute
)

// SetupWithManager registers the watch (leader-elected, as the approvers).
func (c *CSRDecisions) SetupWithManager(mgr ctrl.Manager) error {
	if c.Recorder == nil || c.Recorder.Engine == nil {
		return errors.New("manual decisions watch: no recorder")
	}
	h := handler.TypedFuncs[*certificatesv1.CertificateSigningRequest, decisionKey]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[*certificatesv1.CertificateSigningRequest], q workqueue.TypedRateLimitingInterface[decisionKey]) {
			if c.foundDecidedByHand(e.Object) {
				c.enqueue(q, nil, e.Object)
			}
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*certificatesv1.CertificateSigningRequest], q workqueue.TypedRateLimitingInterface[decisionKey]) {
			if c.decidedByHand(e.ObjectOld, e.ObjectNew) {
				c.enqueue(q, e.ObjectOld, e.ObjectNew)
			}
		},
	}
	c.requests = mgr.GetCache()
	const name = "manual-decisions"
	logger := mgr.GetLogger().WithValues("controller", name)
	return builder.TypedControllerManagedBy[decisionKey](mgr).
		Named(name).
		WithOptions(controller.TypedOptions[decisionKey]{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[decisionKey](RetryBase, RetryMax),
		}).
		WithLogConstructor(func(k *decisionKey) logr.Logger {
			if k == nil {
				return logger
			}
			return logger.WithValues("csr_uid", k.UID, "verdict", k.Verdict)
		}).
		WatchesRawSource(source.TypedKind(mgr.GetCache(), &certificatesv1.CertificateSigningRequest{}, h)).
		Complete(reconcile.TypedFunc[decisionKey](c.reconcile))
}

// enqueue queues the decision csr holds. A decision queued already keeps
// what it got so far: one act, one record.
func (c *CSRDecisions) enqueue(q workqueue.TypedRateLimitingInterface[decisionKey], old, csr *certificatesv1.CertificateSigningRequest) {
	k := decisionKey{UID: csr.UID, Verdict: string(decision(csr).Type)}
	c.mu.Lock()
	if c.pending == nil {
		c.pending = map[decisionKey]*pendingDecision{}
	}
	if _, ok := c.pending[k]; !ok {
		c.pending[k] = &pendingDecision{old: old, csr: csr}
	}
	c.mu.Unlock()
	q.Add(k)
}

// reconcile records the decision queued under k; an error queues it again,
// rate-limited. The queue hands one key to one worker at a time.
func (c *CSRDecisions) reconcile(ctx context.Context, k decisionKey) (reconcile.Result, error) {
	c.mu.Lock()
	p := c.pending[k]
	c.mu.Unlock()
	if p == nil {
		return reconcile.Result{}, nil
	}
	if err := c.Recorder.recordDecision(ctx, p, c.requests); err != nil {
		if errors.Is(err, reconcile.TerminalError(nil)) {
			c.forget(k) // not tried again
		}
		return reconcile.Result{}, fmt.Errorf("record the decision by hand on %s: %w", engine.Clip(p.csr.Name, "", maxLoggedName), err)
	}
	c.forget(k)
	return reconcile.Result{}, nil
}

func (c *CSRDecisions) forget(k decisionKey) {
	c.mu.Lock()
	delete(c.pending, k)
	c.mu.Unlock()
}

// decidedByHand reports whether the update decided a request of Ichor's
// signers with a condition that is not an approver's.
func (c *CSRDecisions) decidedByHand(old, csr *certificatesv1.CertificateSigningRequest) bool {
	return old != nil && decision(old) == nil && c.foundDecidedByHand(csr)
}

// foundDecidedByHand reports whether the request is one of Ichor's
// signers', decided by a condition that is not an approver's. Seen so at
// once (an Add: the API server drops a request's status when it is
// created), it was decided before the watch began.
func (c *CSRDecisions) foundDecidedByHand(csr *certificatesv1.CertificateSigningRequest) bool {
	if csr == nil || !slices.Contains(c.Signers, csr.Spec.SignerName) {
		return false
	}
	d := decision(csr)
	return d != nil && !ReadsAsIchors(d.Message)
}

// decision is the request's Approved or Denied condition, or nil.
func decision(csr *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	for i, c := range csr.Status.Conditions {
		if (c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied) && c.Status == corev1.ConditionTrue {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}
