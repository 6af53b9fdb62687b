package shard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

const leaseNamespace = "ichor-shards"

// leaseEnv is a real API server with the namespace the Leases live in.
func leaseEnv(t *testing.T) kubernetes.Interface {
	t.Helper()
	env, err := harness.Start(t.Context(), harness.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	_, err = env.Clientset.CoreV1().Namespaces().Create(t.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return env.Clientset
}

// startReplica runs a replica's Set until the test ends.
func startReplica(t *testing.T, cs kubernetes.Interface, id string, shards int) *shard.Set {
	t.Helper()
	s, _ := startStoppable(t, cs, id, shards)
	return s
}

// startStoppable runs a replica's Set until stop (which waits for it to
// have stopped) or the test's end.
func startStoppable(t *testing.T, cs kubernetes.Interface, id string, shards int) (*shard.Set, func()) {
	t.Helper()
	return startStoppableWith(t, cs, id, shards, func(*shard.Options) {})
}

// startStoppableWith is startStoppable with the options changed by change.
func startStoppableWith(t *testing.T, cs kubernetes.Interface, id string, shards int, change func(*shard.Options)) (*shard.Set, func()) {
	t.Helper()
	o := shard.Options{Client: cs, Namespace: leaseNamespace, Identity: id, Shards: shards,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Log: testr.New(t).WithName(id)}
	change(&o)
	s, err := shard.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Start(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return s, stop
}

// servedOnce reports whether every shard is held by exactly one of sets.
func servedOnce(shards int, sets ...*shard.Set) bool {
	count := map[int]int{}
	for _, s := range sets {
		for _, h := range s.Held() {
			count[h]++
		}
	}
	for s := range shards {
		if count[s] != 1 {
			return false
		}
	}
	return true
}

// Review 4, S2: a release whose Lease write fails (a timeout during a
// rebalance) is tried again; before, the Lease kept naming the replica that
// gave the shard up, and the shard's owner never took it.
func TestShardAFailedReleaseIsTriedAgain(t *testing.T) {
	real := leaseEnv(t)
	var mu sync.Mutex
	failed := 0
	cs := failing(real, func(l *coordinationv1.Lease) error {
		mu.Lock()
		defer mu.Unlock()
		if l.Labels[shard.LabelRole] == "shard" && ptr.Deref(l.Spec.HolderIdentity, "x") == "" && failed < 3 {
			failed++
			return errors.New("injected: the API server timed out")
		}
		return nil
	})
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a, b) && len(b.Held()) > 0 }, 20*time.Second, 50*time.Millisecond,
		"a holds %v, b holds %v", a.Held(), b.Held())
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, failed, "no release failed: the test proved nothing")
}

// Review 4, S3: a membership Lease that someone wrote once, with a duration
// of its own choosing, is live only for the configured lease duration after
// it was seen to change; before, its shards were never served.
func TestShardAForgedMemberIsLiveNoLongerThanTheLeaseDuration(t *testing.T) {
	cs := leaseEnv(t)
	_, err := cs.CoordinationV1().Leases(leaseNamespace).Create(t.Context(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: shard.MemberLeaseName("ghost"), Labels: map[string]string{shard.LabelRole: "member"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ghost"), LeaseDurationSeconds: ptr.To[int32](1 << 30)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond,
		"the only replica holds %v of %d shards", a.Held(), shards)
}

// A shard Lease whose role label someone removes or changes leaves every
// replica's watch: its holder gives the shard up as taken. Before, every
// take's create then failed as already existing, unlogged, and the shard
// was served by no one until the label came back; now the owner puts the
// labels back and takes the shard again.
func TestShardALeaseStrippedOfItsRoleLabelIsServedAgain(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 4
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	leases := cs.CoordinationV1().Leases(leaseNamespace)
	for shardNo, role := range map[int]string{0: "", 1: "not-a-shard"} {
		l, err := leases.Get(t.Context(), shard.ShardLeaseName(shards, shardNo), metav1.GetOptions{})
		require.NoError(t, err)
		if role == "" {
			delete(l.Labels, shard.LabelRole)
		} else {
			l.Labels[shard.LabelRole] = role
		}
		l.Annotations = map[string]string{"example.com/kept": "yes"}
		_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return !slices.Contains(a.Held(), 0) && !slices.Contains(a.Held(), 1) }, 10*time.Second, 10*time.Millisecond,
		"the replica still serves the shards whose Leases left its watch: %v", a.Held())
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond,
		"shards unserved after their Leases lost the role label: the replica holds %v", a.Held())
	for shardNo := range 2 {
		l, err := leases.Get(t.Context(), shard.ShardLeaseName(shards, shardNo), metav1.GetOptions{})
		require.NoError(t, err)
		require.Equal(t, "shard", l.Labels[shard.LabelRole], "shard %d", shardNo)
		require.Equal(t, "a", ptr.Deref(l.Spec.HolderIdentity, ""), "shard %d", shardNo)
		require.Equal(t, "yes", l.Annotations["example.com/kept"], "shard %d: the labels' repair wrote more than the labels", shardNo)
	}
}

// A replica gives up the shards meant for one that joins together: each
// release waits for the acts begun under its hold, up to the renew deadline
// (2 s here), and then says from when the next holder records verdicts
// again. One after the other, a replica whose writes hang handed the last
// of k shards over (k-1) deadlines after the first, past the 5 s in which a
// shard moves for k = 4.
func TestShardReleasesWaitForTheirActsTogether(t *testing.T) {
	real := leaseEnv(t)
	const shards = 8
	var mu sync.Mutex
	var released []time.Time
	unsettled := map[string]string{} // Lease name: its release's unsettled-since
	cs := failing(real, func(l *coordinationv1.Lease) error {
		if l.Labels[shard.LabelRole] == "shard" && ptr.Deref(l.Spec.HolderIdentity, "x") == "" {
			mu.Lock()
			released = append(released, time.Now())
			unsettled[l.Name] = l.Annotations[shard.AnnotationUnsettledSince]
			mu.Unlock()
		}
		return nil
	})
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return len(a.Held()) == shards }, 20*time.Second, 50*time.Millisecond)
	// An act that does not end, a write that hangs, under every shard's
	// hold, each stamped with a time of its own.
	stamps := map[string]string{}
	for i := 0; len(stamps) < shards && i < 10000; i++ {
		uid := types.UID(fmt.Sprintf("cluster-%d", i))
		n := a.ShardOf(uid)
		if _, ok := stamps[shard.ShardLeaseName(shards, n)]; ok {
			continue
		}
		at := time.Date(2026, 1, 1, 0, 0, n, 0, time.UTC)
		f, ok := a.Fence(uid)
		require.True(t, ok)
		done, ok := f.Begin(at)
		require.True(t, ok)
		t.Cleanup(done)
		stamps[shard.ShardLeaseName(shards, n)] = at.Format(time.RFC3339Nano)
	}
	require.Len(t, stamps, shards)
	want := map[string]string{}
	for n := range shards {
		if shard.Owner([]string{"a", "b"}, n) == "b" {
			want[shard.ShardLeaseName(shards, n)] = stamps[shard.ShardLeaseName(shards, n)]
		}
	}
	require.GreaterOrEqual(t, len(want), 3, "too few shards move to b for the test to show anything")

	joined := time.Now()
	b := startReplica(t, real, "b", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a, b) && len(b.Held()) == len(want) }, 30*time.Second, 50*time.Millisecond,
		"a holds %v, b holds %v", a.Held(), b.Held())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, want, unsettled, "each release says its own hold's act in progress (and a released only the shards meant for b, each once)")
	require.GreaterOrEqual(t, released[0].Sub(joined), 2*time.Second, "a released before its acts' deadline: it did not wait for them")
	spread := released[len(released)-1].Sub(released[0])
	require.Less(t, spread, 2*time.Second, "the %d releases were written over %v: one after another, each waiting for its hung act", len(released), spread)
}

// A hold given up without a release (its Lease out of the watch, here)
// whose act had not ended: the release that names nobody on the Lease
// later says that act's stamp, so that the next holder records the verdicts
// in effect since then. Before, a release of a shard no longer held wrote
// nothing of the kind, and the next holder looked back a lease duration
// only (review of the stripped label's fix).
func TestShardAReleaseAfterADropSaysWhatTheDroppedHoldLeftUnsettled(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return len(a.Held()) == shards }, 20*time.Second, 50*time.Millisecond)
	moving := -1
	for n := range shards {
		if shard.Owner([]string{"a", "b"}, n) == "b" {
			moving = n
			break
		}
	}
	require.GreaterOrEqual(t, moving, 0, "no shard moves to b")
	var uid types.UID
	for i := 0; uid == ""; i++ {
		if u := types.UID(fmt.Sprintf("cluster-%d", i)); a.ShardOf(u) == moving {
			uid = u
		}
	}
	at := time.Date(2026, 1, 1, 0, 0, 7, 0, time.UTC)
	f, ok := a.Fence(uid)
	require.True(t, ok)
	done, ok := f.Begin(at)
	require.True(t, ok)
	t.Cleanup(done)

	leases := cs.CoordinationV1().Leases(leaseNamespace)
	l, err := leases.Get(t.Context(), shard.ShardLeaseName(shards, moving), metav1.GetOptions{})
	require.NoError(t, err)
	delete(l.Labels, shard.LabelRole)
	_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !slices.Contains(a.Held(), moving) }, 10*time.Second, 10*time.Millisecond)

	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool { return slices.Contains(b.Held(), moving) && servedOnce(shards, a, b) }, 30*time.Second, 50*time.Millisecond,
		"a holds %v, b holds %v", a.Held(), b.Held())
	assert.Equal(t, at, b.UnsettledSince(moving).UTC(), "b does not record the verdicts a's act in progress may have left")
}

// withLeases is cs with each of its Lease clients wrapped by wrap: how the
// tests fail, hold up, count or hide what a replica reads and writes.
func withLeases(cs kubernetes.Interface, wrap func(coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface) kubernetes.Interface {
	return wrappedLeases{cs, wrap}
}

type wrappedLeases struct {
	kubernetes.Interface
	wrap func(coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface
}

func (c wrappedLeases) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return wrappedCoordination{c.Interface.CoordinationV1(), c.wrap}
}

type wrappedCoordination struct {
	coordinationv1client.CoordinationV1Interface
	wrap func(coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface
}

func (c wrappedCoordination) Leases(namespace string) coordinationv1client.LeaseInterface {
	return c.wrap(c.CoordinationV1Interface.Leases(namespace))
}

// failing is cs failing the Lease writes (creates and updates) fail says to.
func failing(cs kubernetes.Interface, fail func(*coordinationv1.Lease) error) kubernetes.Interface {
	return withLeases(cs, func(l coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface {
		return failingLeaseClient{l, fail}
	})
}

type failingLeaseClient struct {
	coordinationv1client.LeaseInterface
	fail func(*coordinationv1.Lease) error
}

func (l failingLeaseClient) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if err := l.fail(lease); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Create(ctx, lease, opts)
}

func (l failingLeaseClient) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := l.fail(lease); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}

// The membership Leases of replicas gone (a Pod killed, or stopped cleanly
// and so naming nobody) are deleted once unchanged for StaleMemberAfter;
// those of live replicas, and a Lease outside the members' names, are not.
// Before, every Pod name ever run left its Lease for ever (stop 63's
// review). So are the shard Leases of a shard count no longer given, which
// each change of count left for ever, but never one named for this count.
func TestShardTheMembershipLeasesOfGoneReplicasAreDeleted(t *testing.T) {
	cs := leaseEnv(t)
	leases := cs.CoordinationV1().Leases(leaseNamespace)
	w, err := leases.Watch(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)
	defer w.Stop()
	var mu sync.Mutex
	deleted := map[string]time.Time{}
	go func() {
		for e := range w.ResultChan() {
			if l, ok := e.Object.(*coordinationv1.Lease); ok && e.Type == watch.Deleted {
				mu.Lock()
				deleted[l.Name] = time.Now()
				mu.Unlock()
			}
		}
	}()
	member := map[string]string{shard.LabelRole: "member"}
	for name, holder := range map[string]string{shard.MemberLeaseName("killed"): "killed#0123456789abcdef", "not-a-membership": "killed"} {
		_, err := leases.Create(t.Context(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: member},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	const shards = 4
	// Shard Leases of a count no longer given: one held by a replica gone,
	// one naming a replica that runs now with the new count. And one named
	// for this count, whatever its label says, which is never collected.
	for name, o := range map[string]struct{ holder, shards string }{
		shard.ShardLeaseName(8, 0): {"killed", "8"}, shard.ShardLeaseName(8, 1): {"a", "8"}, shard.ShardLeaseName(shards, 9): {"", "8"},
	} {
		_, err := leases.Create(t.Context(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{shard.LabelRole: "shard", shard.LabelShards: o.shards}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(o.holder)},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	const after = 5 * time.Second
	stale := func(o *shard.Options) { o.StaleMemberAfter = after }
	started := time.Now()
	a, _ := startStoppableWith(t, cs, "a", shards, stale)
	b, _ := startStoppableWith(t, cs, "b", shards, stale)
	_, stopC := startStoppableWith(t, cs, "c", shards, stale)
	require.Eventually(t, func() bool {
		l, err := leases.Get(t.Context(), shard.MemberLeaseName("c"), metav1.GetOptions{})
		return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") != ""
	}, 20*time.Second, 50*time.Millisecond, "c never became a member")
	stopping := time.Now()
	stopC()
	gone := []string{shard.MemberLeaseName("killed"), shard.MemberLeaseName("c"), shard.ShardLeaseName(8, 0), shard.ShardLeaseName(8, 1)}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, name := range gone {
			if deleted[name].IsZero() {
				return false
			}
		}
		return true
	}, 40*time.Second, 100*time.Millisecond, "the gone replicas' membership Leases, or the old count's shard Leases, were not deleted")
	mu.Lock()
	// Not before they were seen unchanged for StaleMemberAfter: the killed
	// replica's and the old count's since the first replica's start, c's
	// since its release.
	assert.GreaterOrEqual(t, deleted[gone[0]].Sub(started), after, "the killed replica's Lease went early")
	assert.GreaterOrEqual(t, deleted[gone[1]].Sub(stopping), after, "c's Lease went early")
	assert.GreaterOrEqual(t, deleted[gone[2]].Sub(started), after, "an old count's shard Lease went early")
	assert.GreaterOrEqual(t, deleted[gone[3]].Sub(started), after, "an old count's shard Lease went early")
	mu.Unlock()
	require.Eventually(t, func() bool { return servedOnce(shards, a, b) }, 20*time.Second, 50*time.Millisecond)
	for _, name := range []string{shard.MemberLeaseName("a"), shard.MemberLeaseName("b"), "not-a-membership", shard.ShardLeaseName(shards, 9)} {
		_, err := leases.Get(t.Context(), name, metav1.GetOptions{})
		require.NoError(t, err, name)
	}
	mu.Lock()
	defer mu.Unlock()
	for name := range deleted {
		assert.Contains(t, gone, name, "a Lease not of a gone replica was deleted")
	}
}
