package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/shard"
)

// Sharding is this replica's part when the replicas share the clusters out
// (internal/shard.Set): it serves a cluster only while it holds the
// cluster's shard.
type Sharding interface {
	// Serves reports whether this replica serves the cluster of that UID
	// now, and the cluster's shard.
	Serves(uid types.UID) (shard int, ok bool)
	// ShardOf is the shard of the cluster of that UID.
	ShardOf(uid types.UID) int
	// Identity names this replica.
	Identity() string
	// Shards is the number of shards.
	Shards() int
	// LookBack is how far before a take a verdict of a holder that did not
	// say it had settled may still be without its record.
	LookBack() time.Duration
	// Fence is this replica's hold on the shard of the cluster of that UID,
	// if it serves the cluster now: a worker's decisions run under its
	// context, and each write is begun through it (review 4, S1).
	Fence(uid types.UID) (shard.Fence, bool)
	// Settled is, for a shard this replica took from one that gave it up,
	// until when that one had recorded its verdicts; zero if not known.
	Settled(shard int) time.Time
	// TakenAt is when this replica took the shard; zero if it does not
	// hold it.
	TakenAt(shard int) time.Time
	// UnsettledSince is, for a shard this replica took from one that gave
	// it up without saying it settled, the time stamped on that one's
	// earliest verdict that may be in effect without its record; zero if
	// not known or none.
	UnsettledSince(shard int) time.Time
	// AdoptionsNoted says the adoptions of the shard's clusters are noted
	// (each Fence's Adopt called): a release may say settled from then on.
	AdoptionsNoted(shard int)
}

// errNotServed is what a decision found when it was about to act: this
// replica no longer serves the cluster (or cannot tell that it still does),
// and the replica that does decides the request.
var errNotServed = errors.New("the cluster is no longer served by this replica")

// stillServes reports whether this replica may still act for the pass's
// cluster: always, unless the clusters are shared out; then while the hold
// the pass was begun under is this replica's and its membership is renewed.
func (p *pass) stillServes() bool {
	if p.fence == nil {
		return true
	}
	done, ok := p.fence.Begin(time.Time{})
	if ok {
		done()
	}
	return ok
}

// begin begins a write for the pass's cluster (see shard.Fence): done is to
// be called once it and its record are done. at is the stamp of the verdict
// it writes, zero for a write of anything else.
func (p *pass) begin(at time.Time) (done func(), err error) {
	if p.fence == nil {
		return func() {}, nil
	}
	done, ok := p.fence.Begin(conditionTime(at))
	if !ok {
		return nil, errNotServed
	}
	return done, nil
}

// conditionTime is the time a condition stamped at says once written:
// whole seconds (metav1.Time), which the windows that look for it compare
// with (adopts).
func conditionTime(at time.Time) time.Time {
	return at.Truncate(time.Second)
}

// unsettle says the verdict on csr stamped at may be in effect without its
// applied record: until it is settled, a release of the shard leaves it to
// the next holder to record, from that stamp on (shard.Fence.Unsettle).
func (p *pass) unsettle(csr *certificatesv1.CertificateSigningRequest, at time.Time) {
	if p.fence != nil {
		p.fence.Unsettle(p.memoKey(csr).act(), conditionTime(at))
	}
}

// writeFailed notes a verdict write that failed (written, as its record
// would be). One whose outcome is
// unknown (approval.UnknownOutcome: a timeout, a lost connection, a 5xx)
// makes the request uncertain, and its next look reads it again and records
// the verdict in effect (settle); it also unsettles the shard, since it may
// be in effect without its record until then. One the API server refused (a
// conflict, a 403, a 422, a request decided meanwhile) was not applied: it
// leaves the request as it was, an earlier write of unknown outcome
// (earlier, if hadEarlier) still uncertain (review 15, M2: a refusal made
// the shard unsettled for as long as the request then stayed pending).
func (p *pass) writeFailed(err error, csr *certificatesv1.CertificateSigningRequest, written *engine.Applied, at time.Time, earlier approval.UncertainWrite, hadEarlier bool) {
	var unknown *approval.UnknownOutcome
	switch {
	case errors.As(err, &unknown):
		w := approval.UncertainWrite{ResourceVersion: unknown.ResourceVersion, At: p.r.Clock.Now(), Settle: p.actSettler(csr)}
		if written != nil {
			w.Written = []engine.Applied{*written}
		}
		p.r.uncertain.Add(p.memoKey(csr), w.After(earlier, hadEarlier))
		p.unsettle(csr, at)
	case hadEarlier:
		p.r.uncertain.Add(p.memoKey(csr), earlier)
	}
}

// actSettler is what settles the act on csr on the pass's hold once its
// verdict is recorded, or cannot be in effect, or is gone; nil when the
// clusters are not shared out.
func (p *pass) actSettler(csr *certificatesv1.CertificateSigningRequest) func() {
	if p.fence == nil {
		return nil
	}
	fence, act := p.fence, p.memoKey(csr).act()
	return func() { fence.Settle(act) }
}

// adoptions are the clusters this replica has begun to serve, with the time
// from which verdicts on their requests may be another replica's not yet
// recorded applied, and what to call once they are.
type adoptions struct {
	mu sync.Mutex
	m  map[types.NamespacedName]adoption
}

type adoption struct {
	since time.Time
	// openUntil is, for a shard taken from a replica whose release said it
	// had not settled (a write in progress it could not wait for, or one
	// answered with an error that may yet commit), until when such a write
	// may still commit: the adoption is settled only after, by a pass that
	// looks then (review 16, L5).
	openUntil time.Time
	// settled tells the hold of the cluster's shard that the cluster's
	// verdicts are settled (shard.Fence.Adopt); nil without sharding.
	settled func()
	// mine are the decisions whose record is this replica's since the
	// adoption was noted: those its workers wrote on the cluster's requests
	// (their writers record them) and those recorded already (a pass that
	// is retried because another record failed): the settling pass must
	// not record them again.
	mine map[string]bool
}

// add notes that a cluster was taken over. One already noted (two shard
// changes seen under one hold, or a hold before) is kept from the earlier
// time, and its settled is called: the new one stands for both.
func (a *adoptions) add(key types.NamespacedName, since, openUntil time.Time, settled func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[types.NamespacedName]adoption{}
	}
	var mine map[string]bool
	if old, ok := a.m[key]; ok {
		if old.since.Before(since) {
			since = old.since
		}
		if old.openUntil.After(openUntil) {
			openUntil = old.openUntil
		}
		if old.settled != nil {
			old.settled()
		}
		mine = old.mine
	}
	a.m[key] = adoption{since: since, openUntil: openUntil, settled: settled, mine: mine}
}

// wrote notes a decision whose record is this replica's, on a request of a
// cluster whose adoption is not settled yet (one it writes, noted before the
// write, or one recorded already); nothing when there is none.
func (a *adoptions) wrote(key types.NamespacedName, decisionID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad, ok := a.m[key]
	if !ok {
		return
	}
	if ad.mine == nil {
		ad.mine = map[string]bool{}
		a.m[key] = ad
	}
	ad.mine[decisionID] = true
}

// wroteHere reports whether the record of the decision on a request of the
// cluster is this replica's since its adoption was noted (wrote).
func (a *adoptions) wroteHere(key types.NamespacedName, decisionID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[key].mine[decisionID]
}

// peek is a cluster's adoption; zero if none.
func (a *adoptions) peek(key types.NamespacedName) adoption {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[key]
}

// settle forgets a cluster's adoption once a reconcile settled it, and
// calls its settled; an adoption noted since is kept for the next pass.
func (a *adoptions) settle(key types.NamespacedName, since time.Time) {
	a.mu.Lock()
	ad, ok := a.m[key]
	if !ok || !ad.since.Equal(since) {
		a.mu.Unlock()
		return
	}
	delete(a.m, key)
	a.mu.Unlock()
	if ad.settled != nil {
		ad.settled()
	}
}

// drop forgets a cluster's adoption and calls its settled: the cluster
// decides nothing here (not enabled, or judging nothing), so it has no
// verdict to settle, and must not keep the shard's release from saying it
// settled.
func (a *adoptions) drop(key types.NamespacedName) {
	a.mu.Lock()
	ad, ok := a.m[key]
	delete(a.m, key)
	a.mu.Unlock()
	if ok && ad.settled != nil {
		ad.settled()
	}
}

// take returns and forgets a cluster's adoption, without calling its
// settled: the cluster is let go, and the shard's release must not say it
// settled (the next holder records the verdicts).
func (a *adoptions) take(key types.NamespacedName) adoption {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.m[key]
	delete(a.m, key)
	return ad
}

// adopts reports whether a decided request's verdict is to be recorded
// applied again on this pass: the cluster was taken over, and the verdict,
// an approver's (it names its decision) other than this replica's own, was
// written shortly before or since. The window is the lease duration and two
// seconds, since a condition's time is whole seconds.
func (p *pass) adopts(csr *certificatesv1.CertificateSigningRequest) bool {
	if p.adoptedSince.IsZero() {
		return false
	}
	d, ok := approval.DecisionOf(csr)
	return ok && !d.At.Before(p.adoptedSince) && !p.r.adoptions.wroteHere(p.key(), d.ID)
}

// serves reports whether this replica serves the cluster: always, unless
// the clusters are shared out.
func (r *Reconciler) serves(c *ichorv1alpha1.TalosCluster) bool {
	if r.Shards == nil {
		return true
	}
	_, ok := r.Shards.Serves(c.UID)
	return ok
}

// ShardChanged is told of each shard this replica began or ceased to serve:
// its clusters are reconciled, to be served or let go. It does not wait for
// the controller.
func (r *Reconciler) ShardChanged(shard int) {
	ch := r.shardEvents
	if ch == nil {
		return
	}
	go func() {
		select {
		case ch <- event.TypedGenericEvent[int]{Object: shard}:
		case <-r.runCtx.Done():
		}
	}()
}

// shardToClusters are the clusters of a shard, from the cache.
func (r *Reconciler) shardToClusters(ctx context.Context, shard int) []reconcile.Request {
	var clusters ichorv1alpha1.TalosClusterList
	if err := r.Client.List(ctx, &clusters); err != nil {
		log.FromContext(ctx).Error(err, "list the clusters of a shard", "shard", shard)
		return nil
	}
	var out []reconcile.Request
	// Counted back from the take, not from now: the change may reach this
	// mapping seconds after it (a busy controller), and a window from now
	// would miss a dead holder's last verdicts by as much.
	taken := r.Shards.TakenAt(shard)
	if taken.IsZero() {
		taken = r.Clock.Now()
	}
	since := taken.Add(-r.Shards.LookBack())
	if settled := r.Shards.Settled(shard); settled.After(since) {
		// Given up, not lost: its holder recorded its verdicts until then
		// (review 4, S6).
		since = settled
	}
	var openUntil time.Time
	if unsettled := r.Shards.UnsettledSince(shard); !unsettled.IsZero() {
		if unsettled.Before(since) {
			// Given up with a verdict that may be in effect unrecorded
			// since then (a write answered with a timeout long after it
			// was sent): its stamp, its holder's clock as the
			// condition's (review 12, M1).
			since = unsettled
		}
		// Such a write may commit until it can no longer (as this
		// replica's own are held uncertain): a pass looks then.
		openUntil = unsettled.Add(approval.UncertainWriteMaxAge)
	}
	for _, c := range clusters.Items {
		if r.Shards.ShardOf(c.UID) != shard {
			continue
		}
		key := client.ObjectKeyFromObject(&c)
		if f, ok := r.Shards.Fence(c.UID); ok {
			// Until its first reconcile has settled them, a release of the
			// shard must not say this replica recorded every verdict.
			r.adoptions.add(key, since, openUntil, f.Adopt())
		}
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	r.Shards.AdoptionsNoted(shard)
	return out
}

// forgetVerdicts forgets what the memos keep of a cluster's requests: its
// pending verdicts, its failures' backoffs, and its certificates refused a
// record, and why.
func (r *Reconciler) forgetVerdicts(key types.NamespacedName) {
	r.memo.ForgetIf(ofCluster(key, nil), math.MaxUint64)
	r.failures.ForgetIf(ofCluster(key, nil), math.MaxUint64)
	r.unrecorded.ForgetIf(ofCluster(key, nil), math.MaxUint64)
	r.refusedRecords.forget(key)
}

// letGo drops what this replica holds for a cluster it no longer serves (or
// that is gone): the remote API server's watch and cache, the Talos reader,
// the memos. The replica that serves it next starts afresh. Its requesters
// still queued are dropped by the workers, which decide nothing for a
// cluster whose shard this replica does not hold. A cluster gone leaves its
// verdicts to nobody: the records owed of them are made now
// (forgetUncertain), and owed is true while one is refused. One served
// elsewhere leaves them to its next holder (the hold it gave up says them
// unsettled).
func (r *Reconciler) letGo(ctx context.Context, key types.NamespacedName, gone bool) (owed bool) {
	r.NodeReaders.Forget(key)
	r.targets.stop(key)
	r.forgetVerdicts(key)
	if gone {
		owed = r.forgetUncertain(ctx, key)
	} else {
		r.uncertain.ForgetIf(inCluster(key, nil), math.MaxUint64)
	}
	r.Metrics.forget(key.Namespace, key.Name)
	if gone {
		// Nobody is left to record a deleted cluster's verdicts: its
		// adoption is settled, or the shard's release would say it
		// unsettled for the rest of the hold, and the next holder record
		// a long window again.
		r.adoptions.drop(key)
	} else {
		r.adoptions.take(key)
	}
	return owed
}

// forgetUncertain forgets the uncertain verdicts of a cluster that is gone,
// or decides nothing any more, and settles their acts: nothing will look at
// them again. A record owed of one known to be in effect is made first
// (recordOwed); owed is true while one is refused.
func (r *Reconciler) forgetUncertain(ctx context.Context, key types.NamespacedName) (owed bool) {
	return r.recordOwed(ctx, r.uncertain.ForgetIf(inCluster(key, nil), math.MaxUint64))
}

// markServed says on the cluster which replica serves it and through which
// shard, or removes that when the clusters are not shared out.
func (r *Reconciler) markServed(ctx context.Context, c *ichorv1alpha1.TalosCluster) error {
	before := c.DeepCopy()
	if r.Shards == nil {
		meta.RemoveStatusCondition(&c.Status.Conditions, ichorv1alpha1.ConditionServedBy)
	} else {
		shard := r.Shards.ShardOf(c.UID)
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{
			Type:               ichorv1alpha1.ConditionServedBy,
			Status:             metav1.ConditionTrue,
			Reason:             ichorv1alpha1.ReasonShardHeld,
			Message:            fmt.Sprintf("replica %s serves the cluster: it holds shard %d of %d", r.Shards.Identity(), shard, r.Shards.Shards()),
			ObservedGeneration: c.Generation,
		})
	}
	if !statusChanged(before.Status, c.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, c, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("say which replica serves the cluster: %w", err)
	}
	return nil
}
