// Package kubeletserving is the approver of kubelet serving certificates
// (ADR 0125). It never touches another signer and never deletes a request.
// Top to bottom:
//
//   - gather (reconciler.go): one reconcile per TalosCluster with the option
//     enabled, on a timer (the resync) and when the cluster, one of its
//     machines or its shard changes, lists the cluster's requests with
//     something left to do and queues their requesters; a CSR event queues
//     its requester directly.
//   - decide (work.go, decide.go, flood.go, stall.go): a fixed pool of
//     workers takes the requesters from client-go's rate-limited workqueue,
//     one worker a requester at a time (a remote cluster's requesters
//     through its gate first, which bounds the workers its tenant's API
//     servers hold, and holds them back while its own stalls), and for
//     each of its requests, oldest first,
//     gathers the facts (the request, the machine with that node name, the
//     node's identity read from its Talos API, the flood counts) and asks
//     the engine.
//   - act (decide.go): approve, deny, or leave pending; a wait the verdict
//     asks for, or a failed request's backoff, is the key's AddAfter; a
//     failure to list the requester's requests, its AddRateLimited.
//   - record (decide.go, conditions.go): the applied record in the decision
//     log, the issued certificate on the TalosMachine, and the cluster's
//     KubeletServingCertificates and latched KubeletServingVerified
//     conditions.
package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
)

// ApprovalReason is the reason of the Approved condition this controller
// writes, so a person can tell its approvals from anyone else's.
const ApprovalReason = "IchorKubeletServing"

// Defaults of the reconciler's timing.
const (
	DefaultResyncInterval = time.Minute
	DefaultTalosTimeout   = 10 * time.Second
	// DefaultTenantRequestTimeout bounds each read and write of a CSR in a
	// tenant's API server (kubeconfigRef), answer included: a server that
	// accepts the request and never answers would otherwise hold a
	// decision worker, which every cluster shares, for as long as it likes.
	DefaultTenantRequestTimeout = 30 * time.Second
	// DefaultTenantMaxCSRs and DefaultTenantMaxCSRBytes bound what the
	// manager keeps of one tenant's API servers (the kubeconfigRefs of the
	// clusters of a namespace, together): their CSRs and about the memory
	// they take (remotelimits.go). Kubernetes removes a CSR within a day,
	// so a cluster of thousands of nodes holds a few thousand, about 3 KB
	// each.
	DefaultTenantMaxCSRs     = 10000
	DefaultTenantMaxCSRBytes = 64 << 20
)

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=kubernetes.io/kubelet-serving,verbs=approve
// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosmachines,verbs=get;list;watch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosmachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Decider is what the approver asks of the policy engine: *engine.Engine,
// or a test's (engine/enginetest).
type Decider interface {
	KubeletServing(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error)
	KubeletServingRejection(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error)
	KubeletServingLimits(context.Context) (engine.KubeletServingLimits, error)
	Kubeconfig(context.Context, engine.KubeconfigInput) (engine.KubeconfigDecision, error)
	RecordApplied(ctx context.Context, a engine.Applied) error
}

// Reconciler approves kubelet serving certificates.
type Reconciler struct {
	// Client reads TalosClusters, TalosMachines and CSRs from the cache and
	// writes their status.
	Client client.Client
	// APIReader reads the secrets Secret directly, so the manager needs get
	// on that Secret only, never list or watch on every Secret.
	APIReader client.Reader
	// SecretsClaims is what the kubeconfigRef Secret must say of the
	// cluster before its kubeconfig is used (clustersecrets.CheckClaim), as
	// NodeReaders asks of the secrets Secret: by default that it names the
	// cluster.
	SecretsClaims clustersecrets.Claims
	// Clientset writes CSR approvals (the approval subresource).
	Clientset kubernetes.Interface
	Engine    Decider
	Recorder  events.EventRecorder
	// Metrics counts the Talos reads, the failures and the pending
	// requests; nil counts nothing.
	Metrics *Metrics
	// NodeReaders gives the Talos identity reader of a cluster.
	NodeReaders *NodeReaders
	// LocalClusters are the clusters without kubeconfigRef that may judge
	// the API server the manager runs against; any other judges nothing.
	LocalClusters *cluster.Local
	// LocalAPIServer is the identity of the API server the manager runs
	// against: a kubeconfigRef whose server is that one is refused.
	LocalAPIServer *kubeconfig.Local
	// AllowInsecureKubeconfig lets a kubeconfigRef set
	// insecure-skip-tls-verify (--remote-kubeconfig-allow-insecure).
	AllowInsecureKubeconfig bool

	ResyncInterval time.Duration
	// TenantRequestTimeout bounds each request to a tenant's API server
	// but its watch; DefaultTenantRequestTimeout if zero.
	TenantRequestTimeout time.Duration
	// TenantMaxCSRs and TenantMaxCSRBytes bound the caches of each
	// tenant's API servers, together; the defaults if zero
	// (remoteLimits.newInformer).
	TenantMaxCSRs     int
	TenantMaxCSRBytes int64
	// MaxConcurrentDecisions is the number of decision workers;
	// DefaultMaxConcurrentDecisions if zero.
	MaxConcurrentDecisions int
	// Clock is the clock; the real one if nil.
	Clock clock.PassiveClock
	// Shards, when set, is this replica's part of the sharding: it serves
	// only the clusters of the shards it holds, on every replica (not
	// leader-elected). Nil serves every cluster, as a single replica does.
	Shards Sharding

	// shardEvents carry the shards this replica began or ceased to serve.
	shardEvents chan event.TypedGenericEvent[int]
	// rejudge carries the clusters a worker found with a kubeconfig to
	// judge again (a changed Secret, a new bundle): they are reconciled.
	rejudge chan event.TypedGenericEvent[types.NamespacedName]
	// rebundle reconciles every cluster when another bundle is activated
	// (BundleActivated).
	rebundle *approval.Rebundle
	// adoptions are the clusters taken over whose first reconcile (it settles
	// the verdicts written before the take-over) has not yet run.
	adoptions adoptions

	// queue holds the requesters whose requests are to be decided, and
	// when (see work.go).
	queue workqueue.TypedRateLimitingInterface[requester]
	// limits are the rule's limits the flood counts are taken with.
	limits limitsCache
	// failures are the requests whose handling failed, looked at again
	// with backoff (their key's).
	failures approval.Memo[memoKey, struct{}]
	// uncertain are those of them whose verdict in effect is to be
	// recorded (settle).
	uncertain approval.Uncertain[memoKey]

	// memo keeps the pending verdicts, so that a request left pending is
	// not decided (and logged) again in a loop: only once it, the machines
	// or the bundle change, or, when the node could not be read, after a
	// growing backoff.
	memo approval.Memo[memoKey, struct{}]
	// unrecorded are the requests whose certificate was refused a record
	// on its machine (recordable), by what it was judged from
	// (recordedFacts) and the cluster's CAs, with the note that said why:
	// not judged, logged and said again each pass.
	unrecorded approval.Memo[memoKey, struct{}]
	// refusedRecords are why the machines waiting for a certificate had
	// their last one refused a record, for the cluster's condition.
	refusedRecords refusals
	targets        targets
	// controller is kept to add the watch of a remote API server, and runCtx
	// (the manager's) bounds those watches.
	controller controller.Controller
	runCtx     context.Context
	// machineEpoch counts machine changes: a pending verdict for an unknown
	// machine is worth deciding again only after one, and one whose node
	// could not be read is decided at once after one.
	machineEpoch approval.Epoch
	// machinesDeleted counts machine deletions: flood counts summed before
	// one are not used (floodCounts).
	machinesDeleted atomic.Uint64
	// localNames are the node names of the local API server's requests,
	// and localCounts its flood counts.
	localNames  nodeNames
	localCounts floodCounts
}

// localTarget is the API server the manager runs against.
func (r *Reconciler) localTarget() *target {
	counts := &r.localCounts
	if r.controller == nil {
		// Not set up with a manager: no events keep the counts, so they
		// are listed for every count.
		counts = nil
	}
	return &target{reader: r.Client, clientset: r.Clientset, local: true, names: &r.localNames, counts: counts}
}

// SetupWithManager registers the reconciler and its indexes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.ResyncInterval == 0 {
		r.ResyncInterval = DefaultResyncInterval
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.TenantRequestTimeout <= 0 {
		r.TenantRequestTimeout = DefaultTenantRequestTimeout
	}
	if r.MaxConcurrentDecisions <= 0 {
		r.MaxConcurrentDecisions = DefaultMaxConcurrentDecisions
	}
	// The queue's wake-ups are measured on the clock the waits are
	// computed with.
	queueClock, ok := r.Clock.(clock.WithTicker)
	if !ok {
		queueClock = clock.RealClock{}
	}
	r.queue = newQueue(queueClock)
	r.runCtx = ctx
	if err := AddIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := mgr.Add(workers{r: r, n: r.MaxConcurrentDecisions, leader: r.Shards == nil}); err != nil {
		return fmt.Errorf("add the decision workers: %w", err)
	}
	if err := mgr.Add(stopWatches{r.NodeReaders}); err != nil {
		return fmt.Errorf("add the end of the identity watches: %w", err)
	}
	opts := controller.Options{MaxConcurrentReconciles: reconcileWorkers}
	r.rejudge = make(chan event.TypedGenericEvent[types.NamespacedName])
	r.rebundle = approval.NewRebundle(r.Engine)
	b := ctrl.NewControllerManagedBy(mgr).
		WatchesRawSource(source.Channel(r.rejudge, handler.TypedEnqueueRequestsFromMapFunc(
			func(_ context.Context, key types.NamespacedName) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: key}}
			}))).
		WatchesRawSource(r.rebundle.Source(r.clustersToRejudge))
	if r.Shards != nil {
		// Every replica serves its own shards, leader or not.
		opts.NeedLeaderElection = ptr.To(false)
		r.shardEvents = make(chan event.TypedGenericEvent[int])
		b = b.WatchesRawSource(source.Channel(r.shardEvents, handler.TypedEnqueueRequestsFromMapFunc(r.shardToClusters)))
	}
	c, err := b.
		Named("kubeletserving").
		For(&ichorv1alpha1.TalosCluster{}, builder.WithPredicates(predicate.GenerationChangedPredicate{},
			predicate.NewPredicateFuncs(func(obj client.Object) bool {
				c, ok := obj.(*ichorv1alpha1.TalosCluster)
				return ok && r.serves(c)
			}))).
		// The initial list and resyncs go behind real events, as
		// controller-runtime's own handlers put them.
		Watches(&ichorv1alpha1.TalosMachine{}, handler.WithLowPriorityWhenUnchanged[client.Object, reconcile.Request](machineHandler{r: r})).
		// A request's event is a key of the decision queue, not a
		// reconcile of the cluster: its work does not grow with the number
		// of requests or machines.
		WatchesRawSource(source.Kind(mgr.GetCache(), &certificatesv1.CertificateSigningRequest{},
			csrEvents(&r.localCounts, &r.localNames, r.csrToRequesters), kubeletServingEvents())).
		// Clusters are independent: one whose nodes time out does not hold
		// back the others.
		WithOptions(opts).
		Build(r)
	if err != nil {
		return err
	}
	r.controller = c
	return nil
}

func isKubeletServing(csr *certificatesv1.CertificateSigningRequest) bool {
	return csr.Spec.SignerName == certificatesv1.KubeletServingSignerName
}

// machineHandler reconciles a machine's cluster on each of its events (see
// machineToCluster), and counts the deletions. An update that changes
// nothing of how requests are matched to machines (the machine epoch: its
// node names, endpoint and cluster) reconciles it recordSettle later: each
// certificate Ichor records on a machine is such an update, and a burst of
// them then brings a reconcile (a pass over every request, and the
// conditions written) about once a second, not one each. The reconcile
// reads the machines from the cache when it runs, so waiting changes when
// the record is seen (a request counted settled, the conditions), never
// what is decided on.
type machineHandler struct{ r *Reconciler }

// recordSettle is how long a cluster's conditions may lag a machine's
// status write that leaves its epoch as it was.
const recordSettle = time.Second

type reconcileQueue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func (h machineHandler) Create(ctx context.Context, e event.CreateEvent, q reconcileQueue) {
	addAll(q, h.r.machineToCluster(ctx, e.Object), 0)
}

func (h machineHandler) Update(ctx context.Context, e event.UpdateEvent, q reconcileQueue) {
	if e.ObjectOld.GetUID() != e.ObjectNew.GetUID() {
		// A machine deleted and made again under its name while the watch
		// was down: the informer's relist tells it as an update, and the
		// one made may be of another cluster.
		h.r.machinesDeleted.Add(1)
		h.r.forgetMachine(e.ObjectOld)
		addAll(q, h.r.clusterOfMachine(ctx, e.ObjectOld), 0)
	}
	changed := h.r.noteMachine(e.ObjectNew)
	wait := time.Duration(0)
	if !changed {
		wait = recordSettle
	}
	// A machine's cluster name does not change (the CRD refuses it).
	addAll(q, h.r.clusterOfMachine(ctx, e.ObjectNew), wait)
}

func (h machineHandler) Delete(ctx context.Context, e event.DeleteEvent, q reconcileQueue) {
	h.r.machinesDeleted.Add(1)
	h.r.forgetMachine(e.Object)
	addAll(q, h.r.clusterOfMachine(ctx, e.Object), 0)
}

func (h machineHandler) Generic(ctx context.Context, e event.GenericEvent, q reconcileQueue) {
	addAll(q, h.r.machineToCluster(ctx, e.Object), 0)
}

func addAll(q reconcileQueue, reqs []reconcile.Request, wait time.Duration) {
	for _, req := range reqs {
		if wait > 0 {
			q.AddAfter(req, wait)
		} else {
			q.Add(req)
		}
	}
}

// csrEvents handles one API server's kubelet serving CSR events: each is
// noted in its flood counts before the request's requester is queued (see
// floodCounts), then queue is called with the request. The work is the
// decision queue's, not a reconcile's. names are the API server's request
// node names: the counts fill them for each undecided request, and a
// request gone is forgotten, so that they hold no more than the requests
// the API server holds.
func csrEvents(counts *floodCounts, names *nodeNames, queue func(context.Context, *certificatesv1.CertificateSigningRequest)) handler.TypedEventHandler[*certificatesv1.CertificateSigningRequest, reconcile.Request] {
	type events = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.TypedFuncs[*certificatesv1.CertificateSigningRequest, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[*certificatesv1.CertificateSigningRequest], _ events) {
			counts.noteEvent(e.Object, false, names.of)
			queue(ctx, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[*certificatesv1.CertificateSigningRequest], _ events) {
			if approval.NothingReadChanged(e.ObjectOld, e.ObjectNew) {
				return
			}
			replaced := e.ObjectOld.UID != e.ObjectNew.UID
			if replaced {
				// A request deleted and made again under its name while
				// the watch was down: the informer's relist tells it as an
				// update, and the one gone is never told of again.
				counts.noteEvent(e.ObjectOld, true, names.of)
			}
			counts.noteEvent(e.ObjectNew, false, names.of)
			if isKubeletServing(e.ObjectNew) {
				queue(ctx, e.ObjectNew)
			} else {
				// Made again for another signer (kubeletServingEvents):
				// only the one gone was this controller's.
				queue(ctx, e.ObjectOld)
			}
			if replaced {
				names.forget(e.ObjectOld.UID)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*certificatesv1.CertificateSigningRequest], _ events) {
			counts.noteEvent(e.Object, true, names.of)
			queue(ctx, e.Object)
			names.forget(e.Object.UID)
		},
		GenericFunc: func(ctx context.Context, e event.TypedGenericEvent[*certificatesv1.CertificateSigningRequest], _ events) {
			counts.noteEvent(e.Object, false, names.of)
			queue(ctx, e.Object)
		},
	}
}

// kubeletServingEvents lets the events of kubelet serving requests
// through, and an update whose old object was one (a request deleted and
// made again under its name for another signer while the watch was down),
// so that csrEvents forgets the one gone.
func kubeletServingEvents() predicate.TypedPredicate[*certificatesv1.CertificateSigningRequest] {
	p := predicate.NewTypedPredicateFuncs(isKubeletServing)
	p.UpdateFunc = func(e event.TypedUpdateEvent[*certificatesv1.CertificateSigningRequest]) bool {
		return isKubeletServing(e.ObjectOld) || isKubeletServing(e.ObjectNew)
	}
	return p
}

// machineToCluster reconciles the machine's cluster: a machine
// that appears, changes its name or loses its certificate changes what the
// cluster's pending requests and conditions depend on.
func (r *Reconciler) machineToCluster(ctx context.Context, obj client.Object) []reconcile.Request {
	r.noteMachine(obj)
	return r.clusterOfMachine(ctx, obj)
}

// noteMachine notes a machine's event, and says whether it changed the
// machine's epoch: the node names it answers to, and its endpoint (a node
// whose Talos API moved is worth reading again). A recorded certificate does
// not change it.
func (r *Reconciler) noteMachine(obj client.Object) (changed bool) {
	m, ok := obj.(*ichorv1alpha1.TalosMachine)
	if !ok {
		return false
	}
	return r.machineEpoch.Note(m.UID, machineEpochKey(m))
}

// forgetMachine forgets a deleted machine in the epoch (its last state
// noted first, as noteMachine would), and its last read.
func (r *Reconciler) forgetMachine(obj client.Object) {
	m, ok := obj.(*ichorv1alpha1.TalosMachine)
	if !ok {
		return
	}
	r.machineEpoch.Forget(m.UID, machineEpochKey(m))
	r.refusedRecords.clear(client.ObjectKeyFromObject(m))
	r.NodeReaders.forgetMachine(types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}, m.Name)
}

// machineEpochKey is what of a machine the epoch follows.
func machineEpochKey(m *ichorv1alpha1.TalosMachine) string {
	return m.Namespace + "/" + m.Spec.ClusterName + "/" + m.Status.NodeName + "/" + m.Spec.Hostname + "/" + m.Spec.Endpoint
}

// clusterOfMachine is the reconcile of the machine's cluster, if this
// replica serves it.
func (r *Reconciler) clusterOfMachine(ctx context.Context, obj client.Object) []reconcile.Request {
	m, ok := obj.(*ichorv1alpha1.TalosMachine)
	if !ok {
		return nil
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}
	if r.Shards != nil {
		// Another replica's cluster is its business; a cluster not (yet)
		// in the cache is reconciled when it arrives.
		var c ichorv1alpha1.TalosCluster
		if err := r.Client.Get(ctx, key, &c); err != nil || !r.serves(&c) {
			return nil
		}
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// csrToRequesters queues the request's requester in each cluster concerned
// by it, and reconciles no cluster: the request's node name is looked up in
// the machine index.
func (r *Reconciler) csrToRequesters(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) {
	keys, err := r.clustersFor(ctx, r.localNames.lookup(csr))
	if err != nil {
		log.FromContext(ctx).Error(err, "map CSR to clusters", "csr", csr.Name)
		return
	}
	for _, key := range keys {
		// A request in this API server is for the clusters judging it: not
		// those whose kubeconfigRef names another, nor those the operator
		// has not named.
		var c ichorv1alpha1.TalosCluster
		if err := r.Client.Get(ctx, key, &c); err != nil || !r.LocalClusters.Judges(&c) || !r.serves(&c) {
			continue
		}
		r.enqueue(requester{cluster: key, username: csr.Spec.Username})
	}
}

// clustersFor is the clusters that may decide a request for node: the
// clusters of the machines with that name, or, when none has it, every
// enabled cluster judging this API server, which leave it pending.
func (r *Reconciler) clustersFor(ctx context.Context, node string) ([]types.NamespacedName, error) {
	if node != "" {
		var named ichorv1alpha1.TalosMachineList
		if err := r.Client.List(ctx, &named, client.MatchingFields{machines.IndexNodeName: node}); err != nil {
			return nil, fmt.Errorf("list machines with node name %q: %w", node, err)
		}
		if len(named.Items) > 0 {
			keys := make([]types.NamespacedName, 0, len(named.Items))
			for _, m := range named.Items {
				keys = append(keys, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName})
			}
			return keys, nil
		}
	}
	var clusters ichorv1alpha1.TalosClusterList
	if err := r.Client.List(ctx, &clusters, client.MatchingFields{IndexServed: "true"}); err != nil {
		return nil, fmt.Errorf("list enabled clusters: %w", err)
	}
	keys := make([]types.NamespacedName, 0, len(clusters.Items))
	for _, c := range clusters.Items {
		keys = append(keys, client.ObjectKeyFromObject(&c))
	}
	return keys, nil
}

// Reconcile looks at one cluster as a whole: on a timer (the resync), and
// when the cluster, one of its machines or its shard changes. It gathers the
// cluster's requests that have something left to do, queues their
// requesters (the workers decide them, see work.go), records the verdicts of
// a cluster taken over, and keeps the cluster's conditions.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("taloscluster", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)

	var cluster ichorv1alpha1.TalosCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		if apierrors.IsNotFound(err) {
			if r.letGo(ctx, req.NamespacedName, true) {
				return reconcile.Result{RequeueAfter: minBackoff}, nil
			}
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("get cluster: %w", err)
	}
	var fence shard.Fence
	if r.Shards != nil {
		f, ok := r.Shards.Fence(cluster.UID)
		if !ok {
			// Another replica holds its shard: nothing of it is kept here.
			r.letGo(ctx, req.NamespacedName, false)
			return reconcile.Result{}, nil
		}
		fence = f
	}
	if err := r.markServed(ctx, &cluster); err != nil {
		return reconcile.Result{}, err
	}
	if !servesKubeletCertificates(&cluster) {
		// Nothing of it is decided here, so nothing to settle either, and
		// nothing to record again: no replica records its verdicts while
		// it is disabled.
		r.adoptions.drop(req.NamespacedName)
		owed := r.forgetUncertain(ctx, req.NamespacedName)
		r.NodeReaders.Forget(req.NamespacedName)
		r.targets.stop(req.NamespacedName)
		r.forgetVerdicts(req.NamespacedName)
		r.Metrics.forget(req.Namespace, req.Name)
		var result reconcile.Result
		if owed {
			result.RequeueAfter = minBackoff
		}
		return result, r.clearConditions(ctx, &cluster)
	}
	t, err := r.targetFor(ctx, &cluster)
	if errors.Is(err, ErrLocalClusterNotNamed) {
		// Only a restart with other flags changes this.
		logger.Info("the cluster judges nothing: the operator has not named it as a judge of the local API server")
		r.adoptions.drop(req.NamespacedName)
		r.NodeReaders.Forget(req.NamespacedName)
		r.forgetVerdicts(req.NamespacedName)
		r.Metrics.forget(req.Namespace, req.Name)
		return reconcile.Result{}, r.refuseTarget(ctx, &cluster, err)
	}
	var deferred *startDeferredError
	if errors.As(err, &deferred) {
		// The start of its watch waits for room, or for its backoff.
		// When it backs off from a failure, the cluster says that
		// failure: a watch stopped after its start (its server grew past
		// the limits) has said nothing yet. Said as the failed start
		// said it, the condition does not change again while it waits.
		logger.V(1).Info("the watch of the cluster's API server is not started yet", "reason", err.Error())
		if deferred.cause == nil {
			// Waiting for room: nothing is decided there until it starts,
			// which the condition says (its watch, if any, is of an old
			// content or bundle).
			if err := r.refuseTarget(ctx, &cluster, deferred); err != nil {
				return reconcile.Result{}, err
			}
		}
		if deferred.cause != nil {
			r.targets.drop(req.NamespacedName, false)
			r.NodeReaders.Forget(req.NamespacedName)
			// Its gauges said what its last look saw; nothing is looked
			// at now (review 169: a flood guard at 1 stayed for good).
			r.Metrics.forget(req.Namespace, req.Name)
			if err := r.refuseTarget(ctx, &cluster, deferred.cause); err != nil {
				return reconcile.Result{}, err
			}
		}
		// At least every 30 s, to see a kubeconfig put right (another
		// content is started at once, once a backoff: remoteStarts).
		return reconcile.Result{RequeueAfter: min(deferred.wait, 30*time.Second)}, nil
	}
	var readFailing *kubeconfigReadFailingError
	if errors.As(err, &readFailing) {
		return r.kubeconfigUnanswered(ctx, &cluster, err)
	}
	var refused *KubeconfigRefusedError
	if errors.As(err, &refused) {
		// Decided once for this content, and said on the cluster; the
		// Secret is read again in a while, as Secrets are not watched.
		// Nothing is decided there meanwhile: its watch ends (the verdict
		// is kept, so the refusal is not logged again).
		r.targets.drop(req.NamespacedName, false)
		r.NodeReaders.Forget(req.NamespacedName)
		r.forgetVerdicts(req.NamespacedName)
		r.Metrics.forget(req.Namespace, req.Name)
		if err := r.refuseTarget(ctx, &cluster, err); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if err != nil {
		// An unreadable Secret (deleted, or its RBAC taken away, to stop
		// Ichor acting there), a server that cannot be identified or
		// watched: nothing is decided for the cluster until it is put
		// right, so the watch an earlier reconcile started, and the
		// credentials it holds, end here; the workers find no target, and
		// no node is watched for it.
		r.targets.drop(req.NamespacedName, false)
		r.NodeReaders.Forget(req.NamespacedName)
		r.Metrics.forget(req.Namespace, req.Name)
		logger.Error(err, "cannot judge the cluster's API server")
		if err := r.refuseTarget(ctx, &cluster, err); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	// Its requests are decided here from now on: their reader is kept.
	r.NodeReaders.Serving(req.NamespacedName)

	// Gather: the requests with something left to do. On the first look at
	// a cluster taken over from another replica, adoptedSince brings the
	// verdicts that replica wrote shortly before, to record them here.
	p := &pass{r: r, cluster: &cluster, target: t, now: r.Clock.Now(), fence: fence}
	adopted := r.adoptions.peek(req.NamespacedName)
	p.adoptedSince = adopted.since
	// What a worker makes uncertain after the list is not forgotten as
	// gone: the list does not have its request yet (review 15, H1).
	// Nor what a worker remembers after it (a request approved meanwhile
	// would be decided again from a stale copy: the hostile review of
	// 2026-12-05).
	uncertainUpTo, memoUpTo, failuresUpTo, unrecordedUpTo := r.uncertain.Generation(), r.memo.Generation(), r.failures.Generation(), r.unrecorded.Generation()
	csrs, live, err := p.requestsToLookAt(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	queued := map[string]bool{}
	unrecorded := false
	for i := range csrs {
		csr := &csrs[i]
		if approval.IsDecided(csr) {
			// Record which verdict is in effect (no Talos read, no write).
			recorded := p.settle(ctx, csr)
			if !recorded {
				unrecorded = true
			}
			if len(csr.Status.Certificate) == 0 {
				p.lookedAt(csr, recorded)
				continue
			}
		}
		if !queued[csr.Spec.Username] {
			queued[csr.Spec.Username] = true
			r.enqueue(requester{cluster: req.NamespacedName, username: csr.Spec.Username})
		}
	}
	// A write of the previous holder's that may still commit keeps the
	// adoption open: a pass looks again once it can no longer.
	adoptionOpen := adopted.openUntil.Sub(p.now)
	if !p.adoptedSince.IsZero() && !unrecorded && adoptionOpen <= 0 {
		// Settled only once every verdict it was to record is recorded: a
		// record refused (the decision log's sink) is tried again at the
		// next pass, and the shard's release says nothing settled meanwhile.
		r.adoptions.settle(req.NamespacedName, p.adoptedSince)
	}
	// The cluster's memos of requests that are gone are forgotten.
	r.memo.ForgetIf(ofCluster(req.NamespacedName, live), memoUpTo)
	r.failures.ForgetIf(ofCluster(req.NamespacedName, live), failuresUpTo)
	r.unrecorded.ForgetIf(ofCluster(req.NamespacedName, live), unrecordedUpTo)
	// Gone: what is owed of them is recorded now, and nothing else is left
	// to record, here or by the next holder, so the shard's release need not
	// say them unsettled.
	owed := r.recordOwed(ctx, r.uncertain.ForgetIf(inCluster(req.NamespacedName, live), uncertainUpTo))
	pending, withheld := r.leftPending(req.NamespacedName, csrs)
	r.Metrics.pending(cluster.Namespace, cluster.Name, pending, withheld)
	if err := r.keepWatches(ctx, &cluster, p.now); err != nil {
		// The decisions read the nodes directly meanwhile.
		logger.Error(err, "cannot watch the machines' identities")
	}
	next, err := r.updateConditions(ctx, &cluster, p, p.now, withheld)
	if err != nil {
		return reconcile.Result{}, err
	}
	if next <= 0 || next > r.ResyncInterval {
		next = r.ResyncInterval
	}
	if owed && (next <= 0 || next > minBackoff) {
		next = minBackoff
	}
	if !p.adoptedSince.IsZero() && adoptionOpen > 0 && (next <= 0 || next > adoptionOpen) {
		next = adoptionOpen
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// BundleActivated tells the approver of the bundle now in service: another
// one than the last has every cluster looked at again at once, so that the
// requests the last bundle left pending are decided under the new one
// without waiting for the resync.
func (r *Reconciler) BundleActivated(revision string) {
	r.rebundle.Activated(revision)
}

// clustersToRejudge are the clusters that judge requests here: enabled,
// served by this replica, and judging an API server (a kubeconfigRef's, or
// the local one that the operator named them judges of). The others have
// nothing a bundle decides (a shard taken later is reconciled when taken).
func (r *Reconciler) clustersToRejudge(ctx context.Context) []reconcile.Request {
	var clusters ichorv1alpha1.TalosClusterList
	if err := r.Client.List(ctx, &clusters, client.MatchingFields{IndexServed: "true"}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "list the clusters to judge under a new bundle; each is at its resync")
		return nil
	}
	var out []reconcile.Request
	for i := range clusters.Items {
		c := &clusters.Items[i]
		if r.serves(c) && (c.Spec.KubeconfigRef != nil || r.LocalClusters.Judges(c)) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(c)})
		}
	}
	return out
}

// revision is the active bundle's revision, or "" when the Decider does not
// say (then a verdict lasts as long as its facts: a kubeconfig's content, a
// request's version and the machines' epoch).
func (r *Reconciler) revision() string {
	return approval.ActiveRevision(r.Engine)
}

// leftPending counts, of a cluster's requests, the undecided ones its last
// decision left pending for one of its machines or whose verdict could not
// be written (they are pending all the same, and the pending alert exists
// for them), and of those, the ones the rule withheld for a flood
// (TooManyPendingRequests).
func (r *Reconciler) leftPending(key types.NamespacedName, csrs []certificatesv1.CertificateSigningRequest) (pending, withheld int) {
	for i := range csrs {
		if approval.IsDecided(&csrs[i]) {
			continue
		}
		k := memoKey{cluster: key, uid: csrs[i].UID}
		v, ok := r.memo.Verdict(k)
		// A request the rule gave no decision on is no rule's to keep
		// pending (another approver's, or a person's): not counted. Nor
		// is one for a name no machine of any cluster has: every cluster
		// judging the API server keeps it pending, and one made-up request
		// (any node, any bootstrap token) would fire the pending alert for
		// each of them (review 169).
		if !ok || v.Key == "" || v.Key == engine.ActionNone || v.Key == codeMachineUnknown {
			if r.failures.Has(k) {
				pending++
			}
			continue
		}
		pending++
		if v.Key == codeTooManyPending {
			withheld++
		}
	}
	return pending, withheld
}

// passFor is what a worker needs to decide requests of a cluster: the
// cluster, the API server it judges, and this replica's hold on its shard.
// ok is false when there is nothing to decide here: the cluster is gone, not
// enabled, not served by this replica, or its API server not (yet) watched
// (its reconcile starts the watch, and queues its requests then).
func (r *Reconciler) passFor(ctx context.Context, key types.NamespacedName) (*pass, bool, error) {
	// Before the cluster is read: a forget after the read is seen.
	metricsGen := r.Metrics.generation()
	var cluster ichorv1alpha1.TalosCluster
	if err := r.Client.Get(ctx, key, &cluster); err != nil {
		return nil, false, client.IgnoreNotFound(err)
	}
	if !servesKubeletCertificates(&cluster) {
		return nil, false, nil
	}
	p := &pass{r: r, cluster: &cluster, now: r.Clock.Now(), metricsGen: metricsGen}
	if r.Shards != nil {
		f, ok := r.Shards.Fence(cluster.UID)
		if !ok {
			return nil, false, nil
		}
		p.fence = f
	}
	if p.target = r.currentTarget(&cluster); p.target == nil {
		return nil, false, nil
	}
	return p, true, nil
}

// servesKubeletCertificates says whether the cluster's kubelet serving
// certificates are Ichor's to decide: its reconcile serves it, a turn
// begins (passFor), another cluster's requests are left to it (judges),
// Ready says so, and a verdict is written, only while it holds
// (pass.changed). A cluster being deleted is not served, though another
// controller's finalizer keeps it: its deletion is the operator's word that
// Ichor stop managing it, and the audit skips it already (review 220 F3).
func servesKubeletCertificates(c *ichorv1alpha1.TalosCluster) bool {
	return c.Spec.Security.KubeletServingCertificates.Enabled && c.DeletionTimestamp.IsZero()
}

// pass is the facts of one look at a cluster's requests: a reconcile's, or
// a worker's at one requester's.
type pass struct {
	r       *Reconciler
	cluster *ichorv1alpha1.TalosCluster
	target  *target
	now     time.Time
	// fence, when the clusters are shared out, is this replica's hold on
	// the cluster's shard: the decisions run under its context and begin
	// their writes through it.
	fence shard.Fence
	// adoptedSince, on a reconcile of a cluster taken over from another
	// replica, is from when verdicts that replica wrote are recorded
	// applied again (settle); zero otherwise.
	adoptedSince time.Time
	// wait is the earliest look again a decision asked for; zero for none.
	wait time.Duration
	// metricsGen is the metrics' generation before the cluster was read
	// (Metrics.withheld).
	metricsGen uint64
}

func (p *pass) key() types.NamespacedName {
	return client.ObjectKeyFromObject(p.cluster)
}

// retryIn asks for the pass's requests to be looked at again within d.
func (p *pass) retryIn(d time.Duration) {
	if d > 0 && (p.wait == 0 || d < p.wait) {
		p.wait = d
	}
}

// statusChanged reports whether a status update would change anything.
func statusChanged(before, after any) bool {
	return !equality.Semantic.DeepEqual(before, after)
}
