package kubeletserving

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// oneShard is a replica that serves shard 0 of 2 while serving is true;
// every cluster's shard is 0 unless other names its UID.
type oneShard struct {
	serving bool
	other   types.UID
}

func (s *oneShard) ShardOf(uid types.UID) int {
	if uid == s.other {
		return 1
	}
	return 0
}

func (s *oneShard) Serves(uid types.UID) (int, bool) {
	shard := s.ShardOf(uid)
	return shard, s.serving && shard == 0
}
func (s *oneShard) Fence(uid types.UID) (shard.Fence, bool) {
	if _, ok := s.Serves(uid); !ok {
		return nil, false
	}
	return openFence{}, true
}
func (*oneShard) Settled(int) time.Time        { return time.Time{} }
func (*oneShard) AdoptionsNoted(int)           {}
func (*oneShard) UnsettledSince(int) time.Time { return time.Time{} }
func (*oneShard) Identity() string             { return "replica-a" }
func (*oneShard) Shards() int                  { return 2 }
func (*oneShard) LeaseDuration() time.Duration { return 3 * time.Second }

// openFence is a hold that never ends.
type openFence struct{}

func (openFence) Context() context.Context               { return context.Background() }
func (openFence) Begin(time.Time) (done func(), ok bool) { return func() {}, true }
func (openFence) Adopt() (settled func())                { return func() {} }
func (openFence) Unsettle(string, time.Time)             {}
func (openFence) Settle(string)                          {}

// A replica that no longer holds a cluster's shard drops what it held for
// it, a kubeconfigRef cluster's watch of its API server included, and
// decides nothing; one that holds it names itself on the cluster.
func TestAClusterWhoseShardGoesIsLetGo(t *testing.T) {
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "remote", UID: "uid-remote"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cluster).WithStatusSubresource(cluster).Build()
	shards := &oneShard{}
	r := &Reconciler{Client: c, Shards: shards, NodeReaders: &NodeReaders{}, Clock: clock.RealClock{}}
	key := client.ObjectKeyFromObject(cluster)
	stopped := false
	r.targets.remote = map[types.NamespacedName]*target{key: {cancel: func() { stopped = true }}}
	r.adoptions.add(key, time.Now(), nil)

	res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: key})
	require.NoError(t, err)
	assert.Equal(t, reconcile.Result{}, res)
	assert.True(t, stopped, "the remote API server's watch still runs")
	assert.Empty(t, r.targets.remote)
	assert.True(t, r.adoptions.take(key).since.IsZero(), "the adoption is kept")
	var got ichorv1alpha1.TalosCluster
	require.NoError(t, c.Get(context.Background(), key, &got))
	assert.Nil(t, meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionServedBy), "a replica that does not serve the cluster wrote on it")

	// Served: the condition names the replica and the shard.
	shards.serving = true
	require.NoError(t, r.markServed(context.Background(), &got))
	require.NoError(t, c.Get(context.Background(), key, &got))
	cond := meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionServedBy)
	require.NotNil(t, cond)
	assert.Equal(t, ichorv1alpha1.ReasonShardHeld, cond.Reason)
	assert.Equal(t, "replica replica-a serves the cluster: it holds shard 0 of 2", cond.Message)
	assert.True(t, r.serves(&got))

	// Another shard's cluster is not this replica's, held or not.
	shards.other = cluster.UID
	assert.False(t, r.serves(&got))

	// Sharding off: the condition goes.
	r.Shards = nil
	require.NoError(t, r.markServed(context.Background(), &got))
	require.NoError(t, c.Get(context.Background(), key, &got))
	assert.Nil(t, meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionServedBy))
}

// A cluster taken over settles the verdicts written shortly before: an
// approver's condition (it names its decision) since the adoption, not an
// older one, not one a person wrote, and not one this replica wrote since
// (its writer records it: review 12, L3).
func TestATakenOverClusterSettlesOnlyRecentVerdictsOfAnApprover(t *testing.T) {
	since := time.Unix(1_000_000, 0)
	r := &Reconciler{}
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	r.adoptions.add(client.ObjectKeyFromObject(cluster), since, nil)
	p := &pass{r: r, cluster: cluster, adoptedSince: since}
	verdict := func(at time.Time, message string) *certificatesv1.CertificateSigningRequest {
		return &certificatesv1.CertificateSigningRequest{Status: certificatesv1.CertificateSigningRequestStatus{
			Conditions: []certificatesv1.CertificateSigningRequestCondition{{
				Type: certificatesv1.CertificateApproved, LastUpdateTime: metav1.NewTime(at), Message: message,
			}},
		}}
	}
	named := "approved (decision 0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c, revision abc)"
	assert.True(t, p.adopts(verdict(since, named)))
	assert.True(t, p.adopts(verdict(since.Add(time.Second), named)))
	assert.False(t, p.adopts(verdict(since.Add(-time.Second), named)), "a verdict from before the window")
	assert.False(t, p.adopts(verdict(since, "approved by hand")), "a verdict that names no decision")
	assert.False(t, p.adopts(&certificatesv1.CertificateSigningRequest{}), "an undecided request")
	assert.False(t, (&pass{}).adopts(verdict(since, named)), "a cluster not taken over")

	// A verdict this replica wrote since the adoption: its writer records it.
	r.adoptions.wrote(client.ObjectKeyFromObject(cluster), "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c")
	assert.False(t, p.adopts(verdict(since.Add(time.Second), named)), "a verdict this replica wrote is recorded again")
	other := "approved (decision 1c5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c, revision abc)"
	assert.True(t, p.adopts(verdict(since.Add(time.Second), other)), "another replica's verdict")
	// Once settled, nothing is kept of what this replica wrote.
	r.adoptions.settle(client.ObjectKeyFromObject(cluster), since)
	assert.False(t, r.adoptions.wroteHere(client.ObjectKeyFromObject(cluster), "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c"))
}

// A cluster taken over twice before its first full pass (two shard changes
// seen under one hold) is settled once, from the earlier time, and tells
// the shard so once per note; one let go first tells it nothing, so that
// the shard's release does not say it settled.
func TestAnAdoptionNotedTwiceIsSettledOnceFromTheEarlierTime(t *testing.T) {
	var a adoptions
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	early, late := time.Unix(1_000_000, 0), time.Unix(1_000_005, 0)
	settled := 0
	a.add(key, early, func() { settled++ })
	a.add(key, late, func() { settled++ })
	assert.Equal(t, 1, settled, "the adoption replaced is not settled")
	assert.Equal(t, early, a.peek(key).since)
	a.settle(key, late)
	assert.Equal(t, 1, settled, "settled from another time")
	a.settle(key, early)
	assert.Equal(t, 2, settled)
	assert.True(t, a.peek(key).since.IsZero())

	a.add(key, early, func() { settled++ })
	assert.Equal(t, early, a.take(key).since)
	assert.Equal(t, 2, settled, "an adoption let go was said settled")

	// A cluster that decides nothing here has nothing to settle.
	a.add(key, early, func() { settled++ })
	a.drop(key)
	assert.Equal(t, 3, settled)
	assert.True(t, a.peek(key).since.IsZero())
}

// dropShard is a replica that holds shard 0 until the test drops it: then
// the hold's context ends and it begins no write.
type dropShard struct {
	mu     sync.Mutex
	held   bool
	ctx    context.Context
	cancel context.CancelFunc
}

func newDropShard() *dropShard {
	ctx, cancel := context.WithCancel(context.Background())
	return &dropShard{held: true, ctx: ctx, cancel: cancel}
}

func (s *dropShard) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = false
	s.cancel()
}

func (s *dropShard) Serves(types.UID) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return 0, s.held
}

func (s *dropShard) Fence(uid types.UID) (shard.Fence, bool) {
	if _, ok := s.Serves(uid); !ok {
		return nil, false
	}
	return dropFence{s}, true
}
func (*dropShard) ShardOf(types.UID) int        { return 0 }
func (*dropShard) Settled(int) time.Time        { return time.Time{} }
func (*dropShard) AdoptionsNoted(int)           {}
func (*dropShard) UnsettledSince(int) time.Time { return time.Time{} }
func (*dropShard) Identity() string             { return "replica-a" }
func (*dropShard) Shards() int                  { return 1 }
func (*dropShard) LeaseDuration() time.Duration { return 3 * time.Second }

type dropFence struct{ s *dropShard }

func (f dropFence) Context() context.Context { return f.s.ctx }
func (f dropFence) Begin(time.Time) (func(), bool) {
	_, ok := f.s.Serves("")
	return func() {}, ok
}
func (dropFence) Adopt() func()              { return func() {} }
func (dropFence) Unsettle(string, time.Time) {}
func (dropFence) Settle(string)              {}

// A replica whose shard is dropped decides nothing more of its clusters: the
// decision in flight is cancelled and writes nothing, and the requesters
// still queued are dropped without a decision, and without a backoff (the
// shard's going is no failure of theirs).
func TestADroppedShardsQueuedRequestersAreNotDecidedHere(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:busy", "csr-busy", t0), csrOf("system:node:queued", "csr-queued", t0))
	shards := newDropShard()
	f.r.Shards = shards
	f.dec.decide = func(ctx context.Context, name string) (engine.CSRDecision, error) {
		if name == "csr-busy" {
			<-ctx.Done()
		}
		return approve(), nil
	}
	busy := requester{cluster: f.cluster, username: "system:node:busy"}
	queued := requester{cluster: f.cluster, username: "system:node:queued"}
	f.r.enqueue(busy)
	inFlight := make(chan struct{})
	go func() {
		defer close(inFlight)
		f.r.next(context.Background())
	}()
	require.Eventually(t, func() bool { return slices.Contains(f.dec.calls(), "csr-busy") }, 5*time.Second, 5*time.Millisecond)
	f.r.enqueue(queued)

	shards.drop()
	select {
	case <-inFlight:
	case <-time.After(5 * time.Second):
		t.Fatal("the decision in flight was not cancelled with the shard")
	}
	require.Equal(t, 1, f.r.queue.Len())
	require.True(t, f.r.next(context.Background()))

	assert.Equal(t, []string{"csr-busy"}, f.dec.calls(), "a queued requester of the dropped shard was decided")
	assert.False(t, f.approved(t, "csr-busy"), "the cancelled decision was written")
	assert.False(t, f.approved(t, "csr-queued"))
	assert.Zero(t, f.r.queue.Len())
	assert.Zero(t, f.r.queue.NumRequeues(busy), "the cancelled decision backs off as a failure")
	assert.Zero(t, f.r.queue.NumRequeues(queued))
	assert.False(t, f.r.failures.Has(memoKey{cluster: f.cluster, uid: "uid-csr-busy"}))
}

// A verdict is stamped with the time of its write, not the pass's start: a
// replica that takes the cluster over right after records again the verdicts
// stamped within its window, and a pass may read nodes for seconds before it
// writes (review 12, M1). Stamped at the start, this one would fall 4 s
// before the write, out of the window of a take a lease duration later.
func TestAVerdictIsStampedWhenItIsWritten(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:n1", "csr-1", t0))
	f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) {
		clk.Step(4 * time.Second) // the node's read, or the requester's older requests
		return approve(), nil
	}
	f.add("system:node:n1")
	require.True(t, f.r.next(context.Background()))

	csr, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr-1", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, csr.Status.Conditions, 1)
	assert.Equal(t, t0.Add(4*time.Second), csr.Status.Conditions[0].LastUpdateTime.Time)
	written := clk.Now()
	take := written.Add(3 * time.Second) // a lease duration later
	p := &pass{r: f.r, cluster: &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: f.cluster.Name}},
		adoptedSince: take.Add(-3*time.Second - 2*time.Second)}
	assert.True(t, p.adopts(csr), "the next holder does not record the verdict")
}

// recordingFence is a hold that never ends and keeps the acts unsettled
// under it, with their stamps.
type recordingFence struct {
	openFence
	mu      sync.Mutex
	pending map[string]time.Time
}

func (f *recordingFence) Unsettle(act string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[act] = at
}

func (f *recordingFence) Settle(act string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, act)
}

func (f *recordingFence) unsettled() map[string]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.pending)
}

// recordingShard serves every cluster under one recordingFence.
type recordingShard struct {
	oneShard
	fence *recordingFence
}

func (s *recordingShard) Fence(types.UID) (shard.Fence, bool) { return s.fence, true }

// Review 12, M1: a write answered with a timeout (applied all the same, as
// a 504 may be) leaves its verdict unsettled on the hold, with the stamp the
// condition carries, so that a release before it is settled tells the next
// holder from when to record; once the request, read again, shows the
// verdict and it is recorded, the act is settled.
func TestAWriteThatTimedOutIsUnsettledWithItsStampUntilItIsRecorded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
	rec := &recordingDecider{decider: f.dec}
	f.r.Engine = rec
	fence := &recordingFence{pending: map[string]time.Time{}}
	f.r.Shards = &recordingShard{oneShard: oneShard{serving: true}, fence: fence}
	f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) {
		clk.Step(2500 * time.Millisecond) // the node's read
		return approve(), nil
	}
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	var timedOut atomic.Bool
	f.csrs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		if timedOut.Swap(true) {
			return false, nil, nil
		}
		// Applied, and answered as a timeout.
		obj := a.(k8stesting.UpdateAction).GetObject()
		if err := f.csrs.Tracker().Update(gvr, obj, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewTimeoutError("the write's answer", 1)
	})
	ctx := context.Background()
	f.add("system:node:x")
	require.True(t, f.r.next(ctx))
	require.True(t, f.approved(t, "csr-x"), "the write was not applied")
	// The stamp as the condition keeps it, in whole seconds (review 13,
	// H2: a window from t0+2.5 s misses a condition of t0+2 s), and the act
	// named with its cluster (two clusters of a shard may judge one request).
	csr, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, csr.Status.Conditions, 1)
	written := csr.Status.Conditions[0].LastUpdateTime.Rfc3339Copy().Time
	assert.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0.Add(2 * time.Second)}, fence.unsettled(), "the timed-out write is not unsettled with its stamp")
	assert.False(t, written.Before(fence.unsettled()["ns/demo/uid-csr-x"]), "a window from the stamp misses the condition written at %s", written)
	assert.Zero(t, rec.recorded.Load())

	// The next look reads the request again, finds the verdict, records it,
	// and settles the act.
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	cached := csrOf("system:node:x", "csr-x", t0)
	cached.UID = "uid-csr-x"
	p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: clk.Now(), fence: fence}
	require.NoError(t, p.handle(ctx, &cached))
	assert.Equal(t, int64(1), rec.recorded.Load(), "the verdict in effect was not recorded")
	assert.Empty(t, fence.unsettled(), "the act recorded is still unsettled")
}

// closedFence is a hold this replica no longer has: nothing begins under it.
type closedFence struct{ openFence }

func (closedFence) Begin(time.Time) (func(), bool) { return nil, false }

// rejectingDecider counts the rejections asked of it, and rejects.
type rejectingDecider struct {
	*decider
	rejections atomic.Int64
}

func (d *rejectingDecider) KubeletServingRejection(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error) {
	d.rejections.Add(1)
	return engine.CSRDecision{Action: engine.ActionDeny, Reasons: engine.Reasons{{Code: "TooManyUndecided", Message: "test"}}, DecisionID: "00000000-0000-0000-0000-000000000002"}, nil
}

// Review 12, L4: a requester's request that the rule may reject whatever the
// node's identity (it has several undecided) is not judged, nor logged, by a
// replica that no longer holds the cluster's shard, as no verdict is reached
// after the node's read then: the requests are listed first (from a tenant's
// API server, for seconds).
func TestARejectionIsNotReachedForAClusterNoLongerServed(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var csrs []certificatesv1.CertificateSigningRequest
	for _, name := range []string{"csr-a", "csr-b"} {
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("n1")})
		require.NoError(t, err)
		c := csrgen.ServingObject(name, "n1", req)
		c.CreationTimestamp = metav1.NewTime(t0)
		csrs = append(csrs, *c)
	}
	f := newQueueFixture(t, clocktesting.NewFakeClock(t0), csrs...)
	ctx := context.Background()
	m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "n1"}}
	m.Spec.ClusterName, m.Spec.Hostname = f.cluster.Name, "n1"
	require.NoError(t, f.r.Client.Create(ctx, m))
	dec := &rejectingDecider{decider: f.dec}
	f.r.Engine = dec
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))

	// Served: the rejection is asked (the check is not what stops it).
	p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: t0, fence: openFence{}}
	require.NoError(t, p.decide(ctx, &csrs[1]))
	require.Equal(t, int64(1), dec.rejections.Load(), "a served cluster's flooding requester was not judged")

	// No longer served: not asked.
	p = &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: t0, fence: closedFence{}}
	require.NoError(t, p.decide(ctx, &csrs[0]))
	assert.Equal(t, int64(1), dec.rejections.Load(), "a rejection was judged for a cluster no longer served")
}

// failingRecorder is a decider whose records all fail (a decision-log sink
// that refuses them).
type failingRecorder struct{ *decider }

func (failingRecorder) RecordApplied(context.Context, engine.Applied) error {
	return errors.New("the decision log refused the entry")
}

// Review 13, H1 and M1: a verdict whose record failed stays unsettled on the
// hold, whether its own write succeeded (the write's record) or it was found
// applied after a failed write (the observed record): a release then says
// since when, and the next holder records it. Before, the act was settled
// straight after, and a graceful release said settled over a verdict with
// no record.
func TestAVerdictWhoseRecordFailedStaysUnsettled(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
	f.r.Engine = failingRecorder{f.dec}
	fence := &recordingFence{pending: map[string]time.Time{}}
	f.r.Shards = &recordingShard{oneShard: oneShard{serving: true}, fence: fence}
	ctx := context.Background()

	// Written, and its record refused: unsettled, and looked at again
	// (review 14, M1: before, nothing looked at it while the shard stayed).
	f.add("system:node:x")
	require.True(t, f.r.next(ctx))
	require.True(t, f.approved(t, "csr-x"))
	assert.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0}, fence.unsettled(), "a written verdict whose record failed was settled")
	key := memoKey{cluster: f.cluster, uid: "uid-csr-x"}
	assert.True(t, f.r.failures.Has(key), "a verdict whose record failed is not looked at again")

	// Its next look, with the sink back, records it and settles it.
	rec := &recordingDecider{decider: f.dec}
	f.r.Engine = rec
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	decided, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
	require.NoError(t, err)
	p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: clk.Now(), fence: fence}
	require.NoError(t, p.handle(ctx, decided))
	assert.Equal(t, int64(1), rec.recorded.Load(), "the verdict was not recorded at its next look")
	assert.Empty(t, fence.unsettled())
	assert.False(t, f.r.failures.Has(key))
	f.r.Engine = failingRecorder{f.dec}

	// Found applied after a failed write, and the observed record refused.
	live, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
	require.NoError(t, err)
	p.unsettle(live, t0)
	f.r.failures.Pending(p.memoKey(live), approval.Verdict{}, struct{}{}, t0, func(int) time.Duration { return 0 })
	assert.False(t, p.settle(ctx, live), "a refused record said recorded")
	assert.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0}, fence.unsettled(), "an applied verdict whose observed record failed was settled")
	assert.True(t, f.r.failures.Has(key), "a verdict whose observed record failed is not looked at again")
}

// Review 14, H1: a cluster taken over stays adopted (and its shard
// unsettled) while a verdict it was to record could not be: the reconcile
// tries it again; before, the adoption was settled whatever the record's
// fate, and a graceful release then said settled over a verdict with no
// record.
func TestAnAdoptionIsSettledOnlyOnceItsVerdictsAreRecorded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	decided := csrOf("system:node:x", "csr-x", t0)
	decided.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
		Type: certificatesv1.CertificateApproved, Status: "True", LastUpdateTime: metav1.NewTime(t0),
		Message: "approved (decision 0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c, revision abc)",
	}}
	f := newQueueFixture(t, clk, decided)
	f.r.Shards = &oneShard{serving: true}
	settledCalls := 0
	f.r.adoptions.add(f.cluster, t0.Add(-5*time.Second), func() { settledCalls++ })
	ctx := context.Background()

	f.r.Engine = failingRecorder{f.dec}
	_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Zero(t, settledCalls, "the adoption was settled over a verdict whose record failed")
	assert.False(t, f.r.adoptions.peek(f.cluster).since.IsZero(), "the adoption was forgotten")

	rec := &recordingDecider{decider: f.dec}
	f.r.Engine = rec
	_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Equal(t, int64(1), rec.recorded.Load(), "the verdict was not recorded at the next pass")
	assert.Equal(t, 1, settledCalls)
	assert.True(t, f.r.adoptions.peek(f.cluster).since.IsZero())
}
