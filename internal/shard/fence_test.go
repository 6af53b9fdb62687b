package shard_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/ichor-dev/ichor-policy/internal/shard"
)

// jumpClock is the real clock, moved on by what the test says: to a
// replica paused past its renew deadline, the monotonic clock has jumped.
type jumpClock struct {
	mu sync.Mutex
	by time.Duration
}

func (c *jumpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.by)
}

func (c *jumpClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *jumpClock) jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.by += d
}

func startWithClock(t *testing.T, cs kubernetes.Interface, id string, shards int, clock *jumpClock) *shard.Set {
	t.Helper()
	s, err := shard.New(shard.Options{Client: cs, Namespace: leaseNamespace, Identity: id, Shards: shards,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Log: testr.New(t).WithName(id), Clock: clock})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// Review 4, S1: a replica whose last membership renewal is older than the
// renew deadline (it was paused) acts on nothing: its fences refuse at
// once, and end when it gives its shards up before its next renewal. It
// serves again only under a new hold, taken through the shard's Lease; the
// old fence stays shut.
func TestShardAReplicaPastItsRenewDeadlineActsOnNothing(t *testing.T) {
	cs := leaseEnv(t)
	clock := &jumpClock{}
	const shards = 4
	a := startWithClock(t, cs, "a", shards, clock)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	uid := types.UID("cluster-1")
	f, ok := a.Fence(uid)
	require.True(t, ok)
	done, ok := f.Begin(time.Time{})
	require.True(t, ok, "a fresh hold refuses to act")
	done()

	clock.jump(2 * time.Second)
	_, ok = f.Begin(time.Time{})
	assert.False(t, ok, "acted with a renewal older than the renew deadline")
	_, served := a.Serves(uid)
	assert.False(t, served)
	select {
	case <-f.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the hold's context did not end")
	}
	require.Eventually(t, func() bool { _, ok := a.Fence(uid); return ok }, 20*time.Second, 50*time.Millisecond,
		"the replica did not take its shard back")
	_, ok = f.Begin(time.Time{})
	assert.False(t, ok, "the old hold acts again once the shard is taken back")
}

// Review 4, S1 (3): a replica whose watch judges the holder of a shard gone
// takes the shard only if the holder's membership, read from the API
// server, is unrenewed. Here b's watch never brings a change of a
// membership Lease (it lags for ever) while a renews: b takes only the
// shards rendezvous hashing gives it over both, which a gives up.
func TestShardAHolderRenewedBehindALaggingWatchKeepsItsShards(t *testing.T) {
	real := leaseEnv(t)
	const shards = 8
	a := startReplica(t, real, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	b := startReplica(t, withLeases(real, func(l coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface {
		return blindLeases{l}
	}), "b", shards)
	both := []string{"a", "b"}
	require.Eventually(t, func() bool { return servedOnce(shards, a, b) && len(b.Held()) > 0 }, 20*time.Second, 50*time.Millisecond,
		"a holds %v, b holds %v", a.Held(), b.Held())
	// Well past a lease duration of b's frozen view of a.
	deadline := time.Now().Add(3 * 3 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range b.Held() {
			require.Equal(t, "b", shard.Owner(both, s), "b took shard %d from a, which renews", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert.True(t, servedOnce(shards, a, b), "a holds %v, b holds %v", a.Held(), b.Held())
}

// blindLeases watches the Leases without ever seeing a membership Lease
// change: they are as first listed.
type blindLeases struct {
	coordinationv1client.LeaseInterface
}

func (l blindLeases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := l.LeaseInterface.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		lease, ok := e.Object.(*coordinationv1.Lease)
		return e, !ok || lease.Labels[shard.LabelRole] != "member"
	}), nil
}

// Review 4, S6: a replica that gives a shard up waits for its acts in
// progress, then says on the Lease until when it recorded its verdicts, and
// the next holder is told; not while it has another replica's verdicts
// still to record (a cluster it took over from one that died), so that the
// next holder records those.
func TestShardAReleaseSaysUntilWhenItsVerdictsAreRecorded(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	both := []string{"a", "b"}
	var settled, unsettled types.UID
	for i := 0; settled == "" || unsettled == ""; i++ {
		uid := types.UID(fmt.Sprintf("cluster-%d", i))
		switch s := shard.Of(uid, shards); {
		case shard.Owner(both, s) != "b":
		case settled == "":
			settled = uid
		case s != shard.Of(settled, shards):
			unsettled = uid
		}
	}
	// The approver notes the adoptions of every shard's clusters once taken.
	for _, s := range a.Held() {
		a.AdoptionsNoted(s)
	}
	fs, ok := a.Fence(settled)
	require.True(t, ok)
	fs.Adopt()()
	fu, ok := a.Fence(unsettled)
	require.True(t, ok)
	_ = fu.Adopt()
	// An act in progress when b joins: the release waits for it, and lets
	// it run (its context is not cancelled: a write cancelled once sent may
	// have been applied all the same; review 5, F1).
	done, ok := fs.Begin(time.Time{})
	require.True(t, ok)
	ended := make(chan time.Time, 1)
	cancelledDuringAct := make(chan bool, 1)
	go func() {
		for {
			if _, served := a.Serves(settled); !served {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		cancelledDuringAct <- fs.Context().Err() != nil
		ended <- time.Now()
		done()
	}()

	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool {
		_, s1 := b.Serves(settled)
		_, s2 := b.Serves(unsettled)
		return s1 && s2
	}, 20*time.Second, 50*time.Millisecond, "b did not take the shards")
	at := b.Settled(shard.Of(settled, shards))
	require.False(t, at.IsZero(), "the release did not say until when its verdicts are recorded")
	actDone := <-ended
	assert.False(t, <-cancelledDuringAct, "the release cancelled the act it waits for")
	assert.False(t, at.Before(actDone), "said settled at %s, before its act ended at %s", at, actDone)
	assert.True(t, b.Settled(shard.Of(unsettled, shards)).IsZero(), "said settled with a dead replica's verdicts still to record")
	select {
	case <-fs.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the released hold's context did not end")
	}
}

// Review 5, F1: an act whose write failed otherwise than by a conflict (it
// may have been applied all the same) or whose record failed unsettles the
// hold: its release says nothing of until when verdicts are recorded, so
// that the next holder records the verdict in effect, and says the act's
// stamp (review 12, M1: a write answered with a timeout long after it was
// stamped is older than the window the next holder looks back otherwise).
// An act settled since (recorded after all) leaves the hold settled. F3: nor
// does the release of a shard taken from a replica that said nothing, before
// the approver has noted its clusters' adoptions.
func TestShardAReleaseAfterAnUncertainWriteSaysNothingSettled(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	both := []string{"a", "b"}
	var uncertain, clean, unnoted, resettled types.UID
	for i := 0; uncertain == "" || clean == "" || unnoted == "" || resettled == ""; i++ {
		uid := types.UID(fmt.Sprintf("cluster-%d", i))
		switch s := shard.Of(uid, shards); {
		case shard.Owner(both, s) != "b":
		case uncertain == "":
			uncertain = uid
		case s == shard.Of(uncertain, shards):
		case clean == "":
			clean = uid
		case s == shard.Of(clean, shards):
		case unnoted == "":
			unnoted = uid
		case s != shard.Of(unnoted, shards):
			resettled = uid
		}
	}
	for _, s := range a.Held() {
		if s != shard.Of(unnoted, shards) {
			a.AdoptionsNoted(s)
		}
	}
	stamped := time.Now().Add(-time.Minute).Round(0)
	for _, uid := range []types.UID{uncertain, clean, resettled} {
		f, ok := a.Fence(uid)
		require.True(t, ok)
		done, ok := f.Begin(time.Time{})
		require.True(t, ok)
		switch uid {
		case uncertain:
			f.Unsettle("csr-uid-1", stamped.Add(time.Second))
			f.Unsettle("csr-uid-2", stamped)
		case resettled:
			f.Unsettle("csr-uid-3", stamped)
			f.Settle("csr-uid-3")
		}
		done()
	}
	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool {
		_, s1 := b.Serves(uncertain)
		_, s2 := b.Serves(clean)
		_, s3 := b.Serves(unnoted)
		_, s4 := b.Serves(resettled)
		return s1 && s2 && s3 && s4
	}, 20*time.Second, 50*time.Millisecond, "b did not take the shards")
	assert.True(t, b.Settled(shard.Of(uncertain, shards)).IsZero(), "said settled after a write that may have been applied unrecorded")
	assert.True(t, stamped.Equal(b.UnsettledSince(shard.Of(uncertain, shards))), "unsettled since %s, want the earliest act's stamp %s", b.UnsettledSince(shard.Of(uncertain, shards)), stamped)
	assert.False(t, b.Settled(shard.Of(resettled, shards)).IsZero(), "an act settled since left the release unsettled")
	assert.True(t, b.UnsettledSince(shard.Of(resettled, shards)).IsZero())
	assert.True(t, b.UnsettledSince(shard.Of(unnoted, shards)).IsZero(), "an unsettled adoption has no act's stamp")
	assert.True(t, b.Settled(shard.Of(unnoted, shards)).IsZero(), "said settled before the adoptions were noted")
	assert.False(t, b.Settled(shard.Of(clean, shards)).IsZero(), "a release with every act recorded did not say so")
}

// Review 12, L2: a replica that stops (SIGTERM) lets the acts in progress
// under its holds finish before it gives the shards up, as a release to a
// replica that joins does: the holds do not end with the context the Set was
// started with, which the manager cancels first. Before, every write in
// flight at a rolling update was cancelled once sent (and perhaps applied),
// and each shard was given up unsettled.
func TestShardAStoppingReplicaLetsItsActsInProgressFinish(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 4
	s, err := shard.New(shard.Options{Client: cs, Namespace: leaseNamespace, Identity: "a", Shards: shards,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
		Log: testr.New(t).WithName("a")})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = s.Start(ctx) }()
	t.Cleanup(func() { stop(); <-stopped })
	require.Eventually(t, func() bool { return servedOnce(shards, s) }, 20*time.Second, 50*time.Millisecond)
	for _, h := range s.Held() {
		s.AdoptionsNoted(h)
	}
	const uid = types.UID("cluster-0")
	f, ok := s.Fence(uid)
	require.True(t, ok)
	done, ok := f.Begin(time.Time{})
	require.True(t, ok)

	stop()
	// The shard is given up (no act begins), and the act in progress still
	// runs: its context ends only once it is done.
	require.Eventually(t, func() bool { _, served := s.Serves(uid); return !served }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	assert.NoError(t, f.Context().Err(), "the act in progress was cancelled with the replica's context")
	done()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the replica did not stop")
	}
	assert.Error(t, f.Context().Err(), "the hold outlived the replica")
	lease, err := cs.CoordinationV1().Leases(leaseNamespace).Get(context.Background(), shard.ShardLeasePrefix+strconv.Itoa(shards)+"-"+strconv.Itoa(shard.Of(uid, shards)), metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEmpty(t, lease.Annotations[shard.AnnotationSettledUntil], "given up unsettled: %v", lease.Annotations)
}

// Review 13, M2: a release that cannot wait for an act in progress (a write
// hanging on a slow API server, which may still be applied) says its stamp,
// so that the next holder records from it; without, its window began a
// lease duration and two seconds before the take, after a write stamped
// earlier.
func TestShardAReleaseThatCannotWaitForAnActSaysItsStamp(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	for _, s := range a.Held() {
		a.AdoptionsNoted(s)
	}
	uid := ownedBy(t, shards, []string{"a", "b"}, "b")
	f, ok := a.Fence(uid)
	require.True(t, ok)
	stamped := time.Now().Add(-time.Minute).Truncate(time.Second)
	done, ok := f.Begin(stamped)
	require.True(t, ok)
	defer done()

	started := time.Now()
	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool { _, served := b.Serves(uid); return served }, 30*time.Second, 50*time.Millisecond, "b did not take the shard")
	assert.True(t, b.Settled(shard.Of(uid, shards)).IsZero(), "said settled with a write still in progress")
	assert.True(t, stamped.Equal(b.UnsettledSince(shard.Of(uid, shards))), "unsettled since %s, want the act's stamp %s", b.UnsettledSince(shard.Of(uid, shards)), stamped)
	// The approver's window counts back from the take.
	taken := b.TakenAt(shard.Of(uid, shards))
	assert.False(t, taken.Before(started) || taken.After(time.Now()), "taken at %s, not between b's start at %s and now", taken, started)
	assert.True(t, a.TakenAt(shard.Of(uid, shards)).IsZero(), "a replica says when it took a shard it gave up")
}

// Review 13, M3: what a replica was told to record (unsettled-since) is
// said again by its own release while it has not recorded it (its
// adoptions not settled), so that the replica after it records from there;
// before, the stamp was lost at the second hand-over.
func TestShardAnUnsettledSinceIsCarriedToTheNextHolder(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 16
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	for _, s := range a.Held() {
		a.AdoptionsNoted(s)
	}
	// A shard that moves from a to b when b joins, then from b to c.
	var uid types.UID
	for i := 0; uid == "" && i < 10000; i++ {
		u := types.UID(fmt.Sprintf("cluster-%d", i))
		s := shard.Of(u, shards)
		if shard.Owner([]string{"a", "b"}, s) == "b" && shard.Owner([]string{"a", "b", "c"}, s) == "c" {
			uid = u
		}
	}
	require.NotEmpty(t, uid, "no shard of %d moves from a to b to c", shards)
	f, ok := a.Fence(uid)
	require.True(t, ok)
	stamped := time.Now().Add(-time.Minute).Truncate(time.Second)
	f.Unsettle("csr-uid", stamped)

	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool { _, served := b.Serves(uid); return served }, 30*time.Second, 50*time.Millisecond, "b did not take the shard")
	require.True(t, stamped.Equal(b.UnsettledSince(shard.Of(uid, shards))))
	// b's approver has not noted (let alone settled) its adoptions when c
	// joins.
	c := startReplica(t, cs, "c", shards)
	require.Eventually(t, func() bool { _, served := c.Serves(uid); return served }, 30*time.Second, 50*time.Millisecond, "c did not take the shard")
	assert.True(t, stamped.Equal(c.UnsettledSince(shard.Of(uid, shards))), "c was told %s, want %s", c.UnsettledSince(shard.Of(uid, shards)), stamped)
}

// ownedBy is a cluster UID whose shard rendezvous hashing gives to owner
// among live.
func ownedBy(t *testing.T, shards int, live []string, owner string) types.UID {
	t.Helper()
	for i := range 10000 {
		uid := types.UID(fmt.Sprintf("cluster-%d", i))
		if shard.Owner(live, shard.Of(uid, shards)) == owner {
			return uid
		}
	}
	t.Fatalf("no cluster for %s among %v", owner, live)
	return ""
}

// Review 14, M3: a hold dropped without a Lease write (its renewals lapsed)
// and taken back by the same replica records from what it left unsettled
// (a write answered with a timeout, stamped 10 s before): before, the new
// hold's window began a lease duration and two seconds before the retake,
// after the stamp.
func TestShardAHoldTakenBackFromItselfRecordsWhatTheDroppedOneLeft(t *testing.T) {
	cs := leaseEnv(t)
	clock := &jumpClock{}
	const shards = 1
	a := startWithClock(t, cs, "a", shards, clock)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	uid := types.UID("cluster-1")
	f, ok := a.Fence(uid)
	require.True(t, ok)
	stamped := clock.Now().Add(-10 * time.Second).Truncate(time.Second)
	f.Unsettle("ns/c/uid-csr", stamped)

	clock.jump(2 * time.Second) // past the renew deadline: the hold is dropped
	select {
	case <-f.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the hold was not dropped")
	}
	require.Eventually(t, func() bool { _, ok := a.Fence(uid); return ok }, 20*time.Second, 50*time.Millisecond, "not taken back")
	assert.True(t, stamped.Equal(a.UnsettledSince(0)), "the hold taken back records from %s, want the dropped one's act %s", a.UnsettledSince(0), stamped)
}

// A membership Lease deleted (someone "resetting" the sharding) or made to
// name another holder is a change of that replica's membership, not its
// death: its shards are taken from it only once its membership Lease has
// stayed so for the lease duration. After the delete a makes its Lease
// again at its next renewal and keeps its shards (before the fix b took
// them at once); after the rename a cannot renew until the renamed Lease
// expires, gives its shards up, and takes them back. No shard is ever held
// by both, and each is held once at the end.
func TestShardAMembershipLeaseDeletedOrRenamedIsNoDeath(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	b := startReplica(t, cs, "b", shards)
	both := []string{"a", "b"}
	require.Eventually(t, func() bool { return servedOnce(shards, a, b) && len(a.Held()) > 0 && len(b.Held()) > 0 },
		20*time.Second, 50*time.Millisecond, "a holds %v, b holds %v", a.Held(), b.Held())

	leases := cs.CoordinationV1().Leases(leaseNamespace)
	name := shard.MemberLeaseName("a")
	for _, change := range []string{"deleted", "renamed"} {
		if change == "deleted" {
			require.NoError(t, leases.Delete(t.Context(), name, metav1.DeleteOptions{}))
		} else {
			l, err := leases.Get(t.Context(), name, metav1.GetOptions{})
			require.NoError(t, err)
			l.Spec.HolderIdentity = ptrTo("x")
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
		deadline := time.Now().Add(3 * 3 * time.Second)
		for time.Now().Before(deadline) {
			held := map[int]bool{}
			for _, s := range a.Held() {
				held[s] = true
			}
			for _, s := range b.Held() {
				require.False(t, held[s], "%s: shard %d held by a and b at once", change, s)
				if change == "deleted" {
					require.Equal(t, "b", shard.Owner(both, s), "b took shard %d from a, whose membership Lease was only deleted", s)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		require.Eventually(t, func() bool { return servedOnce(shards, a, b) }, 20*time.Second, 50*time.Millisecond,
			"%s: a holds %v, b holds %v", change, a.Held(), b.Held())
	}
}

func ptrTo[T any](v T) *T { return &v }

// A release whose unsettled-since is ahead of the taker's clock (the
// releasing replica's clock runs ahead) still says unsettled: the taker
// counts it from its own now, and its approver keeps looking for as long as
// the stamped write may commit. Before, the stamp was dropped, the adoption
// settled at its first pass, and a write of the previous holder's that
// committed after it was left without its record (review 197C F1).
func TestShardAnUnsettledSinceAheadOfTheTakersClockStillSaysUnsettled(t *testing.T) {
	cs := leaseEnv(t)
	const shards = 8
	a := startReplica(t, cs, "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, a) }, 20*time.Second, 50*time.Millisecond)
	for _, s := range a.Held() {
		a.AdoptionsNoted(s)
	}
	uid := ownedBy(t, shards, []string{"a", "b"}, "b")
	f, ok := a.Fence(uid)
	require.True(t, ok)
	f.Unsettle("csr-uid", time.Now().Add(time.Hour).Truncate(time.Second))

	b := startReplica(t, cs, "b", shards)
	require.Eventually(t, func() bool { _, served := b.Serves(uid); return served }, 30*time.Second, 50*time.Millisecond, "b did not take the shard")
	since := b.UnsettledSince(shard.Of(uid, shards))
	assert.False(t, since.IsZero(), "the release's unsettled-since ahead of b's clock was dropped")
	assert.False(t, since.After(time.Now()), "unsettled since %s, after b's now", since)
}
