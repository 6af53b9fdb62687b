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

	"github.com/ichor-dev/ichor-policy/engine"
)

// maxLoggedName bounds a name quoted in the manager's log.
const maxLoggedName = 256

// Revocations records the deletions of admin bindings the admin-bindings
// watch sees (controllers/credentials.AdminBindings.Revocations), once the
// binding is gone: with the attempts the webhook kept of its DELETE, which
// name the revoker when one person asked.
type Revocations struct {
	Recorder *Recorder
}

// Revoked records the deletion of b, if it is one of Ichor's admin
// bindings; another labelled binding's deletion is only logged. Attempts
// that cannot be read leave the revoker unknown: the revocation itself is
// recorded all the same.
func (r *Revocations) Revoked(ctx context.Context, b *rbacv1.ClusterRoleBinding) {
	if !IsAdminBinding(b) {
		LogIgnored(ctx, b)
		return
	}
	in := BindingDeletion(b, nil)
	// The DELETEs that count: admitted shortly before the binding was seen
	// gone, or before its deletion was asked for when finalizers held it.
	since := r.Recorder.now()
	if b.DeletionTimestamp != nil && b.DeletionTimestamp.Time.Before(since) {
		since = b.DeletionTimestamp.Time
	}
	attempts, incomplete, err := r.Recorder.RevocationAttempts(ctx, b.UID, since.Add(-RevocationWindow))
	if err != nil {
		log.FromContext(ctx).Error(err, "read the attempts of an admin binding's deletion: the revoker is recorded unknown", "binding", engine.Clip(b.Name, "", maxLoggedName))
		attempts, incomplete = nil, true
	}
	in.Attempts, in.AttemptsIncomplete = attempts, incomplete
	Log(ctx, "binding", b.Name)(r.Recorder.Record(ctx, BindingReference(b), in))
}

// LogIgnored logs, at debug level, the deletion of a labelled binding that
// is not one of Ichor's admin bindings: no revocation, so no record.
func LogIgnored(ctx context.Context, b *rbacv1.ClusterRoleBinding) {
	log.FromContext(ctx).V(1).Info("a labelled ClusterRoleBinding that is not an admin binding of Ichor's was deleted: not recorded as a revocation",
		"binding", engine.Clip(b.Name, "", maxLoggedName), "role", engine.Clip(b.RoleRef.Name, "", maxLoggedName))
}

// Log logs what Record returned; kind and name say what the act was on.
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
