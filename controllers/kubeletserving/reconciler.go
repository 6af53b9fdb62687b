// Package kubeletserving is the approver of kubelet serving certificates
// (ADR 0125): KubeletServingReconciler, keyed by TalosCluster, woken by
// CertificateSigningRequest events and a timer.
//
// For every undecided request of the signer kubernetes.io/kubelet-serving in
// a cluster with the option enabled, it gathers the facts (the request, the
// machine with that node name, the node's identity read from its Talos API),
// asks the engine, and acts: approve, deny, or leave pending. It never touches
// another signer and never deletes a request. Once kube-controller-manager
// has signed, it records the certificate on the TalosMachine, and it keeps
// the cluster's KubeletServingCertificates and latched KubeletServingVerified
// conditions.
package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
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
)

// ApprovalReason is the reason of the Approved condition this controller
// writes, so a person can tell its approvals from anyone else's.
const ApprovalReason = "IchorKubeletServing"

// Defaults of the reconciler's timing.
const (
	DefaultResyncInterval = time.Minute
	DefaultTalosTimeout   = 10 * time.Second
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
	// MaxConcurrentDecisions bounds the requests decided at once;
	// DefaultMaxConcurrentDecisions if zero.
	MaxConcurrentDecisions int
	// PassWait is how long a pass waits for its decisions; DefaultPassWait
	// if zero.
	PassWait time.Duration
	// Clock is the clock; the real one if nil.
	Clock clock.PassiveClock
	// Shards, when set, is this replica's part of the sharding: it serves
	// only the clusters of the shards it holds, on every replica (not
	// leader-elected). Nil serves every cluster, as a single replica does.
	Shards Sharding

	// shardEvents carry the shards this replica began or ceased to serve.
	shardEvents chan event.TypedGenericEvent[int]
	// adoptions are the clusters taken over and not yet fully passed.
	adoptions adoptions

	work *workers
	// limits are the rule's limits the flood counts are taken with.
	limits limitsCache
	// failures are the requests whose handling failed, with their backoff.
	failures approval.Memo[memoKey, struct{}]

	dirty dirtySet
	// memo keeps the pending verdicts, so that a request left pending is
	// not decided (and logged) again in a loop: only once it or the machines
	// change, or, when the node could not be read, after a growing backoff.
	memo    approval.Memo[memoKey, struct{}]
	targets targets
	// controller is kept to add the watch of a remote API server, and runCtx
	// (the manager's) bounds those watches.
	controller controller.Controller
	runCtx     context.Context
	// machineEpoch counts machine changes: a pending verdict for an unknown
	// machine is worth deciding again only after one, and one whose node
	// could not be read is decided at once after one.
	machineEpoch approval.Epoch
	// localNames are the node names of the local API server's requests.
	localNames nodeNames
}

// SetupWithManager registers the reconciler and its indexes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.ResyncInterval == 0 {
		r.ResyncInterval = DefaultResyncInterval
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.MaxConcurrentDecisions <= 0 {
		r.MaxConcurrentDecisions = DefaultMaxConcurrentDecisions
	}
	if r.PassWait <= 0 {
		r.PassWait = DefaultPassWait
	}
	r.work = newWorkers(r.MaxConcurrentDecisions)
	r.work.owe = r.dirty.owe
	r.runCtx = ctx
	if err := AddIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	opts := controller.Options{MaxConcurrentReconciles: 4}
	b := ctrl.NewControllerManagedBy(mgr)
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
		Watches(&ichorv1alpha1.TalosMachine{}, handler.EnqueueRequestsFromMapFunc(r.machineToCluster)).
		Watches(&certificatesv1.CertificateSigningRequest{}, handler.EnqueueRequestsFromMapFunc(r.csrToClusters),
			builder.WithPredicates(predicate.NewPredicateFuncs(isKubeletServing))).
		// Decisions that outlive their pass wake their cluster here.
		WatchesRawSource(source.Channel(r.work.kicks, &handler.EnqueueRequestForObject{})).
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

func isKubeletServing(obj client.Object) bool {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	return ok && csr.Spec.SignerName == certificatesv1.KubeletServingSignerName
}

// machineToCluster wakes the machine's cluster for a full pass: a machine
// that appears, changes its name or loses its certificate changes what the
// cluster's pending requests and conditions depend on.
func (r *Reconciler) machineToCluster(ctx context.Context, obj client.Object) []reconcile.Request {
	m, ok := obj.(*ichorv1alpha1.TalosMachine)
	if !ok {
		return nil
	}
	// The node names a machine answers to, and its endpoint: a node whose
	// Talos API moved is worth reading again. Status updates of machines (a
	// recorded certificate) do not count.
	r.machineEpoch.Note(m.UID, m.Namespace+"/"+m.Spec.ClusterName+"/"+m.Status.NodeName+"/"+m.Spec.Hostname+"/"+m.Spec.Endpoint)
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}
	if r.Shards != nil {
		// Another replica's cluster is its business; a cluster not (yet)
		// in the cache is reconciled when it arrives.
		var c ichorv1alpha1.TalosCluster
		if err := r.Client.Get(ctx, key, &c); err != nil || !r.serves(&c) {
			return nil
		}
	}
	r.dirty.markFull(key)
	return []reconcile.Request{{NamespacedName: key}}
}

// csrToClusters wakes the clusters concerned by one request and marks only
// that request dirty, so the work of a CSR event does not grow with the
// number of requests or machines: the request's node name is looked up in
// the machine index.
func (r *Reconciler) csrToClusters(ctx context.Context, obj client.Object) []reconcile.Request {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return nil
	}
	keys, err := r.clustersFor(ctx, r.localNames.lookup(csr))
	if err != nil {
		log.FromContext(ctx).Error(err, "map CSR to clusters", "csr", csr.Name)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(keys))
	for _, key := range keys {
		// A request in this API server is for the clusters judging it: not
		// those whose kubeconfigRef names another, nor those the operator
		// has not named.
		var c ichorv1alpha1.TalosCluster
		if err := r.Client.Get(ctx, key, &c); err != nil || !r.LocalClusters.Judges(&c) || !r.serves(&c) {
			continue
		}
		r.dirty.add(key, csr.Name)
		reqs = append(reqs, reconcile.Request{NamespacedName: key})
	}
	return reqs
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
	if err := r.Client.List(ctx, &clusters, client.MatchingFields{IndexServingEnabled: "true"}); err != nil {
		return nil, fmt.Errorf("list enabled clusters: %w", err)
	}
	keys := make([]types.NamespacedName, 0, len(clusters.Items))
	for _, c := range clusters.Items {
		keys = append(keys, client.ObjectKeyFromObject(&c))
	}
	return keys, nil
}

// Reconcile decides the dirty requests of one cluster or, on a timer, a
// cluster or machine change, makes a full pass over all of them and the
// conditions.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("taloscluster", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)

	start := r.Clock.Now()
	work := r.dirty.take(req.NamespacedName, start, r.ResyncInterval)
	var cluster ichorv1alpha1.TalosCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		if apierrors.IsNotFound(err) {
			r.letGo(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("get cluster: %w", err)
	}
	var fence shard.Fence
	if r.Shards != nil {
		f, ok := r.Shards.Fence(cluster.UID)
		if !ok {
			// Another replica holds its shard: nothing of it is kept here.
			r.letGo(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		fence = f
	}
	if err := r.markServed(ctx, &cluster); err != nil {
		return reconcile.Result{}, err
	}
	if !cluster.Spec.Security.KubeletServingCertificates.Enabled {
		// Nothing of it is decided here, so nothing to settle either.
		r.adoptions.drop(req.NamespacedName)
		r.NodeReaders.Forget(req.NamespacedName)
		r.targets.stop(req.NamespacedName)
		r.memo.ForgetIf(ofCluster(req.NamespacedName, nil))
		r.Metrics.forget(req.Namespace, req.Name)
		return reconcile.Result{}, r.clearConditions(ctx, &cluster)
	}
	t, err := r.targetFor(ctx, &cluster)
	if errors.Is(err, ErrLocalClusterNotNamed) {
		// Only a restart with other flags changes this.
		logger.Info("the cluster judges nothing: the operator has not named it as a judge of the local API server")
		r.adoptions.drop(req.NamespacedName)
		r.NodeReaders.Forget(req.NamespacedName)
		r.memo.ForgetIf(ofCluster(req.NamespacedName, nil))
		r.Metrics.forget(req.Namespace, req.Name)
		return reconcile.Result{}, r.refuseTarget(ctx, &cluster, err)
	}
	var refused *KubeconfigRefusedError
	if errors.As(err, &refused) {
		// Decided once for this content, and said on the cluster; the
		// Secret is read again in a while, as Secrets are not watched.
		r.NodeReaders.Forget(req.NamespacedName)
		r.memo.ForgetIf(ofCluster(req.NamespacedName, nil))
		r.Metrics.forget(req.Namespace, req.Name)
		if err := r.refuseTarget(ctx, &cluster, err); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if err != nil {
		logger.Error(err, "cannot judge the cluster's API server")
		if err := r.refuseTarget(ctx, &cluster, err); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}

	// The pass has its own copy of the cluster: its decisions may outlive
	// the reconcile, which goes on to write the cluster's status.
	p := &pass{r: r, cluster: cluster.DeepCopy(), target: t, now: r.Clock.Now(), fence: fence}
	if work.full {
		// Forgotten once this pass has settled its verdicts: a pass that
		// fails first leaves it to the next full one.
		p.adoptedSince = r.adoptions.peek(req.NamespacedName).since
	}
	var csrs []certificatesv1.CertificateSigningRequest
	// live are the requests a full pass found in the API server: the
	// cluster's memos of any other are forgotten.
	var live map[types.UID]bool
	if work.full {
		if csrs, live, err = p.requestsToLookAt(ctx); err != nil {
			return reconcile.Result{}, err
		}
	} else {
		for name := range work.csrs {
			var csr certificatesv1.CertificateSigningRequest
			if err := t.reader.Get(ctx, types.NamespacedName{Name: name}, &csr); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				// Every request this pass was for is looked at by the next:
				// those a wake-up brought have no event to mark them again.
				r.dirty.owe(req.NamespacedName, work.csrs, false)
				return reconcile.Result{}, fmt.Errorf("get CSR %s: %w", name, err)
			}
			csrs = append(csrs, csr)
		}
	}
	// Each request is decided on its own: a failure or a node that does not
	// answer holds back only that request, which is tried again with backoff.
	p.dispatch(ctx, csrs, r.PassWait)
	if !p.adoptedSince.IsZero() {
		// The adopted verdicts were recorded (settle is quick: no Talos
		// read), or are being by a decision that outlived the wait.
		r.adoptions.settle(req.NamespacedName, p.adoptedSince)
	}
	if !work.full {
		return r.dirty.requeue(req.NamespacedName, start, p.result().RequeueAfter), nil
	}
	r.memo.ForgetIf(ofCluster(req.NamespacedName, live))
	r.failures.ForgetIf(ofCluster(req.NamespacedName, live))
	r.Metrics.pending(cluster.Namespace, cluster.Name, p.pendingCount(), p.withheldCount())
	if err := r.updateConditions(ctx, &cluster, p); err != nil {
		return reconcile.Result{}, err
	}
	p.requeueIn(r.ResyncInterval)
	return r.dirty.requeue(req.NamespacedName, start, p.result().RequeueAfter), nil
}

// pass is the state of one reconcile of one cluster. Its decisions run
// concurrently, and may outlive it (detached): what they ask afterwards is a
// wake-up of the cluster.
type pass struct {
	r       *Reconciler
	cluster *ichorv1alpha1.TalosCluster
	target  *target
	now     time.Time
	// fence, when the clusters are shared out, is this replica's hold on
	// the cluster's shard as the pass began: its decisions run under its
	// context and begin their writes through it.
	fence shard.Fence
	// adoptedSince, on the first full pass of a cluster taken over from
	// another replica, is from when verdicts that replica wrote are recorded
	// applied again (settle); zero otherwise.
	adoptedSince time.Time

	mu       sync.Mutex
	requeue  time.Duration
	detached bool
	// pending counts the requests this pass left pending, withheld those the
	// rule withheld for a flood (TooManyPendingRequests).
	pending  int
	withheld int

	// counts are the flood guard's counts of the pass's API server, taken
	// once a pass.
	countsOnce sync.Once
	counts     *csrinput.Requests
	countsErr  error
}

func (p *pass) key() types.NamespacedName {
	return client.ObjectKeyFromObject(p.cluster)
}

// retryIn asks, for one of the pass's decisions, for the cluster to be
// reconciled again within d: as the pass's requeue while the pass waits for
// its decisions, as a wake-up of the cluster to look at csr again once it
// has stopped waiting (the whole cluster when csr is nil).
func (p *pass) retryIn(d time.Duration, csr *certificatesv1.CertificateSigningRequest) {
	if d <= 0 {
		return
	}
	p.mu.Lock()
	if !p.detached {
		// Under the same lock as the check: a detach in between would leave
		// the requeue to a pass that has already returned.
		p.requeueLocked(d)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	name := ""
	if csr != nil {
		name = csr.Name
	}
	p.r.work.kickAfter(p.key(), d, name)
}

// requeueIn asks for the cluster to be reconciled again within d as the
// pass's requeue, whether or not its decisions are still running: for what
// the reconcile itself asks after them (its conditions' expiries, the
// resync), which it returns.
func (p *pass) requeueIn(d time.Duration) {
	if d <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requeueLocked(d)
}

func (p *pass) requeueLocked(d time.Duration) {
	if p.requeue == 0 || d < p.requeue {
		p.requeue = d
	}
}

func (p *pass) addPending() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending++
}

func (p *pass) addWithheld() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.withheld++
}

func (p *pass) withheldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withheld
}

func (p *pass) pendingCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending
}

// detach makes the decisions still running report to the cluster's queue.
func (p *pass) detach() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.detached = true
}

func (p *pass) result() reconcile.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return reconcile.Result{RequeueAfter: p.requeue}
}

// dirtySet holds, per cluster, the requests whose events arrived since its
// last reconcile, whether a full pass is due, and when the cluster asked to
// be looked at again.
//
// A reconcile asks for its next one with RequeueAfter; a request's event
// that arrives first reconciles the cluster at once, and the queue counts
// that as the requeue (controller-runtime's queue keeps one entry a key), so
// the wake-up a pass asked for would be lost to the next dirty pass. The
// wake-up is kept here instead: a dirty pass passes it on, and once it is due
// the pass is a full one, which looks at every request whose wait is over.
type dirtySet struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*work
}

type work struct {
	full bool
	csrs map[string]bool
	// wakeAt is when a pass asked the cluster to be looked at again; zero
	// for never. lastFull is when its last full pass began.
	wakeAt   time.Time
	lastFull time.Time
}

func (d *dirtySet) get(key types.NamespacedName) *work {
	if d.m == nil {
		d.m = map[types.NamespacedName]*work{}
	}
	w, ok := d.m[key]
	if !ok {
		w = &work{csrs: map[string]bool{}}
		d.m[key] = w
	}
	return w
}

func (d *dirtySet) add(key types.NamespacedName, csr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.get(key).csrs[csr] = true
}

func (d *dirtySet) markFull(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.get(key).full = true
}

// owe marks what a wake-up of the cluster is for: the requests to look at
// again, or a full pass.
func (d *dirtySet) owe(key types.NamespacedName, requests map[string]bool, full bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.get(key)
	w.full = w.full || full
	for name := range requests {
		w.csrs[name] = true
	}
}

// take returns and clears the cluster's work. A reconcile with no request
// marked dirty comes from the timer or a cluster change, and one whose
// wake-up is due or whose last full pass is resync old is owed one: both
// are full passes.
func (d *dirtySet) take(key types.NamespacedName, now time.Time, resync time.Duration) work {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.get(key)
	due := !w.wakeAt.IsZero() && !now.Before(w.wakeAt)
	out := work{full: w.full || len(w.csrs) == 0 || due || now.Sub(w.lastFull) >= resync, csrs: w.csrs}
	w.full, w.csrs = false, map[string]bool{}
	if out.full {
		out.csrs = nil
		w.wakeAt, w.lastFull = time.Time{}, now
	}
	return out
}

// forget drops a cluster's state (the cluster is gone).
func (d *dirtySet) forget(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, key)
}

// requeue records the wake-up a pass asks for and returns the requeue that
// keeps every wake-up asked for: the earliest still ahead.
func (d *dirtySet) requeue(key types.NamespacedName, now time.Time, after time.Duration) reconcile.Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.get(key)
	if after > 0 && (w.wakeAt.IsZero() || now.Add(after).Before(w.wakeAt)) {
		w.wakeAt = now.Add(after)
	}
	if w.wakeAt.IsZero() {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: max(w.wakeAt.Sub(now), time.Millisecond)}
}

// statusChanged reports whether a status update would change anything.
func statusChanged(before, after any) bool {
	return !equality.Semantic.DeepEqual(before, after)
}
