package kubeletserving

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
)

// ReasonKubeconfigUnreadable is the reason of a False
// KubeletServingCertificates condition when the cluster's kubeconfigRef
// cannot be read or its API server cannot be watched: nothing is decided
// there until it can.
const ReasonKubeconfigUnreadable = "KubeconfigUnreadable"

// ReasonPolicyEvaluationFailed is the reason of a False
// KubeletServingCertificates condition when the manager could not judge the
// cluster's kubeconfigRef: the bundle's kubeconfig rule failed, is missing
// or answered out of shape, or its decision could not be logged (a
// --decision-log-file that cannot be written fails every decision). The
// fault is this side's, not the tenant's Secret, which was said before
// (review 203 F3).
const ReasonPolicyEvaluationFailed = "PolicyEvaluationFailed"

// ReasonRemoteWatchStarting is the reason of a False
// KubeletServingCertificates condition while the watch of the cluster's API
// server waits for its turn to start (other tenants' starts hold the room:
// a new cluster, a kubeconfig rotated, every remote cluster judged again
// under a new bundle). Nothing is decided there meanwhile; before review
// 203 (F2) the condition went on saying the requests were decided.
const ReasonRemoteWatchStarting = "RemoteWatchStarting"

// ReasonRemoteServerTooLarge is the reason of a False
// KubeletServingCertificates condition when the cluster's API server (or
// its tenant's servers together) hold more CSRs, or more bytes of them, than
// the manager keeps of a tenant's servers (--tenant-max-csrs,
// --tenant-max-csr-mib): its watch is stopped and started again after a
// backoff.
const ReasonRemoteServerTooLarge = "RemoteServerTooLarge"

// ReasonRemoteServerInvalid is the reason of a False
// KubeletServingCertificates condition when the cluster's API server sent
// what no Kubernetes API server sends (a CSR in a namespace, a CSR listed
// twice, a list paged unasked): it is not watched until it stops.
const ReasonRemoteServerInvalid = "RemoteServerInvalid"

// ReasonRemoteServerAddressRefused is the reason of a False
// KubeletServingCertificates condition when the cluster's API server is
// at an address in a network the manager does not connect to for a tenant
// (--remote-kubeconfig-denied-networks): nothing was sent to it. It is tried
// again after the start's backoff, since DNS may answer otherwise.
const ReasonRemoteServerAddressRefused = "RemoteServerAddressRefused"

// ReasonKubeconfigRefused is the reason of a False
// KubeletServingCertificates condition when the rule ichor/kubeconfig refused
// the cluster's kubeconfigRef: a field it may not hold, or a server that is
// the manager's own API server. Nothing is decided there, and nothing is
// connected to, until the Secret changes.
const ReasonKubeconfigRefused = "KubeconfigRefused"

// KubeconfigRefusedError is a kubeconfigRef the rule refused.
type KubeconfigRefusedError struct {
	Decision engine.KubeconfigDecision
}

func (e *KubeconfigRefusedError) Error() string {
	return "the kubeconfigRef is refused: " + e.Decision.ConditionMessage()
}

// ReasonLocalClusterNotNamed is the reason of a False
// KubeletServingCertificates condition of a cluster without kubeconfigRef
// that the operator has not named as one that judges the API server the
// manager runs against (--local-clusters): it judges nothing.
const ReasonLocalClusterNotNamed = "LocalClusterNotNamed"

// ErrLocalClusterNotNamed is why a cluster without kubeconfigRef that the
// operator has not named judges nothing.
var ErrLocalClusterNotNamed = errors.New("this cluster has no spec.kubeconfigRef, so it would judge the kubelets of the API server the manager runs against, " +
	"and the operator has not named it as one that may (manager flag --local-clusters, chart value manager.localClusters): it judges no request; " +
	"name it there, or give it the kubeconfigRef of its own API server")

// target is an API server whose kubelet-serving CSRs a cluster judges: the
// manager's own, or the one a TalosCluster's kubeconfigRef names, watched
// through its own cache.
type target struct {
	// reader reads CSRs (a cache).
	reader client.Reader
	// clientset writes approvals.
	clientset kubernetes.Interface
	// local is the manager's own API server, where Events about a CSR can be
	// written beside it.
	local bool
	// names are the node names of its requests, parsed once.
	names *nodeNames
	// counts are the flood counts of its undecided requests, kept between
	// its events.
	counts *floodCounts
	// gate bounds the decision workers its tenant holds, and holds the
	// cluster's requesters back while its server stalls; nil for the
	// local API server.
	gate *tenantGate

	kubeconfig []byte
	// limits bound what its cache keeps (remote API servers only).
	limits remoteLimits
	// watch is the remote cache's context, which cancel ends: a decision
	// through the target ends with it. Nil for the local API server.
	watch  context.Context
	cancel context.CancelFunc
	// stopped is called once the watch has stopped and given its share of
	// its tenant's bound back (remote API servers only).
	stopped func()
}

// targets keeps one watched API server per cluster with a kubeconfigRef, and
// the rule's verdict on each cluster's kubeconfig content, so that a
// kubeconfig is judged (and logged) once per content and bundle revision,
// not at every reconcile. mu guards the maps only and is never held across a
// network call: the work on one cluster (probe, cache sync, up to 40 s
// against a tenant's server) is serialised by that cluster's own lock, so a
// stalling server delays its own cluster and no other.
type targets struct {
	mu       sync.Mutex
	keys     map[types.NamespacedName]*keyLock
	remote   map[types.NamespacedName]*target
	verdicts map[types.NamespacedName]*verdict
	// gates are the clusters' gates, and pool what they share.
	gates map[types.NamespacedName]*tenantGate
	pool  *remotePool
	// starts bounds the reconciles that start remote watches.
	starts remoteStarts
	// usage is what each tenant's caches hold together (remoteLimits).
	usage map[string]*tenantUsage
	// readFailures are when the reads of a cluster's kubeconfig Secret
	// began to fail for want of an answer (readFailing).
	readFailures map[types.NamespacedName]time.Time
}

// holdUsage is the usage of the tenant in namespace, for one more watch of
// its servers, and the release of that hold: a tenant's usage is forgotten
// when none of its watches may count any more.
func (t *targets) holdUsage(namespace string) (*tenantUsage, func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.usage[namespace]
	if !ok {
		if t.usage == nil {
			t.usage = map[string]*tenantUsage{}
		}
		u = &tenantUsage{}
		t.usage[namespace] = u
	}
	u.holders++
	return u, sync.OnceFunc(func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if u.holders--; u.holders == 0 && t.usage[namespace] == u {
			delete(t.usage, namespace)
		}
	})
}

// keyLock serialises the work on one cluster; users counts who holds or
// waits for it, so that it is dropped when nobody does.
type keyLock struct {
	mu    sync.Mutex
	users int
}

// lock takes the lock of one cluster and returns its release.
func (t *targets) lock(key types.NamespacedName) func() {
	t.mu.Lock()
	if t.keys == nil {
		t.keys = map[types.NamespacedName]*keyLock{}
	}
	k, ok := t.keys[key]
	if !ok {
		k = &keyLock{}
		t.keys[key] = k
	}
	k.users++
	t.mu.Unlock()
	k.mu.Lock()
	return func() {
		k.mu.Unlock()
		t.mu.Lock()
		k.users--
		if k.users == 0 {
			delete(t.keys, key)
		}
		t.mu.Unlock()
	}
}

// verdict is what the rule said of one kubeconfig content: the decision on
// the document, and once its server was identified, the final one.
type verdict struct {
	sum      [sha256.Size]byte
	doc      *kubeconfig.Document
	document engine.KubeconfigDecision
	final    *engine.KubeconfigDecision
}

// current is whether the verdict is of this content and was given by the
// active bundle: a new bundle judges again.
func (v *verdict) current(sum [sha256.Size]byte, revision string) bool {
	if v == nil || v.sum != sum {
		return false
	}
	if revision == "" {
		return true
	}
	if v.final != nil {
		return v.final.Revision == revision
	}
	return v.document.Revision == revision
}

// targetFor is the API server a cluster judges. A remote one is started (its
// cache synced and its CSR events wired to this cluster) on first use and
// restarted when the kubeconfig changes; a new bundle judges its kubeconfig
// again, and stops it if it is now refused.
func (r *Reconciler) targetFor(ctx context.Context, c *ichorv1alpha1.TalosCluster) (*target, error) {
	key := client.ObjectKeyFromObject(c)
	if c.Spec.KubeconfigRef == nil {
		r.targets.stop(key)
		if !r.LocalClusters.Judges(c) {
			return nil, ErrLocalClusterNotNamed
		}
		return r.localTarget(), nil
	}
	data, err := r.readKubeconfig(ctx, c)
	if err != nil {
		if transientRead(ctx, err) && r.targets.readFailing(key, r.Clock.Now()) {
			return nil, &kubeconfigReadFailingError{err: err}
		}
		return nil, err
	}
	r.targets.readAnswered(key)
	unlock := r.targets.lock(key)
	defer unlock()
	sum, revision := sha256.Sum256(data), r.revision()
	r.targets.mu.Lock()
	t := r.targets.remote[key]
	v := r.targets.verdicts[key]
	current := v.current(sum, revision)
	r.targets.mu.Unlock()
	if t != nil && bytes.Equal(t.kubeconfig, data) && current {
		return t, nil
	}
	if current && v.final != nil && !v.final.Allowed {
		// Refused under this bundle: said again without a start, which
		// would only wait for room to say it (review 209 F1: the
		// cluster flipped to RemoteWatchStarting while the room was
		// busy).
		return nil, &KubeconfigRefusedError{Decision: *v.final}
	}
	if t != nil && !bytes.Equal(t.kubeconfig, data) {
		// Another content: the watch with the old credentials ends now,
		// whenever the new one starts.
		r.targets.dropIf(key, t)
		t = nil
	}
	// Judging the content asks the server who it is, and starting its
	// watch lists its CSRs: both wait for the tenant's server.
	end, err := r.targets.starts.begin(key, sum, revision, r.Clock.Now(), r.TenantRequestTimeout/6)
	if err != nil {
		return nil, err
	}
	outcome := errStartPanicked
	defer func() { end(r.Clock.Now(), r.TenantRequestTimeout, outcome) }()
	t, err = r.judgeAndStart(ctx, c, t, sum, data, revision)
	outcome = err
	var refused *KubeconfigRefusedError
	if errors.As(err, &refused) {
		// The rule's refusal is kept with the content, not retried.
		outcome = nil
	}
	return t, err
}

// errStartPanicked is the outcome of a start that did not return: it backs
// off as a failure does, and gives its room back.
var errStartPanicked = errors.New("the start of the watch panicked")

// ownFailure is a failed start whose cause is on this side (the rule's
// evaluation, a broken bundle), not the tenant's server: it gives its room
// back, and the cluster is started again after the request bound, never
// doubled, its tenant's failures before kept as they were (review 11 L4).
// It still waits: the rule's second evaluation weighs what the tenant's
// server presented, and every reconcile (which the tenant can cause)
// would otherwise probe its server again.
type ownFailure struct{ error }

func (f ownFailure) Unwrap() error { return f.error }

// judgeAndStart judges a kubeconfig content and starts the watch of the
// server it names, or keeps t, the cluster's watch, if it is of that content.
func (r *Reconciler) judgeAndStart(ctx context.Context, c *ichorv1alpha1.TalosCluster, t *target, sum [sha256.Size]byte, data []byte, revision string) (*target, error) {
	key := client.ObjectKeyFromObject(c)
	v, err := r.judgeKubeconfig(ctx, c, sum, data, revision)
	if t != nil && (err != nil || !bytes.Equal(t.kubeconfig, data)) {
		// Another content, or this one no longer allowed (or not
		// identified): its watch stops.
		t.stop()
		r.targets.mu.Lock()
		delete(r.targets.remote, key)
		r.targets.mu.Unlock()
		t = nil
	}
	if err != nil {
		return nil, err
	}
	if t != nil {
		return t, nil
	}
	t, err = r.startRemoteFrom(ctx, key, v.doc)
	if err != nil {
		return nil, err
	}
	// What was refused a record in another API server is not this one's
	// to say.
	r.refusedRecords.forget(key)
	t.kubeconfig = data
	r.targets.mu.Lock()
	if r.targets.remote == nil {
		r.targets.remote = map[types.NamespacedName]*target{}
	}
	r.targets.remote[key] = t
	r.targets.mu.Unlock()
	var stopped sync.Once
	t.limits.exceededAfterStart(func(err error) {
		stopped.Do(func() { r.remoteExceeded(key, t, sum, revision, err) })
	})
	return t, nil
}

// remoteExceeded stops the watch of a cluster whose API server grew past the
// limits the manager keeps of a tenant's servers after the watch started,
// or sent what no API server sends.
// The start's failure is counted (its backoff), and the cluster reconciled,
// which says why on it, as a start that failed for it would. A crossing
// between the start and this being armed is not lost: client-go lists
// again, and the list is counted.
func (r *Reconciler) remoteExceeded(key types.NamespacedName, t *target, sum [sha256.Size]byte, revision string, cause error) {
	parent := r.runCtx
	if parent == nil {
		parent = context.Background()
	}
	r.targets.mu.Lock()
	current := r.targets.remote[key] == t
	if current {
		// Only the cluster's current watch counts a failure: one already
		// replaced (its kubeconfig rotated) or dropped says nothing of
		// the next.
		r.targets.starts.fail(key, sum, revision, r.Clock.Now(), r.TenantRequestTimeout, fmt.Errorf("watch CSRs of cluster %s: %w", key, cause))
		t.stop()
		delete(r.targets.remote, key)
	}
	r.targets.mu.Unlock()
	if !current {
		return
	}
	log.FromContext(parent).Error(cause, "the watch of a remote API server is stopped: it would bring more than the manager keeps of a tenant's servers, sent what no API server sends, is now at an address in a denied network, or does not answer", "taloscluster", key)
	// Told from the cache's own list or watch: the ask must not wait
	// there for a reconcile worker.
	go r.rejudgeCluster(parent, key)
}

// startRemoteFrom starts the watch of the API server an allowed kubeconfig
// names: the server's identity is checked (RESTConfig), then its CSRs are
// watched.
func (r *Reconciler) startRemoteFrom(ctx context.Context, key types.NamespacedName, doc *kubeconfig.Document) (*target, error) {
	// A tenant is the clusters with a kubeconfigRef in one namespace.
	cfg, err := r.LocalAPIServer.RESTConfig(ctx, key.Namespace, doc, r.AllowInsecureKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of cluster %s: %w", key, err)
	}
	return r.startRemote(ctx, key, cfg)
}

// gateOf is the gate of the cluster (see tenantGate), kept until the
// cluster is forgotten (targets.stop), so that a new watch of its server
// keeps the breaker.
func (r *Reconciler) gateOf(key types.NamespacedName) *tenantGate {
	r.targets.mu.Lock()
	defer r.targets.mu.Unlock()
	if r.targets.gates == nil {
		r.targets.gates = map[types.NamespacedName]*tenantGate{}
	}
	g, ok := r.targets.gates[key]
	if !ok {
		clk := r.Clock
		if clk == nil {
			clk = clock.RealClock{}
		}
		if r.targets.pool == nil {
			// Every tenant together holds at most half the workers, one
			// at most a quarter: the local API server's clusters keep
			// the rest.
			r.targets.pool = newRemotePool(max(1, r.MaxConcurrentDecisions/2))
			r.targets.pool.maxHeld, r.targets.pool.maxHeldBytes = r.TenantMaxCSRs, r.TenantMaxCSRBytes
		}
		g = r.targets.pool.newGate(clk, key.Namespace, max(1, r.MaxConcurrentDecisions/4), r.TenantRequestTimeout/3)
		r.targets.gates[key] = g
	}
	return g
}

// currentTarget is the API server a cluster judges, as its last reconcile
// set it up (targetFor); nil when it judges none, or its watch is not
// started.
func (r *Reconciler) currentTarget(c *ichorv1alpha1.TalosCluster) *target {
	if c.Spec.KubeconfigRef == nil {
		if !r.LocalClusters.Judges(c) {
			return nil
		}
		return r.localTarget()
	}
	key := client.ObjectKeyFromObject(c)
	r.targets.mu.Lock()
	defer r.targets.mu.Unlock()
	return r.targets.remote[key]
}

// targetStillAllowed is whether a worker may decide through a cluster's
// remote target: its Secret, read again now (as a reconcile did before each
// decision, review 6 M1), still holds the content the target was started
// with, and the rule's verdict on it is of the active bundle. If not, nothing
// is decided and the cluster is reconciled, to judge the kubeconfig again
// (its reconcile queues the requests again). An unreadable Secret or another
// content also ends the watch at once: its credentials are no longer the
// operator's word.
func (r *Reconciler) targetStillAllowed(ctx context.Context, c *ichorv1alpha1.TalosCluster, t *target) bool {
	key := client.ObjectKeyFromObject(c)
	if r.targets.failingReads(key) {
		// The cluster's reconcile reads the Secret every few seconds
		// meanwhile: a worker adds no read to an API server that does
		// not answer (review 194).
		return false
	}
	data, err := r.readKubeconfig(ctx, c)
	if err != nil && transientRead(ctx, err) {
		// No word on the Secret (the API server busy or unreachable for
		// a moment): nothing is decided without one, and the cluster's
		// reconcile, which reads it again, says when the watch ends
		// (kubeconfigReadTolerance). Ending the watch at once would have
		// a moment's failure list the tenant's CSRs again (review 191 F4).
		log.FromContext(ctx).Info("the cluster's kubeconfig Secret cannot be read now: nothing is decided until it is", "error", err)
		r.rejudgeCluster(ctx, key)
		return false
	}
	if err != nil || !bytes.Equal(data, t.kubeconfig) {
		log.FromContext(ctx).Info("the cluster's kubeconfigRef changed or cannot be read: it is judged again before any decision", "error", err)
		// Asked before the watch ends: ending it ends this turn's
		// context, which the ask waits on.
		r.rejudgeCluster(ctx, key)
		r.targets.dropIf(key, t)
		return false
	}
	revision := r.revision()
	r.targets.mu.Lock()
	// The final verdict, which judged the server's identity, and allowed:
	// a new bundle's verdict on the document alone (its probe under way)
	// or its refusal decides nothing (the hostile review of 2026-12-05).
	v := r.targets.verdicts[key]
	current := r.targets.remote[key] == t && v.current(sha256.Sum256(data), revision) && v.final != nil && v.final.Allowed
	r.targets.mu.Unlock()
	if !current {
		r.rejudgeCluster(ctx, key)
	}
	return current
}

// rejudgeCluster has a cluster reconciled (without a controller, as in unit
// tests, it is left to its resync).
func (r *Reconciler) rejudgeCluster(ctx context.Context, key types.NamespacedName) {
	if r.rejudge == nil {
		return
	}
	select {
	case r.rejudge <- event.TypedGenericEvent[types.NamespacedName]{Object: key}:
	case <-ctx.Done():
	}
}

// judgeKubeconfig asks the rule about a kubeconfig, once per content and
// bundle revision: first the document, with no connection made; when its
// fields pass, the identity of its server (a TLS handshake that sends
// nothing), and the rule again. A server that cannot be reached is an error,
// tried again later, and costs no new decision. The caller holds the
// cluster's lock, not r.targets.mu.
func (r *Reconciler) judgeKubeconfig(ctx context.Context, c *ichorv1alpha1.TalosCluster, sum [sha256.Size]byte, data []byte, revision string) (*verdict, error) {
	key := client.ObjectKeyFromObject(c)
	r.targets.mu.Lock()
	v := r.targets.verdicts[key]
	r.targets.mu.Unlock()
	if !v.current(sum, revision) {
		v = &verdict{sum: sum, doc: kubeconfig.Read(data)}
		d, err := r.Engine.Kubeconfig(ctx, r.kubeconfigInput(c, v.doc, nil))
		if err != nil {
			return nil, ownFailure{fmt.Errorf("kubeconfig of cluster %s: %w", key, err)}
		}
		v.document = d
		if !d.CheckIdentity {
			v.final = &d
			r.kubeconfigRefused(ctx, c, d)
		}
		r.keepVerdict(key, v)
	}
	if v.final == nil {
		id, err := r.LocalAPIServer.Probe(ctx, v.doc)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig of cluster %s: the identity of its server cannot be checked: %w", key, err)
		}
		d, err := r.Engine.Kubeconfig(ctx, r.kubeconfigInput(c, v.doc, &id))
		if err != nil {
			return nil, ownFailure{fmt.Errorf("kubeconfig of cluster %s: %w", key, err)}
		}
		if d.CheckIdentity {
			return nil, ownFailure{fmt.Errorf("kubeconfig of cluster %s: decision %s asks for the server's identity, which it was given: the bundle is broken", key, d.DecisionID)}
		}
		final := *v
		final.final = &d
		v = &final
		r.kubeconfigRefused(ctx, c, d)
		r.keepVerdict(key, v)
	}
	if !v.final.Allowed {
		return nil, &KubeconfigRefusedError{Decision: *v.final}
	}
	return v, nil
}

func (r *Reconciler) keepVerdict(key types.NamespacedName, v *verdict) {
	r.targets.mu.Lock()
	defer r.targets.mu.Unlock()
	if r.targets.verdicts == nil {
		r.targets.verdicts = map[types.NamespacedName]*verdict{}
	}
	r.targets.verdicts[key] = v
}

func (r *Reconciler) kubeconfigInput(c *ichorv1alpha1.TalosCluster, doc *kubeconfig.Document, id *kubeconfig.Identity) engine.KubeconfigInput {
	return engine.KubeconfigInput{
		Cluster:        engine.KubeconfigCluster{Namespace: c.Namespace, Name: c.Name},
		Kubeconfig:     doc.Facts,
		Settings:       engine.KubeconfigSettings{AllowInsecureSkipTLSVerify: r.AllowInsecureKubeconfig},
		ServerIdentity: id,
	}
}

// kubeconfigRefused writes the Event of a refused kubeconfig, once per
// content (the caller decides once per content).
func (r *Reconciler) kubeconfigRefused(ctx context.Context, c *ichorv1alpha1.TalosCluster, d engine.KubeconfigDecision) {
	if d.Allowed {
		return
	}
	log.FromContext(ctx).Info("the cluster's kubeconfigRef is refused", "decision_id", d.DecisionID, "reasons", d.Reasons.Codes())
	if r.Recorder != nil {
		r.Recorder.Eventf(c, nil, corev1.EventTypeWarning, ReasonKubeconfigRefused, engine.EventAction("Decide", d.Reasons.Codes()...), "%s", d.EventNote())
	}
}

func (r *Reconciler) readKubeconfig(ctx context.Context, c *ichorv1alpha1.TalosCluster) ([]byte, error) {
	ref := c.Spec.KubeconfigRef
	k := ref.Key
	if k == "" {
		k = ichorv1alpha1.DefaultKubeconfigKey
	}
	// Bounded: while it fails for want of an answer the watch is kept
	// (kubeconfigReadTolerance), and a read held by a silent connection
	// would stretch that.
	ctx, cancel := context.WithTimeout(ctx, kubeconfigReadTimeout)
	defer cancel()
	var secret corev1.Secret
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: ref.Name}, &secret); err != nil {
		return nil, fmt.Errorf("kubeconfig of cluster %s/%s: get Secret %q: %w", c.Namespace, c.Name, ref.Name, clustersecrets.Forbidden(err, c.Namespace))
	}
	// Whoever may write a TalosCluster but not the Secret would otherwise
	// have another cluster's API server judged with this cluster's
	// machines (and its CSRs cached again, against the tenant's bounds).
	if err := clustersecrets.CheckClaim(&secret, c.Name, r.SecretsClaims); err != nil {
		return nil, fmt.Errorf("kubeconfig of cluster %s/%s: Secret %q: %w", c.Namespace, c.Name, ref.Name, err)
	}
	data, ok := secret.Data[k]
	if !ok {
		return nil, fmt.Errorf("kubeconfig of cluster %s/%s: Secret %q has no key %q", c.Namespace, c.Name, ref.Name, k)
	}
	return data, nil
}

// startRemote watches the API server of cfg, built from the allow-listed
// data of a kubeconfig the rule allowed.
func (r *Reconciler) startRemote(ctx context.Context, key types.NamespacedName, cfg *rest.Config) (*target, error) {
	scheme := runtime.NewScheme()
	if err := certificatesv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// The one kind watched there is known: no discovery is asked of the
	// tenant's server (a request no context bounds).
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest"), meta.RESTScopeRoot)
	usage, unhold := r.targets.holdUsage(key.Namespace)
	limits := remoteLimits{
		maxCSRs: r.TenantMaxCSRs, maxBytes: r.TenantMaxCSRBytes, cluster: key, tenant: usage, caches: &countedSet{},
		exceeded: &atomic.Pointer[error]{}, afterStart: &atomic.Pointer[func(error)]{},
	}
	started := false
	defer func() {
		if !started {
			// The watch never ran: nothing of it counts.
			limits.release()
			unhold()
		}
	}()
	cl, err := cluster.New(cfg, func(o *cluster.Options) {
		o.Scheme = scheme
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mapper, nil }
		o.Cache = cache.Options{
			ByObject:         map[client.Object]cache.ByObject{&certificatesv1.CertificateSigningRequest{}: {}},
			DefaultTransform: cache.TransformStripManagedFields(),
			NewInformer:      limits.newInformer,
		}
	})
	if err != nil {
		return nil, fmt.Errorf("API server of cluster %s: %w", key, err)
	}
	if err := cl.GetFieldIndexer().IndexField(ctx, &certificatesv1.CertificateSigningRequest{}, IndexSignerName, func(o client.Object) []string {
		return []string{o.(*certificatesv1.CertificateSigningRequest).Spec.SignerName}
	}); err != nil {
		return nil, fmt.Errorf("index CSRs of cluster %s: %w", key, err)
	}
	if err := addUndecidedIndex(ctx, cl.GetFieldIndexer()); err != nil {
		return nil, fmt.Errorf("index CSRs of cluster %s: %w", key, err)
	}
	// The clientset reads and writes single requests, each bounded; the
	// cache's watch is a stream, and has no such bound.
	bounded := rest.CopyConfig(cfg)
	bounded.Timeout = r.TenantRequestTimeout
	gate := r.gateOf(key)
	bounded.Wrap(gate.RoundTripper)
	clientset, err := kubernetes.NewForConfig(bounded)
	if err != nil {
		return nil, fmt.Errorf("API server of cluster %s: %w", key, err)
	}
	// The watch lives as long as the manager, not as this reconcile.
	parent := r.runCtx
	if parent == nil {
		parent = context.WithoutCancel(ctx)
	}
	runCtx, cancel := context.WithCancel(parent)
	started = true
	go func() {
		// What its caches held goes with them.
		defer unhold()
		defer limits.release()
		if err := cl.Start(runCtx); err != nil {
			log.FromContext(ctx).Error(err, "watch of a remote API server stopped", "taloscluster", key)
		}
	}()
	syncCtx, stop := context.WithTimeout(ctx, r.TenantRequestTimeout)
	defer stop()
	// A cache that did not sync: a limit the server crossed, told to the
	// limits, is why, and what the cluster must say; client-go says only
	// that it did not sync.
	unsynced := func(err error) (*target, error) {
		cancel()
		if why := limits.why(); why != nil {
			err = why
		}
		return nil, fmt.Errorf("watch CSRs of cluster %s: %w", key, err)
	}
	// Start the informer for CSRs, then wait for it. GetInformer would wait
	// for it itself, and fail with client-go's word alone, when the cache
	// has started first (the goroutine above): it does not wait.
	if _, err := cl.GetCache().GetInformer(syncCtx, &certificatesv1.CertificateSigningRequest{}, cache.BlockUntilSynced(false)); err != nil {
		return unsynced(err)
	}
	if !cl.GetCache().WaitForCacheSync(syncCtx) {
		return unsynced(errors.New("the cache did not sync"))
	}
	counts, names := &floodCounts{}, &nodeNames{}
	if r.controller != nil {
		// The request's requester is queued; the cluster is not reconciled.
		src := source.Kind(cl.GetCache(), &certificatesv1.CertificateSigningRequest{},
			csrEvents(counts, names, func(_ context.Context, csr *certificatesv1.CertificateSigningRequest) {
				r.enqueue(requester{cluster: key, username: csr.Spec.Username})
			}),
			kubeletServingEvents())
		if err := r.controller.Watch(src); err != nil {
			cancel()
			return nil, fmt.Errorf("watch CSRs of cluster %s: %w", key, err)
		}
		// The handler registers, and is told of every request the cache
		// holds, after Watch returns: the flood counts listed before then
		// could keep a request deleted meanwhile, and a handler that never
		// registers would leave them as listed.
		// WaitForSync says nothing went wrong when its context was
		// cancelled: that is no sync either.
		if err := cmp.Or(src.WaitForSync(syncCtx), syncCtx.Err()); err != nil {
			cancel()
			return nil, fmt.Errorf("watch CSRs of cluster %s: %w", key, err)
		}
	} else {
		// No events to keep the counts by: listed for every count.
		counts = nil
	}
	log.FromContext(ctx).Info("watching the cluster's own API server for kubelet serving CSRs", "host", cfg.Host)
	return &target{
		reader: cl.GetClient(), clientset: clientset, names: names, counts: counts, gate: gate, limits: limits, watch: runCtx, cancel: cancel,
		stopped: sync.OnceFunc(func() { r.wakeTenant(key) }),
	}, nil
}

// wakeTenant has a cluster of key's tenant that was refused for what the
// tenant's servers held together reconciled now, rather than after its
// backoff (remoteStarts.wake): key's watch has ended, and its share with
// it. Called with r.targets.mu held, or not: it neither takes it nor waits.
func (r *Reconciler) wakeTenant(key types.NamespacedName) {
	parent := r.runCtx
	if parent == nil {
		parent = context.Background()
	}
	if sibling, ok := r.targets.starts.wake(key, r.Clock.Now()); ok {
		go r.rejudgeCluster(parent, sibling)
	}
}

// stop ends a remote target's watch. What its cache held is given back to
// its tenant now, not when the cache has wound down: a watch started again
// at once is not weighed against its predecessor.
func (t *target) stop() {
	t.cancel()
	t.limits.release()
	if t.stopped != nil {
		t.stopped()
	}
}

// stop ends the cluster's watch and forgets the rule's verdict on its
// kubeconfig.
func (t *targets) stop(key types.NamespacedName) {
	t.drop(key, true)
}

// dropIf ends the cluster's watch if it is still t (a reconcile may have
// started another meanwhile). It takes no cluster lock: a worker does not
// wait behind a reconcile's probe of the server.
func (t *targets) dropIf(key types.NamespacedName, rt *target) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.remote[key] == rt {
		rt.stop()
		delete(t.remote, key)
	}
}

// kubeconfigReadTolerance is how long a cluster's watch is kept while its
// kubeconfig Secret cannot be read for want of an answer (transientRead):
// nothing is decided through it meanwhile, and past it the watch, and the
// tenant's credentials it holds, end as for a Secret gone.
const kubeconfigReadTolerance = time.Minute

// kubeconfigReadTimeout bounds one read of a cluster's kubeconfig Secret.
const kubeconfigReadTimeout = 10 * time.Second

// kubeconfigReadRetry is how soon a cluster whose kubeconfig Secret could not
// be read is reconciled again, within kubeconfigReadTolerance.
const kubeconfigReadRetry = 5 * time.Second

// kubeconfigReadFailingError is targetFor's error while a cluster's
// kubeconfig Secret cannot be read for want of an answer, within
// kubeconfigReadTolerance of the first such read: the watch is kept, and
// the cluster reconciled again soon.
type kubeconfigReadFailingError struct{ err error }

func (e *kubeconfigReadFailingError) Error() string {
	return "the kubeconfig Secret cannot be read now, its watch is kept a while: " + e.err.Error()
}

func (e *kubeconfigReadFailingError) Unwrap() error { return e.err }

// readFailing notes a read of a cluster's kubeconfig Secret that failed for
// want of an answer, at now, and says whether its watch is kept through it:
// while it runs, and for kubeconfigReadTolerance since such reads began.
func (t *targets) readFailing(key types.NamespacedName, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.remote[key] == nil {
		delete(t.readFailures, key)
		return false
	}
	since, ok := t.readFailures[key]
	if !ok {
		if t.readFailures == nil {
			t.readFailures = map[types.NamespacedName]time.Time{}
		}
		t.readFailures[key] = now
		return true
	}
	return now.Sub(since) < kubeconfigReadTolerance
}

// failingReads is whether the reads of a cluster's kubeconfig Secret fail
// for want of an answer (readFailing).
func (t *targets) failingReads(key types.NamespacedName) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.readFailures[key]
	return ok
}

// readAnswered notes a read of a cluster's kubeconfig Secret that was
// answered.
func (t *targets) readAnswered(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.readFailures, key)
}

// drop ends the cluster's watch, so that no worker decides through it (see
// passFor), and forgets the verdict too when forget is set. A verdict kept is
// one of a content: a refusal is not judged (and logged) again until the
// Secret or the bundle changes.
func (t *targets) drop(key types.NamespacedName, forget bool) {
	unlock := t.lock(key)
	defer unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if rt, ok := t.remote[key]; ok {
		rt.stop()
		delete(t.remote, key)
	}
	if forget {
		delete(t.verdicts, key)
		delete(t.readFailures, key)
		t.starts.forget(key)
		if g, ok := t.gates[key]; ok {
			t.pool.forget(g)
			delete(t.gates, key)
		}
	}
}

// refusal is the reason and message of the condition that says why a
// cluster's API server is not judged.
func refusal(cause error) (reason, message string) {
	// An error quotes what the tenant's Secret and server said (a certificate's
	// names, a server's answer): clipped and escaped as a rule's reasons are.
	reason, message = ReasonKubeconfigUnreadable, engine.Clip(cause.Error(), "", engine.MaxConditionMessage)
	var refused *KubeconfigRefusedError
	var deferred *startDeferredError
	switch {
	case errors.As(cause, &deferred) && deferred.cause == nil:
		reason = ReasonRemoteWatchStarting
	case errors.As(cause, new(ownFailure)):
		reason = ReasonPolicyEvaluationFailed
	case errors.Is(cause, ErrLocalClusterNotNamed):
		reason = ReasonLocalClusterNotNamed
	case errors.As(cause, new(limitError)):
		reason = ReasonRemoteServerTooLarge
	case errors.As(cause, new(invalidAnswerError)):
		reason = ReasonRemoteServerInvalid
	case errors.As(cause, new(*netguard.RefusedError)):
		reason = ReasonRemoteServerAddressRefused
	case errors.As(cause, &refused):
		reason, message = ReasonKubeconfigRefused, refused.Decision.ConditionMessage()
	}
	return reason, message
}

// kubeconfigUnanswered is the reconcile of a cluster whose kubeconfig
// Secret has had no answer for a moment: its watch is kept
// (kubeconfigReadTolerance), nothing is decided through it until the
// Secret is read again (targetStillAllowed), and the conditions stay as the
// last answer left them (review 191 F4), but for the latch, removed if
// verification was switched off meanwhile.
func (r *Reconciler) kubeconfigUnanswered(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, cause error) (reconcile.Result, error) {
	log.FromContext(ctx).WithValues("taloscluster", client.ObjectKeyFromObject(cluster)).Info("the cluster's kubeconfig Secret cannot be read now; its watch is kept a while", "error", cause.Error())
	before := cluster.DeepCopy()
	if unlatchIfOff(cluster) && statusChanged(before.Status, cluster.Status) {
		if err := r.Client.Status().Patch(ctx, cluster, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, fmt.Errorf("remove the latch of kubelet verification: %w", err)
		}
	}
	return reconcile.Result{RequeueAfter: kubeconfigReadRetry}, nil
}

// refuseTarget says on the cluster why its API server is not judged.
func (r *Reconciler) refuseTarget(ctx context.Context, c *ichorv1alpha1.TalosCluster, cause error) error {
	reason, message := refusal(cause)
	before := c.DeepCopy()
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{
		Type:               ichorv1alpha1.ConditionKubeletServingCertificates,
		Status:             metav1.ConditionFalse,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: c.Generation,
	})
	// What the requests were (a flood withheld) is of a look no longer
	// made: not left saying it for a cluster that judges nothing (review
	// 169).
	meta.RemoveStatusCondition(&c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingRequests)
	unlatchIfOff(c)
	setReady(c, reachability{})
	if !statusChanged(before.Status, c.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, c, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("update cluster conditions: %w", err)
	}
	return nil
}
