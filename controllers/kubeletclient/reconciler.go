// Package kubeletclient is the approver of kubelet client certificates: the
// CertificateSigningRequests of the signer
// kubernetes.io/kube-apiserver-client-kubelet, which a kubelet makes with its
// bootstrap token to join and with its own certificate to renew it.
//
// It does what kube-controller-manager's csrapproving controller does
// (pkg/controller/certificates/approver/sarapprove.go), with the decision in
// Rego (policy/ichor/kubelet_client) and written to the decision log. For
// each undecided request it gathers the facts: the parsed request
// (csrinput.Build), the answers of the two SubjectAccessReviews made as the
// requester ("create certificatesigningrequests/selfnodeclient" and
// ".../nodeclient" in certificates.k8s.io), and the managed machine with the
// request's node name, if any. It asks the engine and acts: it approves, or
// leaves the request pending. It never denies (the engine refuses a bundle
// whose rule does), never touches another signer and never deletes a request.
//
// The reconciler is keyed by CSR. A pending verdict is remembered by the
// request's UID and resourceVersion, so a request that nothing changed is not
// decided again in a loop; but the answer of a SubjectAccessReview changes
// with RBAC, which this controller does not watch, so a pending request is
// decided again on a slow timer (RecheckInterval, doubling up to
// MaxRecheckInterval), and at once when a machine with its node name changes.
package kubeletclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// SignerName is the only signer whose requests this controller decides.
const SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName

// ApprovalReason is the reason of the Approved condition this controller
// writes, so a person can tell its approvals from kube-controller-manager's
// (AutoApproved) or anyone else's.
const ApprovalReason = "IchorKubeletClient"

// Defaults of the re-check of pending requests. A request is pending either
// because it is not a kubelet client request (nothing will change that) or
// because its requester lacks the permission (an RBAC change fixes it, and the
// kubelet keeps waiting for its request meanwhile): 30s is soon enough for a
// person who has just added a binding, and the backoff bounds the cost of the
// first kind to two SubjectAccessReviews every MaxRecheckInterval.
const (
	DefaultRecheckInterval    = 30 * time.Second
	DefaultMaxRecheckInterval = 5 * time.Minute
)

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=kubernetes.io/kube-apiserver-client-kubelet,verbs=approve
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosmachines,verbs=get;list;watch

// Decider is what the approver asks of the policy engine: *engine.Engine,
// or a test's (engine/enginetest).
type Decider interface {
	KubeletClient(context.Context, csrinput.KubeletClient) (engine.CSRDecision, error)
	RecordApplied(ctx context.Context, a engine.Applied) error
}

// Reconciler approves kubelet client certificates.
type Reconciler struct {
	// Client reads CSRs, TalosMachines and TalosClusters from the cache.
	Client client.Client
	// Clientset reads requests afresh and writes approvals (the approval
	// subresource); the SubjectAccessReviews go through Client.
	Clientset kubernetes.Interface
	Engine    Decider
	// LocalClusters are the clusters whose machines may be this API
	// server's nodes; any other cluster's machines are not.
	LocalClusters *cluster.Local

	// RecheckInterval is the first wait before a pending request is decided
	// again; each further pending verdict doubles it, up to
	// MaxRecheckInterval. Zero means the defaults.
	RecheckInterval    time.Duration
	MaxRecheckInterval time.Duration
	// Clock is the clock; the real one if nil.
	Clock clock.PassiveClock
	// Recorder writes the Event of a recognized request first left
	// pending; none when nil.
	Recorder events.EventRecorder

	// memo keeps the verdicts on undecided requests, keyed by UID, with the
	// request's name and node name, so that a request is decided again only
	// when it, the machines or the bundle changed, or its re-check is due.
	memo approval.Memo[types.UID, pendingRequest]
	// rebundle reconciles every undecided request when another bundle is
	// activated (BundleActivated).
	rebundle *approval.Rebundle
	// machineEpoch counts the changes of machines and clusters that change
	// which machine a node name finds: a remembered verdict holds only in the
	// epoch it was reached in.
	machineEpoch approval.Epoch
	// unrecorded are the requests whose approval written here may be in
	// effect without its applied record: a write answered with an error
	// that may have been applied all the same, or a record the decision log
	// refused. Once decided, the request's next look records the decision
	// its condition names (observed). Before, a write answered with a
	// timeout that was applied was never recorded, and a refused record
	// only logged.
	unrecorded approval.Uncertain[requestKey]
}

// requestKey names a request by its name and uid: the uid tells a request
// from another of the same name, and the name finds what is left of one
// deleted.
type requestKey struct {
	name string
	uid  types.UID
}

// recordRetry is the wait before a refused record is tried again.
const recordRetry = 5 * time.Second

// SetupOptions are the choices of SetupWithManager.
type SetupOptions struct {
	// NodeNameIndexRegistered says that the machine index this controller
	// queries, machines.IndexNodeName, is already registered on the
	// manager's field indexer (the serving approver's SetupWithManager
	// registers it). When false, SetupWithManager registers it;
	// registering an index twice fails, so a manager running both approvers
	// sets up the serving one first and passes true here.
	NodeNameIndexRegistered bool
}

// SetupWithManager registers the reconciler, and the indexes unless opts
// says they are registered.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts SetupOptions) error {
	if r.RecheckInterval <= 0 {
		r.RecheckInterval = DefaultRecheckInterval
	}
	if r.MaxRecheckInterval <= 0 {
		r.MaxRecheckInterval = DefaultMaxRecheckInterval
	}
	r.MaxRecheckInterval = max(r.MaxRecheckInterval, r.RecheckInterval)
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if !opts.NodeNameIndexRegistered {
		if err := machines.AddNodeNameIndex(ctx, mgr.GetFieldIndexer()); err != nil {
			return err
		}
	}
	r.rebundle = approval.NewRebundle(r.Engine)
	return ctrl.NewControllerManagedBy(mgr).
		Named("kubeletclient").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(predicate.NewPredicateFuncs(isKubeletClient), changedForTheRule())).
		WatchesRawSource(r.rebundle.Source(func(context.Context) []reconcile.Request { return r.waiting() })).
		Watches(&ichorv1alpha1.TalosMachine{}, enqueueNoting(r.machineToRequests)).
		Watches(&ichorv1alpha1.TalosCluster{}, enqueueNoting(r.clusterToRequests),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// BundleActivated tells the approver of the bundle now in service: another
// one than the last has every undecided request it remembers decided again
// at once, rather than at its next recheck.
func (r *Reconciler) BundleActivated(revision string) {
	r.rebundle.Activated(revision)
}

func isKubeletClient(obj client.Object) bool {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	return ok && csr.Spec.SignerName == SignerName
}

// enqueueNoting enqueues the requests toRequests names for an object's
// event, telling it whether the object was deleted (so that the epoch
// forgets it).
func enqueueNoting(toRequests func(obj client.Object, deleted bool) []reconcile.Request) handler.Funcs {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	add := func(q queue, obj client.Object, deleted bool) {
		for _, req := range toRequests(obj, deleted) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q queue) { add(q, e.Object, false) },
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q queue) {
			if e.ObjectOld.GetUID() != e.ObjectNew.GetUID() {
				// Deleted and made again under its name while the watch
				// was down: the informer's relist tells it as an update.
				add(q, e.ObjectOld, true)
			}
			add(q, e.ObjectNew, false)
		},
		DeleteFunc:  func(_ context.Context, e event.DeleteEvent, q queue) { add(q, e.Object, true) },
		GenericFunc: func(_ context.Context, e event.GenericEvent, q queue) { add(q, e.Object, false) },
	}
}

// note notes an object's state in the machine epoch, and forgets a deleted
// one (Epoch.Forget); it reports whether the state changed.
func (r *Reconciler) note(uid types.UID, state string, deleted bool) bool {
	if deleted {
		return r.machineEpoch.Forget(uid, state)
	}
	return r.machineEpoch.Note(uid, state)
}

// machineToRequests wakes the pending requests for the machine's node names
// when they are a new fact: a machine that appears, or changes the names it
// answers to or its cluster. A status update that leaves them alone (a
// recorded serving certificate) changes nothing here, nor does a deletion.
func (r *Reconciler) machineToRequests(obj client.Object, deleted bool) []reconcile.Request {
	m, ok := obj.(*ichorv1alpha1.TalosMachine)
	if !ok {
		return nil
	}
	key := m.Namespace + "/" + m.Spec.ClusterName + "/" + m.Status.NodeName + "/" + m.Spec.Hostname
	if !r.note(m.UID, key, deleted) {
		return nil
	}
	return r.waiting(m.Status.NodeName, m.Spec.Hostname)
}

// clusterToRequests wakes every pending request when a cluster begins or
// ceases to judge this API server (named in --local-clusters, without
// spec.kubeconfigRef), which says whether its machines are this API
// server's nodes. Such changes are rare, and pending requests few. A cluster
// that judges nothing changes no lookup, however often it is made, changed
// or deleted: a tenant doing so in a loop wakes nothing (review of
// 2026-12-05; before, each woke every pending request: two
// SubjectAccessReviews and a logged decision each).
func (r *Reconciler) clusterToRequests(obj client.Object, deleted bool) []reconcile.Request {
	c, ok := obj.(*ichorv1alpha1.TalosCluster)
	if !ok {
		return nil
	}
	var changed bool
	switch judges := r.judgesHere(c); {
	case judges:
		changed = r.note(c.UID, "judges", deleted)
	default:
		changed = r.machineEpoch.Drop(c.UID)
	}
	if !changed {
		return nil
	}
	return r.waiting()
}

// Reconcile decides one request while it is undecided.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("csr", req.Name)
	ctx = log.IntoContext(ctx, logger)

	var csr certificatesv1.CertificateSigningRequest
	if err := r.Client.Get(ctx, req.NamespacedName, &csr); err != nil {
		if apierrors.IsNotFound(err) {
			r.memo.ForgetIf(func(_ types.UID, p pendingRequest) bool { return p.name == req.Name }, math.MaxUint64)
			return r.recordOwed(ctx, r.unrecorded.ForgetIf(func(k requestKey) bool { return k.name == req.Name }, math.MaxUint64)), nil
		}
		return reconcile.Result{}, fmt.Errorf("get CSR: %w", err)
	}
	if !isKubeletClient(&csr) {
		return reconcile.Result{}, nil
	}
	key := requestKey{name: csr.Name, uid: csr.UID}
	// A request of the same name made again (bootstrap requests are named
	// after their key and subject) leaves what the one before owed.
	if result := r.recordOwed(ctx, r.unrecorded.ForgetIf(func(k requestKey) bool { return k.name == csr.Name && k.uid != csr.UID }, math.MaxUint64)); result.RequeueAfter > 0 {
		return result, nil
	}
	// stale is the version the cache shows when the API server showed the
	// request decided at another: the cache has not caught up.
	var stale string
	if w, ok := r.unrecorded.Get(key); ok && !approval.IsDecided(&csr) {
		// A write of it may have been applied: the API server says, not
		// the cache, which may not show the write yet (deciding again
		// from the cache would log a second verdict).
		live, err := r.Clientset.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && live.UID != csr.UID):
			w, _ := r.unrecorded.Take(key)
			return r.recordOwed(ctx, map[requestKey]approval.UncertainWrite{key: w}), nil
		case err != nil:
			return reconcile.Result{}, fmt.Errorf("read CSR %s again after a write of unknown outcome: %w", csr.Name, err)
		}
		if approval.IsDecided(live) {
			stale = csr.ResourceVersion
		}
		csr = *live
		if !approval.IsDecided(&csr) && w.CannotCommit(csr.ResourceVersion, r.Clock.Now()) {
			r.unrecorded.Take(key)
		}
	}
	if len(csr.Status.Certificate) > 0 || approval.IsDecided(&csr) {
		r.memo.Forget(csr.UID)
		if stale != "" {
			// Until the cache shows the decision, its older version is
			// not decided again (a second verdict in the log).
			r.memo.Applied(csr.UID, stale, pendingRequest{name: csr.Name})
		}
		return r.recordObserved(ctx, &csr)
	}

	now := r.Clock.Now()
	// Both taken before the decision: a change meanwhile makes the verdict
	// remembered below one to reach again.
	epoch, revision := r.machineEpoch.Get(), approval.ActiveRevision(r.Engine)
	if wait, skip := r.memo.Skip(csr.UID, csr.ResourceVersion, epoch, revision, now); skip {
		return reconcile.Result{RequeueAfter: wait}, nil
	}

	node := csrinput.NodeName(&csr)
	in := csrinput.KubeletClient{CSR: csrinput.Build(&csr)}
	var err error
	if in.Authorization, err = r.authorization(ctx, &csr); err != nil {
		return reconcile.Result{}, err
	}
	machine, err := r.machineFor(ctx, node)
	if err != nil {
		return reconcile.Result{}, err
	}
	if machine != nil {
		in.Machine = &csrinput.Machine{Name: machine.Name, Namespace: machine.Namespace, Cluster: machine.Spec.ClusterName}
	}

	if ctx.Err() != nil {
		// Stopping: no verdict is reached, nor logged, that would not be
		// written; the next leader decides the request.
		logger.V(1).Info("not decided: the manager is stopping")
		return reconcile.Result{}, nil
	}
	d, err := r.Engine.KubeletClient(ctx, in)
	if errors.Is(err, engine.ErrNoDecision) {
		// The rule does not govern this request: it is asked again on a
		// pending request's recheck, and at once when the request, the
		// machines or the bundle change, and is remembered so that another
		// bundle's activation, which may govern it, wakes it
		// (BundleActivated). Not only on a change: the rule may leave it out
		// on what the memo does not key on (the SubjectAccessReviews).
		_, wait := r.memo.Pending(csr.UID, approval.Verdict{ResourceVersion: csr.ResourceVersion, Epoch: epoch, Revision: revision, Key: engine.ActionNone},
			pendingRequest{name: csr.Name, node: node}, now, approval.Backoff{Initial: r.RecheckInterval, Max: r.MaxRecheckInterval}.After)
		return r.againIfRebundled(revision, reconcile.Result{RequeueAfter: wait}), nil
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("decide CSR %s: %w", csr.Name, err)
	}
	logger = logger.WithValues("node", d.Node, "kind", d.Kind, "action", d.Action, "codes", d.Reasons.Codes(),
		"decision_id", d.DecisionID, "revision", d.Revision)
	if len(d.Reasons) == 0 {
		// The engine refuses such answers of a broken bundle; whatever
		// decides here must not be trusted further than that.
		return reconcile.Result{}, fmt.Errorf("decision %s on CSR %s gives no reason: nothing done", d.DecisionID, csr.Name)
	}

	switch d.Action {
	case engine.ActionApprove:
		if ctx.Err() != nil {
			// Stopping: a write not begun is the next leader's to make.
			logger.V(1).Info("not written: the manager is stopping")
			return reconcile.Result{}, nil
		}
		// Begun, the write is finished and recorded even if the manager
		// stops meanwhile (within approval.FinishGrace): no other replica
		// records a verdict of this one's, so a write cut short that the
		// API server applied would be in effect without its record. The
		// leader Lease is let go once this returns.
		ctx, cancel := approval.Finishing(ctx, approval.FinishGrace)
		defer cancel()
		if err := approval.Approve(ctx, r.Clientset, &csr, ApprovalReason, d.ConditionMessage(), now); err != nil {
			var unknown *approval.UnknownOutcome
			if errors.As(err, &unknown) {
				written := engine.Applied{DecisionID: d.DecisionID, Object: "csr/" + csr.Name, UID: string(csr.UID), Action: d.Action, Outcome: engine.AppliedWritten}
				w := approval.UncertainWrite{ResourceVersion: unknown.ResourceVersion, At: r.Clock.Now(), Written: []engine.Applied{written}}
				earlier, hadEarlier := r.unrecorded.Get(key)
				r.unrecorded.Add(key, w.After(earlier, hadEarlier))
			}
			if errors.Is(err, approval.ErrDecidedMeanwhile) {
				// kube-controller-manager's approver beside Ichor (or a
				// person, or the leader before) decided it first: no
				// longer Ichor's, and no failure (review 177).
				logger.V(1).Info("not written: another writer decided the request meanwhile")
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, err
		}
		// Written on the version read: an earlier write of unknown
		// outcome can no longer commit.
		r.unrecorded.Take(key)
		r.memo.Applied(csr.UID, csr.ResourceVersion, pendingRequest{name: csr.Name, node: node})
		logger.Info("approved kubelet client certificate")
		owed := engine.Applied{DecisionID: d.DecisionID, Object: "csr/" + csr.Name, UID: string(csr.UID), Action: d.Action, Outcome: engine.AppliedWritten}
		if err := r.Engine.RecordApplied(ctx, owed); err != nil {
			logger.Error(err, "record the applied decision; tried again", "retry_in", recordRetry)
			r.unrecorded.Add(key, approval.UncertainWrite{At: r.Clock.Now(), Record: &owed})
			return reconcile.Result{RequeueAfter: recordRetry}, nil
		}
		// No Event: the Approved condition and the decision log say it.
		return reconcile.Result{}, nil
	default: // engine.ActionPending: the engine refuses any other answer of this rule.
		verdict := approval.Verdict{ResourceVersion: csr.ResourceVersion, Epoch: epoch, Revision: revision, Key: d.Action + ":" + strings.Join(d.Reasons.Codes(), ",")}
		recheck := approval.Backoff{Initial: r.RecheckInterval, Max: r.MaxRecheckInterval}.After
		if d.Action == engine.ActionPending && (d.Kind == "" || slices.ContainsFunc(d.Reasons.Codes(), requestBound)) {
			// Not recognized: the rule's contract is that recognition
			// reads the request alone, never the SubjectAccessReviews, so
			// only a change of the request, its machine or the bundle,
			// each of which wakes it, can change it. Rechecked seldom: a
			// flood of such requests from a bootstrap token cost two
			// reviews and an entry each every few minutes for a day
			// (review 158). Still rechecked, in case a bundle of the key
			// holder's reads the reviews into its kind after all (review
			// 160). An answer the rule never gives (a deny) keeps the
			// usual recheck. So is a request recognized but held by a
			// reason that reads the request alone (review 243 F4).
			recheck = func(int) time.Duration { return unrecognizedRecheck * r.MaxRecheckInterval }
		}
		first, wait := r.memo.Pending(csr.UID, verdict, pendingRequest{name: csr.Name, node: node}, now, recheck)
		if first {
			logger.Info("left kubelet client certificate pending", "reasons", d.Reasons.String(), "recheck_in", wait)
			r.pendingEvent(&csr, machine, d)
		} else {
			logger.V(1).Info("kubelet client certificate still pending", "recheck_in", wait)
		}
		return r.againIfRebundled(revision, reconcile.Result{RequeueAfter: wait}), nil
	}
}

// ReasonPending is the reason of the Event of a kubelet client request the
// rule recognized and left pending.
const ReasonPending = "KubeletClientPending"

// pendingEvent writes, on the request, where `kubectl describe csr` shows it,
// why the rule left a request it recognized pending (the requester may not
// create it, the machine is unknown, the key is not allowed...), once for
// each new verdict: the request stays Pending with nothing on it, and the node
// never joins, with the reason only in the logs (review 225 F2). A request the
// rule does not recognize (Kind "") is no kubelet's, and whoever holds a
// bootstrap token can make as many as they like: no Event for it.
func (r *Reconciler) pendingEvent(csr *certificatesv1.CertificateSigningRequest, machine *ichorv1alpha1.TalosMachine, d engine.CSRDecision) {
	if r.Recorder == nil || d.Kind == "" {
		return
	}
	var related runtime.Object
	if machine != nil {
		related = machine
	}
	r.Recorder.Eventf(csr, related, corev1.EventTypeWarning, ReasonPending, engine.EventAction("Decide", d.Reasons.Codes()...), "%s", d.EventNote())
}

// requestBound reports whether a reason's code is one the rule gives from
// the request alone, whatever the SubjectAccessReviews say: the key table's
// (a weak key) and the subject guard's. No binding can lift it, so a
// request held by one is rechecked as seldom as one not recognized: a
// bootstrap token's flood of weak-key requests cost two reviews, an entry
// and an Event each every few minutes for a day (review 243 F4).
func requestBound(code string) bool {
	return code == "PublicKeyNotAllowed" || code == "PrivilegedSubject"
}

// unrecognizedRecheck is how many longest rechecks apart a request the rule
// does not recognize is decided again when nothing changed: two hours at the
// default five minutes.
const unrecognizedRecheck = 24

// againIfRebundled is result, or a look again at once when another bundle
// was activated while the request was decided under revision: the wake of
// that activation listed the requests remembered then, and this one was not
// yet (its verdict, remembered under the old revision, is reached again).
func (r *Reconciler) againIfRebundled(revision string, result reconcile.Result) reconcile.Result {
	if approval.ActiveRevision(r.Engine) != revision {
		return reconcile.Result{RequeueAfter: time.Millisecond}
	}
	return result
}

// recordObserved records, for a decided request whose approval written here
// may be in effect without its record, the decision its condition names; a
// record refused is tried again after recordRetry.
func (r *Reconciler) recordObserved(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (reconcile.Result, error) {
	key := requestKey{name: csr.Name, uid: csr.UID}
	w, ok := r.unrecorded.Take(key)
	if !ok {
		return reconcile.Result{}, nil
	}
	var observed engine.Applied
	if w.Record != nil {
		// Its own write's record, refused before: what it wrote, whatever
		// the condition is read to say.
		observed = *w.Record
	} else {
		if observed, ok = w.Observed(csr); !ok {
			// Decided by a person, or by another approver: nothing of
			// this one's to record.
			return reconcile.Result{}, nil
		}
	}
	if err := r.Engine.RecordApplied(ctx, observed); err != nil {
		log.FromContext(ctx).Error(err, "record the applied decision; tried again", "decision_id", observed.DecisionID, "retry_in", recordRetry)
		r.unrecorded.Add(key, approval.UncertainWrite{At: r.Clock.Now(), Record: &observed})
		return reconcile.Result{RequeueAfter: recordRetry}, nil
	}
	return reconcile.Result{}, nil
}

// recordOwed makes the records owed by requests gone (or made again under
// their name): an approval known to be in effect (written, its record
// refused) is recorded whatever became of its request; the others have
// nothing left to record. One refused again is kept, and the result asks
// for another look after recordRetry.
func (r *Reconciler) recordOwed(ctx context.Context, dropped map[requestKey]approval.UncertainWrite) reconcile.Result {
	var result reconcile.Result
	for k, w := range dropped {
		if w.Record == nil {
			continue
		}
		if err := r.Engine.RecordApplied(ctx, *w.Record); err != nil {
			log.FromContext(ctx).Error(err, "record the applied decision of a request gone; tried again", "decision_id", w.Record.DecisionID, "retry_in", recordRetry)
			r.unrecorded.Add(k, w)
			result.RequeueAfter = recordRetry
		}
	}
	return result
}

// pendingRequest is what the memo keeps of a request besides its verdict:
// what wakes it.
type pendingRequest struct {
	name string
	// node is the node name the request claims; empty when it claims none.
	node string
}

// waiting is the undecided requests for any of the node names, or every
// undecided request when none is given.
func (r *Reconciler) waiting(nodes ...string) []reconcile.Request {
	var out []reconcile.Request
	for _, p := range r.memo.Waiting(func(p pendingRequest) bool {
		return len(nodes) == 0 || (p.node != "" && slices.Contains(nodes, p.node))
	}) {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.name}})
	}
	return out
}

// changedForTheRule lets through every event but an update that changed
// nothing the rule reads (approval.NothingReadChanged): a request relabelled in a
// loop is not decided and logged again at each write.
func changedForTheRule() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, okOld := e.ObjectOld.(*certificatesv1.CertificateSigningRequest)
		updated, okNew := e.ObjectNew.(*certificatesv1.CertificateSigningRequest)
		return !okOld || !okNew || !approval.NothingReadChanged(old, updated)
	}}
}
