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
	serving        bool
	other          types.UID
	takenAt        time.Time
	unsettledSince time.Time
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
func (*oneShard) Settled(int) time.Time          { return time.Time{} }
func (*oneShard) AdoptionsNoted(int)             {}
func (s *oneShard) UnsettledSince(int) time.Time { return s.unsettledSince }
func (s *oneShard) TakenAt(int) time.Time        { return s.takenAt }
func (*oneShard) Identity() string               { return "replica-a" }
func (*oneShard) Shards() int                    { return 2 }
func (*oneShard) LookBack() time.Duration        { return 5 * time.Second }

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
	r.adoptions.add(key, time.Now(), time.Time{}, nil)

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
	r.adoptions.add(client.ObjectKeyFromObject(cluster), since, time.Time{}, nil)
	p := &pass{r: r, cluster: cluster, adoptedSince: since}
	verdict := func(at time.Time, message string) *certificatesv1.CertificateSigningRequest {
		return &certificatesv1.CertificateSigningRequest{Status: certificatesv1.CertificateSigningRequestStatus{
			Conditions: []certificatesv1.CertificateSigningRequestCondition{{
				Type: certificatesv1.CertificateApproved, LastUpdateTime: metav1.NewTime(at), Message: message,
			}},
		}}
	}
	named := "approved (decision 0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c, policy revision abc)"
	assert.True(t, p.adopts(verdict(since, named)))
	assert.True(t, p.adopts(verdict(since.Add(time.Second), named)))
	assert.False(t, p.adopts(verdict(since.Add(-time.Second), named)), "a verdict from before the window")
	assert.False(t, p.adopts(verdict(since, "approved by hand")), "a verdict that names no decision")
	assert.False(t, p.adopts(&certificatesv1.CertificateSigningRequest{}), "an undecided request")
	assert.False(t, (&pass{}).adopts(verdict(since, named)), "a cluster not taken over")

	// A verdict this replica wrote since the adoption: its writer records it.
	r.adoptions.wrote(client.ObjectKeyFromObject(cluster), "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c")
	assert.False(t, p.adopts(verdict(since.Add(time.Second), named)), "a verdict this replica wrote is recorded again")
	other := "approved (decision 1c5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c, policy revision abc)"
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
	a.add(key, early, time.Time{}, func() { settled++ })
	a.add(key, late, time.Time{}, func() { settled++ })
	assert.Equal(t, 1, settled, "the adoption replaced is not settled")
	assert.Equal(t, early, a.peek(key).since)
	a.settle(key, late)
	assert.Equal(t, 1, settled, "settled from another time")
	a.settle(key, early)
	assert.Equal(t, 2, settled)
	assert.True(t, a.peek(key).since.IsZero())

	a.add(key, early, time.Time{}, func() { settled++ })
	assert.Equal(t, early, a.take(key).since)
	assert.Equal(t, 2, settled, "an adoption let go was said settled")

	// A cluster that decides nothing here has nothing to settle.
	a.add(key, early, time.Time{}, func() { settled++ })
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
func (*dropShard) TakenAt(int) time.Time        { return time.Time{} }
func (*dropShard) Identity() string             { return "replica-a" }
func (*dropShard) Shards() int                  { return 1 }
func (*dropShard) LookBack() time.Duration      { return 5 * time.Second }

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

func (s *recordingShard) Fence(uid types.UID) (shard.Fence, bool) {
	if _, ok := s.Serves(uid); !ok {
		return nil, false
	}
	return s.fence, true
}

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
	fence := servedThrough(f)
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
		csrs = append(csrs, servingRequest(t, name, "n1", t0))
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

// refusedRecordFixture is a cluster whose one request (csr-x) was approved
// here and its record refused by the decision log's sink (failingRecorder,
// still in place): its act unsettled on a recording hold, stamped at the
// clock's time.
func refusedRecordFixture(t *testing.T) (*queueFixture, *recordingFence, *clocktesting.FakeClock) {
	t.Helper()
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
	f.r.Engine = failingRecorder{f.dec}
	fence := servedThrough(f)
	f.add("system:node:x")
	require.True(t, f.r.next(context.Background()))
	require.True(t, f.approved(t, "csr-x"))
	return f, fence, clk
}

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
	// Written, and its record refused: unsettled, and looked at again
	// (review 14, M1: before, nothing looked at it while the shard stayed).
	f, fence, clk := refusedRecordFixture(t)
	t0 := clk.Now()
	ctx := context.Background()
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
	f.r.uncertain.Add(p.memoKey(live), approval.UncertainWrite{At: t0, Settle: p.actSettler(live)})
	assert.False(t, p.settle(ctx, live), "a refused record said recorded")
	assert.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0}, fence.unsettled(), "an applied verdict whose observed record failed was settled")
	assert.True(t, f.r.failures.Has(key), "a verdict whose observed record failed is not looked at again")
	assert.True(t, f.r.uncertain.Has(key), "a verdict whose observed record failed is not to be recorded at its next look")
}

// Review 14, M2: a decided request whose certificate cannot be recorded on
// its machine (the signer's certificate is not PEM) is looked at again with
// backoff, and its verdict is not recorded applied again at each look. Only
// a verdict write that failed, or a record refused, is recorded at the next
// look; before, every failure was taken for one, and each retry (up to every
// five minutes, for as long as the request lived) logged the verdict anew.
func TestACertificateNotRecordedOnItsMachineIsNotRecordedAppliedAgain(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, servingRequest(t, "csr-x", "x", t0))
	rec := &recordingDecider{decider: f.dec}
	f.r.Engine = rec
	ctx := context.Background()
	f.add("system:node:x")
	require.True(t, f.r.next(ctx))
	require.True(t, f.approved(t, "csr-x"))
	require.Equal(t, int64(1), rec.recorded.Load(), "the approval was not recorded applied")

	// The signer issues a certificate that is not PEM, for a machine that
	// answers to the node, and the cache shows it.
	m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "x"}}
	m.Spec.ClusterName, m.Spec.Hostname = f.cluster.Name, "x"
	require.NoError(t, f.r.Client.Create(ctx, m))
	live, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
	require.NoError(t, err)
	live.Status.Certificate = []byte("not PEM")
	_, err = f.csrs.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, live, metav1.UpdateOptions{})
	require.NoError(t, err)
	var cached certificatesv1.CertificateSigningRequest
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: "csr-x"}, &cached))
	cached.Status = live.Status
	require.NoError(t, f.r.Client.Status().Update(ctx, &cached))

	key := memoKey{cluster: f.cluster, uid: "uid-csr-x"}
	for look := range 3 {
		clk.Step(maxBackoff + time.Second)
		f.add("system:node:x")
		require.True(t, f.r.next(ctx))
		assert.True(t, f.r.failures.Has(key), "look %d: a certificate that could not be recorded is not looked at again", look)
	}
	assert.Equal(t, int64(1), rec.recorded.Load(), "the verdict was recorded applied again at the certificate's retries")
	assert.False(t, f.r.uncertain.Has(key), "a failure to record the certificate was taken for a failed write")
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
	approvedAs(&decided, "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c", t0)
	f := newQueueFixture(t, clk, decided)
	f.r.Shards = &oneShard{serving: true}
	settledCalls := 0
	f.r.adoptions.add(f.cluster, t0.Add(-5*time.Second), time.Time{}, func() { settledCalls++ })
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
	// Marked as a take-over's: it names the decision the condition names,
	// which a reader applies only if its log holds it (review 190).
	assert.Equal(t, int64(1), rec.adopted.Load(), "a take-over's record not marked adopted")
	assert.Equal(t, 1, settledCalls)
	assert.True(t, f.r.adoptions.peek(f.cluster).since.IsZero())
}

// recordsByDecision counts the records by decision id, and refuses those of
// the decisions in refuse (a decision-log sink that refuses some entries).
type recordsByDecision struct {
	*decider
	mu      sync.Mutex
	refuse  map[string]bool
	records map[string]int
}

func (d *recordsByDecision) RecordApplied(_ context.Context, a engine.Applied) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse[a.DecisionID] {
		return errors.New("the decision log refused the entry")
	}
	d.records[a.DecisionID]++
	return nil
}

func (d *recordsByDecision) counts() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.records)
}

// An adoption retried because one of its records was refused records that
// one only: the verdicts it recorded at the first pass are not recorded
// again (review 14, left as a Low then: duplicates while the sink refused).
func TestAnAdoptionRetriedRecordsOnlyWhatItHadNotRecorded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	var csrs []certificatesv1.CertificateSigningRequest
	ids := map[string]string{"csr-a": "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2a", "csr-b": "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2b"}
	for _, name := range []string{"csr-a", "csr-b"} {
		c := csrOf("system:node:"+name, name, t0)
		approvedAs(&c, ids[name], t0)
		csrs = append(csrs, c)
	}
	f := newQueueFixture(t, clk, csrs...)
	f.r.Shards = &oneShard{serving: true}
	settledCalls := 0
	f.r.adoptions.add(f.cluster, t0.Add(-5*time.Second), time.Time{}, func() { settledCalls++ })
	rec := &recordsByDecision{decider: f.dec, refuse: map[string]bool{ids["csr-b"]: true}, records: map[string]int{}}
	f.r.Engine = rec
	ctx := context.Background()

	_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	require.Equal(t, map[string]int{ids["csr-a"]: 1}, rec.counts())
	require.Zero(t, settledCalls, "the adoption was settled over a verdict whose record failed")

	rec.mu.Lock()
	rec.refuse = nil
	rec.mu.Unlock()
	_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{ids["csr-a"]: 1, ids["csr-b"]: 1}, rec.counts(), "the retried adoption recorded again what it had recorded")
	assert.Equal(t, 1, settledCalls)
}

// A request whose verdict write failed here (its act unsettled on the hold)
// and that is gone by the next pass leaves nothing to record, here or by the
// next holder: the pass that forgets it settles its act, so the shard's next
// release may say settled (before, such acts stayed pending for as long as
// the hold, and every release said unsettled since their stamp).
// servedThrough has this replica serve the fixture's cluster through a
// recording fence, which it returns.
func servedThrough(f *queueFixture) *recordingFence {
	fence := &recordingFence{pending: map[string]time.Time{}}
	f.r.Shards = &recordingShard{oneShard: oneShard{serving: true}, fence: fence}
	return fence
}

// failedWriteOfUnknownOutcome has a pass of the fixture's cluster, under
// fence, fail the verdict write on the request name with a timeout at at (it
// may have been applied), and returns the request and cluster as read.
func failedWriteOfUnknownOutcome(t *testing.T, f *queueFixture, fence *recordingFence, name string, at time.Time) (certificatesv1.CertificateSigningRequest, ichorv1alpha1.TalosCluster) {
	t.Helper()
	ctx := context.Background()
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	var csr certificatesv1.CertificateSigningRequest
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: name}, &csr))
	p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: at, fence: fence}
	p.writeFailed(&approval.UnknownOutcome{ResourceVersion: csr.ResourceVersion, Err: apierrors.NewTimeoutError("the write's answer", 1)}, &csr, nil, at, approval.UncertainWrite{}, false)
	return csr, c
}

func TestARequestGoneSettlesItsUnsettledAct(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
	fence := servedThrough(f)
	ctx := context.Background()
	csr, _ := failedWriteOfUnknownOutcome(t, f, fence, "csr-x", t0)
	require.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0}, fence.unsettled())

	// Still there: a pass keeps it unsettled.
	_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	require.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0}, fence.unsettled(), "a request still there was settled")

	require.NoError(t, f.r.Client.Delete(ctx, &csr))
	_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Empty(t, fence.unsettled(), "the act of a request gone stayed unsettled")
	assert.False(t, f.r.uncertain.Has(memoKey{cluster: f.cluster, uid: "uid-csr-x"}))
}

// A write answered with a timeout and not (yet) applied: the request, read
// again, is undecided and is decided again, but the failed write may still
// commit (the API server may still be at it), so it stays uncertain and its
// act unsettled until a later write of this replica's succeeds (the old one
// then fails the version it was made on) or the verdict in effect is
// recorded. Before, the read that found it undecided settled it, and a
// write that committed after that read was left without its record.
func TestAWriteThatMayStillCommitStaysUnsettledUntilAnotherIsWritten(t *testing.T) {
	for _, then := range []string{"pending, then the late commit", "approved again", "changed meanwhile", "too old"} {
		t.Run(then, func(t *testing.T) {
			t0 := time.Unix(1_000_000, 0)
			clk := clocktesting.NewFakeClock(t0)
			f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
			rec := &recordingDecider{decider: f.dec}
			f.r.Engine = rec
			fence := servedThrough(f)
			var late atomic.Pointer[certificatesv1.CertificateSigningRequest]
			f.csrs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, kruntime.Object, error) {
				if late.Load() != nil {
					return false, nil, nil
				}
				// Not applied (yet), and answered as a timeout.
				late.Store(a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).DeepCopy())
				return true, nil, apierrors.NewTimeoutError("the write's answer", 1)
			})
			ctx := context.Background()
			var c ichorv1alpha1.TalosCluster
			require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
			p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: clk.Now(), fence: fence}
			// The request as the API server has it (the fixture's cache
			// keeps versions of its own), as a cache in step would, at a
			// version of its own (the fake API server keeps none).
			gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
			cached, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
			require.NoError(t, err)
			cached.ResourceVersion = "1"
			require.NoError(t, f.csrs.Tracker().Update(gvr, cached, ""))
			require.Error(t, p.handle(ctx, cached.DeepCopy()))
			require.False(t, f.approved(t, "csr-x"))
			key := memoKey{cluster: f.cluster, uid: "uid-csr-x"}
			act := map[string]time.Time{"ns/demo/uid-csr-x": t0}
			require.Equal(t, act, fence.unsettled())

			if then == "approved again" {
				require.NoError(t, p.handle(ctx, cached.DeepCopy()))
				require.True(t, f.approved(t, "csr-x"))
				assert.Equal(t, int64(1), rec.recorded.Load())
				assert.Empty(t, fence.unsettled(), "a verdict written after the uncertain one left it unsettled")
				assert.False(t, f.r.uncertain.Has(key))
				return
			}

			f.dec.decide = func(context.Context, string) (engine.CSRDecision, error) { return pendingAs("NodeUnreadable"), nil }
			switch then {
			case "changed meanwhile":
				// A label: the request is at another version, which the
				// write, made on the one before, cannot commit on.
				live, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
				require.NoError(t, err)
				live.Labels = map[string]string{"changed": "yes"}
				live.ResourceVersion = "2"
				_, err = f.csrs.CertificatesV1().CertificateSigningRequests().Update(ctx, live, metav1.UpdateOptions{})
				require.NoError(t, err)
			case "too old":
				clk.Step(approval.UncertainWriteMaxAge)
			}
			require.NoError(t, p.handle(ctx, cached.DeepCopy()))
			require.False(t, f.approved(t, "csr-x"))
			if then != "pending, then the late commit" {
				assert.Empty(t, fence.unsettled(), "a write that can no longer commit left the shard unsettled")
				assert.False(t, f.r.uncertain.Has(key))
				return
			}
			assert.Equal(t, act, fence.unsettled(), "a read that found the request undecided settled a write that may still commit")
			assert.True(t, f.r.uncertain.Has(key))

			// The write commits late; the next look records it.
			require.NoError(t, f.csrs.Tracker().Update(gvr, late.Load(), ""))
			cached, err = f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
			require.NoError(t, err)
			require.NoError(t, p.handle(ctx, cached.DeepCopy()))
			assert.Equal(t, int64(1), rec.recorded.Load(), "the late commit was not recorded")
			assert.Empty(t, fence.unsettled())
			assert.False(t, f.r.uncertain.Has(key))
		})
	}
}

// The window of verdicts a taken-over cluster records again counts back
// from the take, not from when the shard change reaches the approver: a
// change mapped 10 s late (a busy controller) would otherwise miss the
// verdicts a dead holder wrote in the last 10 s before its lease ran out.
func TestTheAdoptionWindowCountsFromTheTake(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0.Add(10 * time.Second))
	f := newQueueFixture(t, clk)
	f.r.Shards = &oneShard{serving: true, takenAt: t0}
	reqs := f.r.shardToClusters(context.Background(), 0)
	require.Equal(t, []reconcile.Request{{NamespacedName: f.cluster}}, reqs)
	assert.Equal(t, t0.Add(-3*time.Second-2*time.Second), f.r.adoptions.peek(f.cluster).since, "the window does not count back from the take")
}

// hookDecider counts the records and runs hook once, at the first record.
type hookDecider struct {
	*decider
	n    atomic.Int64
	hook func()
}

func (d *hookDecider) RecordApplied(context.Context, engine.Applied) error {
	d.n.Add(1)
	if h := d.hook; h != nil {
		d.hook = nil
		h()
	}
	return nil
}

// Review 15, H1: a request made after a pass listed its cluster's requests,
// whose write a worker finds uncertain before the pass forgets the requests
// it did not list, is not taken for gone: it stays uncertain, and its act
// unsettled. Before, the pass settled it, and a release then said settled
// over a verdict that may be in effect without its record.
func TestAnUncertainWriteMadeDuringAPassIsNotTakenForGone(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	old := csrOf("system:node:a", "csr-a", t0)
	approvedAs(&old, "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2a", t0)
	f := newQueueFixture(t, clk, old)
	fence := servedThrough(f)
	f.r.adoptions.add(f.cluster, t0.Add(-5*time.Second), time.Time{}, func() {})
	ctx := context.Background()
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	rec := &hookDecider{decider: f.dec}
	rec.hook = func() {
		// While the pass records its adoption: a new request, whose write
		// a worker finds uncertain.
		n := csrOf("system:node:n", "csr-n", t0)
		n.UID = "uid-csr-n"
		require.NoError(t, f.r.Client.Create(ctx, &n))
		p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: t0, fence: fence}
		p.writeFailed(&approval.UnknownOutcome{ResourceVersion: n.ResourceVersion, Err: apierrors.NewTimeoutError("the write's answer", 1)}, &n, nil, t0, approval.UncertainWrite{}, false)
	}
	f.r.Engine = rec
	_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	require.Equal(t, int64(1), rec.n.Load(), "the adoption was not recorded")
	assert.Contains(t, fence.unsettled(), "ns/demo/uid-csr-n", "an uncertain write made during the pass was settled as gone")
	assert.True(t, f.r.uncertain.Has(memoKey{cluster: f.cluster, uid: "uid-csr-n"}), "an uncertain write made during the pass was forgotten")
}

// Review 15, M1: after a write of unknown outcome that was not applied, the
// request is written again; a pass that sees that write in its cache while
// the worker records it does not record it too (as the earlier write's
// verdict found applied).
func TestARequestWrittenAgainAfterAnUncertainWriteIsRecordedOnce(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, servingRequest(t, "csr-x", "x", t0))
	fence := servedThrough(f)
	ctx := context.Background()
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	// The request as the API server has it, at a version of its own (the
	// fake API server keeps none).
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	cached, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
	require.NoError(t, err)
	cached.ResourceVersion = "1"
	require.NoError(t, f.csrs.Tracker().Update(gvr, cached, ""))
	p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: t0, fence: fence}
	// Not applied: the request stays at the version it was made on.
	p.writeFailed(&approval.UnknownOutcome{ResourceVersion: "1", Err: apierrors.NewTimeoutError("the write's answer", 1)}, cached, nil, t0, approval.UncertainWrite{}, false)
	rec := &hookDecider{decider: f.dec}
	rec.hook = func() {
		// The worker's second write is in and the cache shows it; a pass
		// runs while the worker records it.
		live, err := f.csrs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-x", metav1.GetOptions{})
		require.NoError(t, err)
		var cur certificatesv1.CertificateSigningRequest
		require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: "csr-x"}, &cur))
		cur.Status = live.Status
		require.NoError(t, f.r.Client.Status().Update(ctx, &cur))
		_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
		require.NoError(t, err)
	}
	f.r.Engine = rec
	require.NoError(t, p.handle(ctx, cached.DeepCopy()))
	require.True(t, f.approved(t, "csr-x"))
	assert.Equal(t, int64(1), rec.n.Load(), "one verdict recorded applied twice")
	assert.Empty(t, fence.unsettled())
}

// Review 15, M2: a write the API server refused (it says so: a 403, a 422, a
// conflict with a request decided meanwhile) was not applied, and leaves the
// shard settled and the request not uncertain, however long the request
// then stays pending; one answered with an error that does not say so (a
// 504, a 500, a lost connection) may have been applied and is uncertain.
func TestOnlyAWriteThatMayHaveBeenAppliedIsUncertain(t *testing.T) {
	gr := certificatesv1.Resource("certificatesigningrequests")
	for name, tc := range map[string]struct {
		err       error
		uncertain bool
	}{
		"403":             {err: apierrors.NewForbidden(gr, "csr-x", errors.New("RBAC")), uncertain: false},
		"422":             {err: apierrors.NewInvalid(certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest").GroupKind(), "csr-x", nil), uncertain: false},
		"429":             {err: apierrors.NewTooManyRequests("slow down", 1), uncertain: false},
		"504":             {err: apierrors.NewTimeoutError("the write's answer", 1), uncertain: true},
		"500":             {err: apierrors.NewInternalError(errors.New("etcd")), uncertain: true},
		"lost connection": {err: errors.New("connection reset by peer"), uncertain: true},
	} {
		t.Run(name, func(t *testing.T) {
			t0 := time.Unix(1_000_000, 0)
			clk := clocktesting.NewFakeClock(t0)
			f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
			fence := servedThrough(f)
			f.csrs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, kruntime.Object, error) {
				return true, nil, tc.err
			})
			ctx := context.Background()
			f.add("system:node:x")
			require.True(t, f.r.next(ctx))
			require.False(t, f.approved(t, "csr-x"))
			key := memoKey{cluster: f.cluster, uid: "uid-csr-x"}
			assert.True(t, f.r.failures.Has(key), "the failed write is not tried again")
			assert.Equal(t, tc.uncertain, f.r.uncertain.Has(key))
			if tc.uncertain {
				assert.Equal(t, map[string]time.Time{"ns/demo/uid-csr-x": t0}, fence.unsettled())
			} else {
				assert.Empty(t, fence.unsettled(), "a refused write unsettled the shard")
			}
		})
	}
}

// A cluster deleted, or no longer enabled, leaves nothing any replica will
// record: its uncertain acts are settled, so that its shard's releases do
// not say unsettled for as long as the hold lasts. A cluster whose shard
// another replica took keeps them unsettled on the hold it gave up.
func TestAClusterGoneOrDisabledSettlesItsUncertainActs(t *testing.T) {
	for _, how := range []string{"deleted", "disabled", "served elsewhere"} {
		t.Run(how, func(t *testing.T) {
			t0 := time.Unix(1_000_000, 0)
			f := newQueueFixture(t, clocktesting.NewFakeClock(t0), csrOf("system:node:x", "csr-x", t0))
			fence := &recordingFence{pending: map[string]time.Time{}}
			shards := &recordingShard{oneShard: oneShard{serving: true}, fence: fence}
			f.r.Shards = shards
			ctx := context.Background()
			_, c := failedWriteOfUnknownOutcome(t, f, fence, "csr-x", t0)
			require.NotEmpty(t, fence.unsettled())
			switch how {
			case "deleted":
				require.NoError(t, f.r.Client.Delete(ctx, &c))
			case "disabled":
				c.Spec.Security.KubeletServingCertificates.Enabled = false
				require.NoError(t, f.r.Client.Update(ctx, &c))
			case "served elsewhere":
				shards.serving = false
			}
			_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
			require.NoError(t, err)
			assert.False(t, f.r.uncertain.Has(memoKey{cluster: f.cluster, uid: "uid-csr-x"}))
			if how == "served elsewhere" {
				assert.NotEmpty(t, fence.unsettled(), "a cluster served elsewhere settled the acts its next holder is to record")
				return
			}
			assert.Empty(t, fence.unsettled(), "a cluster that decides nothing more kept its acts unsettled")
		})
	}
}

// Review 16, M1: a verdict known to be in effect (its write succeeded)
// whose record the decision log refused is owed its record whatever becomes
// of its request: the pass that finds the request gone (garbage-collected an
// hour after approval while the sink was down) records it then, and settles
// it only once recorded; before, it was forgotten and its act settled, and
// no replica ever recorded it. So for a cluster deleted.
func TestARecordOwedIsMadeWhenItsRequestOrClusterIsGone(t *testing.T) {
	for _, gone := range []string{"request", "cluster"} {
		t.Run(gone, func(t *testing.T) {
			f, fence, clk := refusedRecordFixture(t)
			ctx := context.Background()
			unsettled := map[string]time.Time{"ns/demo/uid-csr-x": clk.Now()}
			require.Equal(t, unsettled, fence.unsettled())

			switch gone {
			case "request":
				var csr certificatesv1.CertificateSigningRequest
				require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: "csr-x"}, &csr))
				require.NoError(t, f.r.Client.Delete(ctx, &csr))
			case "cluster":
				var c ichorv1alpha1.TalosCluster
				require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
				require.NoError(t, f.r.Client.Delete(ctx, &c))
			}
			// The sink still refuses: owed, unsettled, looked at again soon.
			res, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
			require.NoError(t, err)
			assert.Equal(t, unsettled, fence.unsettled(), "a record still owed was settled")
			assert.True(t, f.r.uncertain.Has(memoKey{cluster: f.cluster, uid: "uid-csr-x"}), "a record still owed was forgotten")
			assert.True(t, res.RequeueAfter > 0 && res.RequeueAfter <= minBackoff, "a record still owed is not tried again soon: %s", res.RequeueAfter)

			rec := &recordsByDecision{decider: f.dec, records: map[string]int{}}
			f.r.Engine = rec
			_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
			require.NoError(t, err)
			assert.Equal(t, map[string]int{approve().DecisionID: 1}, rec.counts(), "the record owed was not made")
			assert.Empty(t, fence.unsettled())
			assert.False(t, f.r.uncertain.Has(memoKey{cluster: f.cluster, uid: "uid-csr-x"}))
		})
	}
}

// Review 16, L5: a shard taken from a replica whose release said it had not
// settled (a write in progress it could not wait for, or one answered with a
// timeout) stays adopted until such a write can no longer commit, and a pass
// then records a verdict that committed after the first pass looked: before,
// the first pass settled the adoption, and a late commit was never recorded.
func TestAnAdoptionAfterAnUnsettledReleaseStaysOpenWhileAWriteMayCommit(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
	f.r.ResyncInterval = time.Minute
	stamp := t0.Add(-10 * time.Second)
	f.r.Shards = &oneShard{serving: true, takenAt: t0, unsettledSince: stamp}
	ctx := context.Background()
	require.Len(t, f.r.shardToClusters(ctx, 0), 1)
	rec := &recordsByDecision{decider: f.dec, records: map[string]int{}}
	f.r.Engine = rec

	// The first pass finds the request undecided: nothing to record, and
	// the adoption stays open, looked at again when the write can no
	// longer commit.
	res, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.False(t, f.r.adoptions.peek(f.cluster).since.IsZero(), "the adoption was settled while the previous holder's write may commit")
	assert.LessOrEqual(t, res.RequeueAfter, time.Minute)

	// The previous holder's write commits late.
	var csr certificatesv1.CertificateSigningRequest
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: "csr-x"}, &csr))
	approvedAs(&csr, "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c", stamp)
	require.NoError(t, f.r.Client.Status().Update(ctx, &csr))
	clk.Step(time.Minute)
	_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c": 1}, rec.counts(), "the late commit was not recorded")
	assert.False(t, f.r.adoptions.peek(f.cluster).since.IsZero(), "settled before the write could no longer commit")

	// Once it can no longer commit, the pass settles it, and records
	// nothing again.
	clk.Step(approval.UncertainWriteMaxAge)
	res, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.True(t, f.r.adoptions.peek(f.cluster).since.IsZero(), "the adoption was not settled once no write could commit")
	assert.Equal(t, map[string]int{"0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c": 1}, rec.counts())
	assert.Equal(t, time.Minute, res.RequeueAfter)
}

// Review 17, L1: a request whose verdict was written and its record refused,
// deleted before the cache shows the verdict, is found gone by the read that
// checks it: the record owed is made then, not dropped.
func TestARecordOwedIsMadeWhenTheReadFindsTheRequestGone(t *testing.T) {
	f, fence, clk := refusedRecordFixture(t)
	ctx := context.Background()
	require.NoError(t, f.csrs.CertificatesV1().CertificateSigningRequests().Delete(ctx, "csr-x", metav1.DeleteOptions{}))

	rec := &recordsByDecision{decider: f.dec, records: map[string]int{}}
	f.r.Engine = rec
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	var cached certificatesv1.CertificateSigningRequest
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: "csr-x"}, &cached))
	require.False(t, approval.IsDecided(&cached), "the cache shows the verdict already")
	p := &pass{r: f.r, cluster: &c, target: f.r.localTarget(), now: clk.Now(), fence: fence}
	require.NoError(t, p.handle(ctx, &cached))
	assert.Equal(t, map[string]int{approve().DecisionID: 1}, rec.counts(), "the record owed was dropped")
	assert.Empty(t, fence.unsettled())
}

// approvedAs gives csr the Approved condition an approver writes for the
// decision of that id, at at.
func approvedAs(csr *certificatesv1.CertificateSigningRequest, id string, at time.Time) {
	csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
		Type: certificatesv1.CertificateApproved, Status: "True", LastUpdateTime: metav1.NewTime(at),
		Message: "approved (decision " + id + ", policy revision abc)",
	}}
}

// servingRequest is a kubelet-serving request of node, made at created, whose
// request the node's name can be read from (csrOf's has none).
func servingRequest(t *testing.T, name, node string, created time.Time) certificatesv1.CertificateSigningRequest {
	t.Helper()
	req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject(node)})
	require.NoError(t, err)
	c := csrgen.ServingObject(name, node, req)
	c.CreationTimestamp = metav1.NewTime(created)
	return *c
}

// A cluster taken over and deleted before a pass settled its adoption
// settles it as it is let go: nobody is left to record its verdicts. Its
// adoption was once dropped unsettled, and the shard's release then said
// it unsettled for the rest of the hold (the hostile review of
// 2026-12-05). One served elsewhere leaves it unsettled: the next holder
// records.
func TestAClusterDeletedBeforeItsAdoptionSettledSettlesIt(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clocktesting.NewFakeClock(t0))
	f.r.Shards = &oneShard{serving: true}
	settledCalls := 0
	f.r.adoptions.add(f.cluster, t0.Add(-5*time.Second), t0.Add(time.Minute), func() { settledCalls++ })
	ctx := context.Background()

	require.NoError(t, f.r.Client.Delete(ctx, &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: f.cluster.Name}}))
	_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Equal(t, 1, settledCalls, "the deleted cluster's adoption was not settled")
	assert.True(t, f.r.adoptions.peek(f.cluster).since.IsZero(), "the adoption is forgotten")

	f.r.adoptions.add(f.cluster, t0.Add(-5*time.Second), t0.Add(time.Minute), func() { settledCalls++ })
	f.r.letGo(ctx, f.cluster, false)
	assert.Equal(t, 1, settledCalls, "a cluster served elsewhere left its adoption settled")
}
