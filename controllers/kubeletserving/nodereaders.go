package kubeletserving

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
)

// NodeReaders keeps one Talos identity reader per cluster, made from the
// cluster's OS CA, so the reader's short-lived os:reader credential is reused
// across requests until it nears expiry.
type NodeReaders struct {
	// Reader reads the secrets Secret (uncached).
	Reader client.Reader
	// SecretsClaims is what the secrets Secret must say of the cluster
	// before its OS CA signs the readers' credential (clustersecrets.Claims):
	// by default that it names the cluster.
	SecretsClaims clustersecrets.Claims
	// Lifetime of the reader's own credential, as the policy caps it; after
	// the readers are first used, SetLifetime changes it.
	Lifetime time.Duration
	// Timeout bounds one identity read.
	Timeout time.Duration
	// Denied are the networks no read or watch of a machine's endpoint
	// connects to (talosnode.Options.Denied).
	Denied netguard.Denied
	// Watch keeps a live watch of the identity of each machine expected to
	// ask for a certificate soon (Keep), so that its decision reads no node
	// (talosnode.Watches); WatchMaxAge is the watches' freshness bound (zero:
	// talosnode.DefaultWatchMaxAge).
	Watch       bool
	WatchMaxAge time.Duration
	// WatchMax bounds the watches over all clusters (DefaultWatchMax if
	// zero): each holds a connection, three streams and their goroutines.
	// A cluster's machines beyond the room the others leave are read at
	// decision time.
	WatchMax int
	// UnreachableAfter is how long a machine's reads must have failed
	// without a success before it counts as unreachable for the cluster's
	// Ready (defaultUnreachableAfter if zero): a node that is joining may
	// ask before its Talos API answers, and that is no fault of the cluster.
	UnreachableAfter time.Duration

	// watchEnds counts the watches' ends by cause (RegisterWatchMetrics).
	watchEnds atomic.Pointer[prometheus.CounterVec]

	mu      sync.Mutex
	readers map[types.NamespacedName]*cachedReader
	// reads are the outcome of each machine's last identity read, by
	// cluster and machine: whether Ichor reaches the cluster's Talos API is
	// part of its Ready.
	reads map[types.NamespacedName]map[string]readOutcome
	// looked are when reachability was first asked of each cluster since
	// its outcomes were last dropped (Forget): for readFreshness after it,
	// reads that say nothing yet do not take back a Ready that earlier
	// reads made False (review 247, F2).
	looked map[types.NamespacedName]time.Time
	// forgotten are the clusters Forget was told of since the serving
	// reconcile last served them (Serving, Keep): a reader made for one is
	// used for its read and not kept, so that a cluster removed (or no
	// longer served here) leaves no reader, and no CA key, behind, even when
	// a caller still holds it, read before (an audit pass, a decision under
	// way), or it was removed while its bundle was being read.
	// Each is kept for forgottenFor at most, so that the names of clusters
	// deleted long ago are not kept for the life of the process.
	forgotten map[types.NamespacedName]time.Time
	// begun is, by served cluster, the latest-begun read of its secrets
	// bundle that has been answered (read, gone or refused; not a read that
	// got no answer): a read begun before it and answered after it says an
	// older bundle, and changes nothing (review 193 L1, review 200 F1,
	// review 201 F1-F3).
	begun map[types.NamespacedName]bundleRead
}

// bundleRead is an answered read of a cluster's secrets bundle: when it
// began, and whether its answer was that there is no usable bundle.
type bundleRead struct {
	at     time.Time
	failed bool
}

// forgottenFor is how long a forgotten cluster's readers are not kept
// unless it is served again: far longer than any caller holds a cluster it
// read (an audit pass, a decision).
const forgottenFor = time.Hour

// readOutcome is a machine's last identity read: when, its error ("" when it
// was read), and since when its reads have failed without a success.
type readOutcome struct {
	at, failingSince time.Time
	err              string
}

// defaultUnreachableAfter is UnreachableAfter's default.
const defaultUnreachableAfter = time.Minute

type cachedReader struct {
	// caCert and caKey are the OS CA the reader was made with: a change of
	// either makes it anew (a key changed alone, too: review 160).
	caCert, caKey []byte
	reader        *talosnode.Reader
	// watches are the reader's live watches (nil when NodeReaders.Watch is
	// off); they end with the reader.
	watches *talosnode.Watches
	// read is when the secrets bundle was last read, secretsRef where from,
	// uid the cluster's (one made anew under the same name starts afresh).
	read       time.Time
	secretsRef ichorv1alpha1.SecretsBundleReference
	uid        types.UID
	// k8sRoots are the cluster's Kubernetes CAs as of the bundle's last
	// read (kubernetesRoots), or k8sErr why there are none.
	k8sRoots kubeRoots
	k8sErr   error
	// want is how many of the cluster's machines are expected to ask, kept
	// how many of those are watched (Keep).
	want, kept int
}

// secretsFreshness is how long a cluster's secrets bundle, read once, is
// used before it is read again: a decision does not cost a Secret read, and a
// rotated OS CA is in use within this time.
const secretsFreshness = 10 * time.Second

// get returns the reader of a cluster, made anew when its OS CA changed.
func (n *NodeReaders) get(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) (*cachedReader, error) {
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Name}
	n.mu.Lock()
	if c, ok := n.readers[key]; ok && c.uid == cluster.UID && c.secretsRef == cluster.Spec.SecretsRef && time.Since(c.read) < secretsFreshness {
		n.mu.Unlock()
		return c, nil
	}
	n.mu.Unlock()
	// Two reads of the bundle may be under way at once (a decision and the
	// reconcile): the one begun last says the bundle as it is, and one begun
	// before it and answered after it puts back neither what it read, which
	// may be the CAs before a rotation or a bundle since taken away, nor
	// its failure (review 193 L1, review 200 F1).
	started := time.Now()
	bundles, err := clustersecrets.Load(ctx, n.Reader, cluster, n.SecretsClaims)
	if err != nil {
		if transientRead(ctx, err) {
			// No answer about the bundle (the API server busy, the read
			// cut short): nothing is known to have changed.
			return nil, err
		}
		// The bundle taken away (or refused) stops the watches made with
		// it: they would go on signing credentials from the key in
		// memory.
		n.dropReaderReadBefore(key, started)
		return nil, err
	}
	os := bundles.Current.Certs.OS
	k8sRoots, k8sErr := kubernetesRoots(bundles)
	n.mu.Lock()
	defer n.mu.Unlock()
	cached, ok := n.readers[key]
	last, later := n.answeredAfterLocked(key, started)
	switch {
	case later && ok && cached.uid == cluster.UID && cached.secretsRef == cluster.Spec.SecretsRef:
		return cached, nil
	case later && !ok && last.failed:
		// The later read found the bundle gone or refused: what this one
		// read is not used.
		return nil, fmt.Errorf("talos identity reader of cluster %s: %w", key, errBundleReadAgain)
	case ok && !later && cached.uid == cluster.UID && bytes.Equal(cached.caCert, os.Crt) && bytes.Equal(cached.caKey, os.Key):
		n.answeredLocked(key, started, false)
		cached.read, cached.secretsRef = time.Now(), cluster.Spec.SecretsRef
		cached.k8sRoots, cached.k8sErr = k8sRoots, k8sErr
		return cached, nil
	}
	reader, err := talosnode.NewReader(talosnode.Options{
		CACertPEM:           os.Crt,
		CAKeyPEM:            os.Key,
		CertificateLifetime: n.Lifetime,
		Timeout:             n.Timeout,
		Denied:              n.Denied,
		// A requester's several requests for a hanging node share one
		// read's timeout, and the next look (unreadableRecheck) reads
		// again. A node that keeps hanging is read less and less often,
		// at least once a minute (one read at a time): with many such
		// nodes, the workers are the answering nodes' (at 10 s a read,
		// one a worker about 10 s of every 64 to 70); a node back from
		// hanging waits up to a minute for its next read.
		HoldTimedOut:    unreadableRecheck - time.Millisecond,
		HoldTimedOutMax: hangingRecheckMax,
	})
	if err != nil {
		// An OS CA the reader refuses (its key not the certificate's, a
		// weak key): the watches made with the CA before end, as for a
		// bundle taken away, rather than go on signing credentials from
		// the old key in memory and dialling machines no longer kept
		// (review 159). A later read's reader stays: it is not this CA's.
		if !later {
			n.answeredLocked(key, started, true)
			if old, ok := n.readers[key]; ok && old.watches != nil {
				go old.watches.Stop()
			}
			delete(n.readers, key)
		}
		return nil, fmt.Errorf("talos identity reader of cluster %s: %w", key, err)
	}
	c := &cachedReader{
		caCert: os.Crt, caKey: os.Key, reader: reader, read: time.Now(), secretsRef: cluster.Spec.SecretsRef, uid: cluster.UID,
		k8sRoots: k8sRoots, k8sErr: k8sErr,
	}
	if _, ok := n.forgotten[key]; ok || later {
		// Used for this read and not kept: the cluster is forgotten, or
		// a later read was answered (of another cluster of the name made
		// anew, another secretsRef, or one kept and since let go: a
		// lifetime changed).
		return c, nil
	}
	n.answeredLocked(key, started, false)
	if n.Watch {
		if c.watches, err = reader.Watches(talosnode.WatchOptions{MaxAge: n.WatchMaxAge, Ended: n.watchEnded}); err != nil {
			// Reads at decision time, as with --talos-watch=false.
			log.FromContext(ctx).Error(err, "the cluster's machines are not watched", "taloscluster", key)
		}
	}
	if n.readers == nil {
		n.readers = map[types.NamespacedName]*cachedReader{}
	}
	// A rotated OS CA: the watches made with the old one end.
	if old, ok := n.readers[key]; ok && old.watches != nil {
		go old.watches.Stop()
	}
	n.readers[key] = c
	return c, nil
}

// Get returns the identity reader of a cluster, made anew when its OS CA
// changed.
func (n *NodeReaders) Get(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) (*talosnode.Reader, error) {
	c, err := n.get(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return c.reader, nil
}

// kubernetesRoots are the Kubernetes CAs of a cluster's secrets bundle
// (clustersecrets.Bundles.KubernetesCAs).
func kubernetesRoots(bundles clustersecrets.Bundles) (kubeRoots, error) {
	pool, id, err := bundles.KubernetesCAs()
	if err != nil {
		return kubeRoots{}, err
	}
	return kubeRoots{pool: pool, id: id}, nil
}

// kubeRoots are a cluster's Kubernetes CAs, and what tells them from others
// (a digest of their PEM): a certificate refused against some CAs is judged
// again against others.
type kubeRoots struct {
	pool *x509.CertPool
	id   string
}

// errBundleReadAgain is get's error for a read of a cluster's secrets
// bundle answered after one begun later failed: the bundle it read may be
// gone, and its caller reads again at its next look.
var errBundleReadAgain = errors.New("its secrets bundle was read again while this read was under way, and is not in use now")

// answeredAfterLocked is the latest-begun answered read of the cluster's
// bundle, and whether it began after started. n.mu is held.
func (n *NodeReaders) answeredAfterLocked(key types.NamespacedName, started time.Time) (bundleRead, bool) {
	last, ok := n.begun[key]
	return last, ok && last.at.After(started)
}

// answeredLocked notes a read of the cluster's bundle begun at started as
// answered (failed: no usable bundle), unless the cluster is forgotten: the
// names of clusters let go are not kept (review 201 F3). n.mu is held.
func (n *NodeReaders) answeredLocked(key types.NamespacedName, started time.Time, failed bool) {
	if _, gone := n.forgotten[key]; gone {
		return
	}
	if n.begun == nil {
		n.begun = map[types.NamespacedName]bundleRead{}
	}
	n.begun[key] = bundleRead{at: started, failed: failed}
}

// errKubernetesCAUnusable is KubernetesRoots' error when the cluster's
// secrets bundle was read, but its Kubernetes CA cannot be used.
var errKubernetesCAUnusable = errors.New("its Kubernetes CA cannot be used")

// KubernetesRoots are the cluster's Kubernetes CAs (kubernetesRoots), from
// its secrets bundle as read for its identity reader: no Secret read of its
// own within secretsFreshness.
func (n *NodeReaders) KubernetesRoots(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) (kubeRoots, error) {
	c, err := n.get(ctx, cluster)
	if err != nil {
		return kubeRoots{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c.k8sErr != nil {
		return kubeRoots{}, fmt.Errorf("cluster %s/%s: %w: %w", cluster.Namespace, cluster.Name, errKubernetesCAUnusable, c.k8sErr)
	}
	return c.k8sRoots, nil
}

// Read is a machine's identity: from its live watch when it has one that is
// established, synced and younger than the bound, otherwise read from the
// node at once.
func (n *NodeReaders) Read(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, endpoint string) (talosnode.Identity, talosnode.Source, error) {
	c, err := n.get(ctx, cluster)
	if err != nil {
		return talosnode.Identity{}, talosnode.FromRead, err
	}
	if c.watches == nil {
		id, err := c.reader.Read(ctx, endpoint)
		return id, talosnode.FromRead, err
	}
	return c.watches.Read(ctx, endpoint)
}

// Keep watches these endpoints of the cluster's machines, the first ones
// first when WatchMax leaves no room for all, and no other of the cluster's
// (when Watch is on); an error is the cluster's secrets bundle's.
func (n *NodeReaders) Keep(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, endpoints []string) error {
	n.Serving(types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Name})
	if !n.Watch {
		return nil
	}
	c, err := n.get(ctx, cluster)
	if err != nil || c.watches == nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c.want = len(endpoints)
	c.kept = min(c.want, n.share(c))
	c.watches.Keep(endpoints[:c.kept])
	return nil
}

// share is how many watches the cluster may keep: its fair share of
// WatchMax among the clusters that want watches (none gets more than it
// wants, what one leaves is shared by the others), and no more than the
// others leave free until they give theirs back at their next Keep. A
// cluster of machines that never ask takes its share, not every watch.
// n.mu is held.
func (n *NodeReaders) share(c *cachedReader) int {
	total := n.WatchMax
	if total <= 0 {
		total = DefaultWatchMax
	}
	var wants []int
	free := total
	for _, other := range n.readers {
		if other.watches == nil || other.want == 0 {
			continue
		}
		wants = append(wants, other.want)
		if other != c {
			free -= other.kept
		}
	}
	return max(0, min(fairShare(wants, total, c.want), free))
}

// fairShare is the max-min fair share of total for a claimant wanting want
// among wants (want among them): the claims below an equal split are met
// whole, and what they leave is split among the others.
func fairShare(wants []int, total, want int) int {
	slices.Sort(wants)
	left, claimants := total, len(wants)
	for _, w := range wants {
		equal := left / claimants
		if w > equal {
			return min(want, equal)
		}
		if w == want {
			return want
		}
		left -= w
		claimants--
	}
	return want
}

// DefaultWatchMax is NodeReaders.WatchMax's default: a join of 1,000
// machines at once is watched whole, at about 180 MiB (docs/performance.md).
const DefaultWatchMax = 1000

// Stop ends every cluster's watches and waits until their connections are
// closed; the readers stay, so reads go to the nodes.
func (n *NodeReaders) Stop() {
	n.mu.Lock()
	var stopping []*talosnode.Watches
	for _, c := range n.readers {
		if c.watches != nil {
			stopping = append(stopping, c.watches)
		}
	}
	n.mu.Unlock()
	for _, w := range stopping {
		w.Stop()
	}
}

// WatchLive reports whether the endpoint of the cluster has a live watch
// (established, synced, younger than the bound).
func (n *NodeReaders) WatchLive(key types.NamespacedName, endpoint string) bool {
	n.mu.Lock()
	c, ok := n.readers[key]
	n.mu.Unlock()
	return ok && c.watches != nil && c.watches.Live(endpoint)
}

// watchEnded counts a watch's end by its cause, once RegisterWatchMetrics
// has made the counter.
func (n *NodeReaders) watchEnded(e talosnode.WatchEnd) {
	if c := n.watchEnds.Load(); c != nil {
		c.WithLabelValues(string(e)).Inc()
	}
}

// Watches is how many machines are watched, and how many of those watches
// are live (established, synced, younger than the bound), over all clusters.
func (n *NodeReaders) Watches() (watched, live int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.readers {
		if c.watches != nil {
			w, l := c.watches.Count()
			watched, live = watched+w, live+l
		}
	}
	return watched, live
}

// Serving says the cluster is served here (its reconcile is about to
// decide its requests): its reader is kept from now on, until Forget.
func (n *NodeReaders) Serving(key types.NamespacedName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.forgotten, key)
}

// Forget drops a cluster's reader, its watches and its machines' read
// outcomes.
func (n *NodeReaders) Forget(key types.NamespacedName) {
	n.dropReader(key)
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.reads, key)
	delete(n.looked, key)
	delete(n.begun, key)
	now := time.Now()
	if n.forgotten == nil {
		n.forgotten = map[types.NamespacedName]time.Time{}
	}
	maps.DeleteFunc(n.forgotten, func(_ types.NamespacedName, at time.Time) bool { return now.Sub(at) > forgottenFor })
	n.forgotten[key] = now
}

// SetLifetime sets the lifetime of the readers' own credential (a bundle
// activated caps it otherwise): every reader made with another is made anew
// at its next use, and its watches end, so that no credential is signed for
// longer than the bundle in service allows (review 197B F3).
func (n *NodeReaders) SetLifetime(lifetime time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if lifetime == n.Lifetime {
		return
	}
	n.Lifetime = lifetime
	for key, c := range n.readers {
		if c.watches != nil {
			go c.watches.Stop()
		}
		delete(n.readers, key)
	}
}

// dropReader drops a cluster's reader and ends its watches.
func (n *NodeReaders) dropReader(key types.NamespacedName) {
	n.dropReaderReadBefore(key, time.Time{})
}

// dropReaderReadBefore drops a cluster's reader and ends its watches, after
// a read of its bundle begun at started failed, unless a read begun after it
// was answered before it (zero: whenever begun): a read that failed says
// nothing of the bundle a later one found.
func (n *NodeReaders) dropReaderReadBefore(key types.NamespacedName, started time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !started.IsZero() {
		if _, later := n.answeredAfterLocked(key, started); later {
			return
		}
		n.answeredLocked(key, started, true)
	}
	c, ok := n.readers[key]
	if ok && c.watches != nil {
		// Their connections close in the background: a reconcile does not
		// wait on a node.
		go c.watches.Stop()
	}
	delete(n.readers, key)
}

// observe records the outcome of a read of a machine of the cluster (err nil
// when it was read).
func (n *NodeReaders) observe(key types.NamespacedName, machine string, at time.Time, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.reads == nil {
		n.reads = map[types.NamespacedName]map[string]readOutcome{}
	}
	if n.reads[key] == nil {
		n.reads[key] = map[string]readOutcome{}
	}
	o := readOutcome{at: at}
	if err != nil {
		o.err, o.failingSince = engine.Clip(err.Error(), "", maxReadError), at
		if prev, ok := n.reads[key][machine]; ok && prev.err != "" {
			o.failingSince = prev.failingSince
		}
	}
	n.reads[key][machine] = o
}

// forgetMachine drops the read outcome of a machine that is gone: it no
// longer counts towards its cluster's reachability, and a machine made
// again under its name starts afresh, its grace whole (review 247, F4: one
// recreated inherited its predecessor's failing, and a cluster said "2 of
// its 1 machines"). A read in flight as it goes may note it again, for
// readFreshness at most.
func (n *NodeReaders) forgetMachine(key types.NamespacedName, machine string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.reads[key], machine)
}

// reachability is what the reads of a cluster's machines within the last
// readFreshness say: how many machines were read and how many of those
// have failed for UnreachableAfter or longer, the first of them by name and
// its error. Older outcomes are dropped: a machine is read only while it has
// a request to decide.
type reachability struct {
	machines, failed int
	machine, err     string
	// total is how many machines the cluster has.
	total int
	// answered is how many of the machines read last answered.
	answered int
	// early is true within readFreshness of the first look at the cluster
	// since its outcomes were dropped (a restart, a cluster taken over
	// from another replica): reads have had no time to say anything.
	// earlyLeft is how much of that time is left.
	early     bool
	earlyLeft time.Duration
}

// unreachable reports whether the reads say that Ichor reaches none of the
// cluster: every machine read failed, and those are more than half of the
// cluster's machines, so that one node (whose Talos API its owner may stop)
// of a larger cluster cannot make the cluster's Ready False.
func (r reachability) unreachable() bool {
	return r.machines > 0 && r.failed == r.machines && 2*r.failed > r.total
}

// readFreshness is how long a read's outcome counts towards the cluster's
// Ready: longer than a node's retries (unreadableRecheck), shorter than a
// person's patience with a condition that no longer holds.
const readFreshness = 5 * time.Minute

// maxReadError bounds a failed read's error where it is kept (the machine's
// last read, the rule's input): a node may answer with a status message of
// its own, up to its headers' bound.
const maxReadError = 1024

func (n *NodeReaders) reachability(key types.NamespacedName, now time.Time) reachability {
	if n == nil {
		return reachability{}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	after := n.UnreachableAfter
	if after <= 0 {
		after = defaultUnreachableAfter
	}
	var r reachability
	if n.looked == nil {
		n.looked = map[types.NamespacedName]time.Time{}
	}
	first, ok := n.looked[key]
	if !ok {
		first = now
		n.looked[key] = now
	}
	r.earlyLeft = max(0, readFreshness-now.Sub(first))
	r.early = r.earlyLeft > 0
	for machine, o := range n.reads[key] {
		if now.Sub(o.at) > readFreshness {
			delete(n.reads[key], machine)
			continue
		}
		r.machines++
		if o.err == "" {
			r.answered++
			continue
		}
		if o.at.Sub(o.failingSince) < after {
			continue
		}
		r.failed++
		if r.machine == "" || machine < r.machine {
			r.machine, r.err = machine, o.err
		}
	}
	return r
}
