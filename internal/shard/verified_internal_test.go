package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// A renewal that the read from the API server is the first to show is
// noted as seen when the answer came, not when the read was sent: noted
// earlier, it would expire early by the read's latency, and a replica slow
// to hear from the API server could take the shards of one still serving
// them (review of ee75044).
func TestAMembershipReadIsNotedWhenItsAnswerCame(t *testing.T) {
	const latency = 2 * time.Second
	member := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: MemberLeaseName("b"), Namespace: "ichor-system", ResourceVersion: "7",
			Labels: map[string]string{LabelRole: roleMember, LabelShards: "4"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("b")},
	}
	client := fake.NewClientset(member)
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
	client.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		clock.Step(latency) // the read on its way
		return false, nil, nil
	})
	s, err := New(Options{Client: client, Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)

	v, err := s.verified(t.Context())
	require.NoError(t, err)
	require.True(t, v.isLive["b"], "b's membership, first seen by the read")

	// A lease duration less a little after the answer (more than one
	// after the read was sent), with no renewal seen since: still live.
	clock.Step(s.o.LeaseDuration - 500*time.Millisecond)
	v, err = s.live(clock.Now(), []*coordinationv1.Lease{member})
	require.NoError(t, err)
	require.True(t, v.isLive["b"], "b expired %s after the answer", s.o.LeaseDuration-500*time.Millisecond)

	// A lease duration after the answer: gone.
	clock.Step(time.Second)
	v, err = s.live(clock.Now(), []*coordinationv1.Lease{member})
	require.NoError(t, err)
	require.False(t, v.isLive["b"])
}

// A membership holder read back names the replica: a process's holder
// without its nonce, a holder of a version without one as it is, and
// nothing that merely looks like a nonce is cut.
func TestAMembershipHolderNamesItsReplica(t *testing.T) {
	process, err := processHolder("ichor-policy-7d9c-x")
	require.NoError(t, err)
	require.Regexp(t, `^ichor-policy-7d9c-x#[0-9a-f]{16}$`, process)
	other, err := processHolder("ichor-policy-7d9c-x")
	require.NoError(t, err)
	require.NotEqual(t, process, other, "two processes of one replica wrote the same holder")
	for holder, replica := range map[string]string{
		process:                "ichor-policy-7d9c-x",
		"a#b#0123456789abcdef": "a#b",
		"ichor-policy-7d9c-x":  "ichor-policy-7d9c-x",
		"a#0123456789abcde":    "a#0123456789abcde",
		"a#0123456789abcdeg":   "a#0123456789abcdeg",
		"#0123456789abcdef":    "",
		"a#0123456789abcdef0":  "a#0123456789abcdef0",
		"":                     "",
	} {
		require.Equal(t, replica, replicaOf(holder), "holder %q", holder)
	}
}

// client-go's elector, releasing after a renewal that failed, writes
// "nobody" on the membership Lease as it reads it then, whoever that names:
// the lock writes it only when the Lease names this process. And a
// duration shorter than the configured one, as the Lease says it, is read
// as the configured one.
func TestTheMembershipIsReleasedOnlyWhenItNamesThisProcess(t *testing.T) {
	client := fake.NewClientset()
	s, err := New(Options{Client: client, Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond})
	require.NoError(t, err)
	other, err := processHolder("a")
	require.NoError(t, err)
	leases := client.CoordinationV1().Leases("ichor-system")
	_, err = leases.Create(t.Context(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: MemberLeaseName("a"), Namespace: "ichor-system"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(other), LeaseDurationSeconds: ptr.To[int32](1)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	lock := s.membershipLock()
	record, _, err := lock.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, record.LeaseDurationSeconds, "the Lease's own duration of 1s was taken")
	require.NoError(t, lock.Update(t.Context(), resourcelock.LeaderElectionRecord{}))
	l, err := leases.Get(t.Context(), MemberLeaseName("a"), metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, other, ptr.Deref(l.Spec.HolderIdentity, ""), "another process's membership was released")

	l.Spec.HolderIdentity = ptr.To(s.process)
	_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, _, err = lock.Get(t.Context())
	require.NoError(t, err)
	require.NoError(t, lock.Update(t.Context(), resourcelock.LeaderElectionRecord{}))
	l, err = leases.Get(t.Context(), MemberLeaseName("a"), metav1.GetOptions{})
	require.NoError(t, err)
	require.Empty(t, ptr.Deref(l.Spec.HolderIdentity, ""), "this process's membership was not released")
}

// Review of fc2f1a6: what a process of the identity may do on a shard Lease
// naming the replica (mayActOnOwn) is judged on the version its watch has
// seen, never on an older one's time; a term the elector ended before its
// start callback ran is no membership; and a process past its renew
// deadline names nobody on no shard Lease, whatever it read.
func TestAProcessActsOnItsReplicasLeasesOnlyWhenNoOtherCanServe(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: ShardLeaseName(4, 1), Namespace: "ichor-system", ResourceVersion: "7",
			Labels: map[string]string{LabelRole: roleShard, LabelShard: "1", LabelShards: "4"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a")},
	}
	client := fake.NewClientset(lease)
	s, err := New(Options{Client: client, Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)

	s.note(lease, clock.Now())
	clock.Step(time.Second)
	ended, end := context.WithCancel(t.Context())
	end()
	s.setMember(ended, true)
	require.False(t, s.member, "a term already over made a member")
	s.setMember(t.Context(), true)
	require.True(t, s.member)
	require.True(t, s.mayActOnOwn(lease, clock.Now()), "the last member's Lease, seen before this membership")

	newer := lease.DeepCopy()
	newer.ResourceVersion = "8"
	require.False(t, s.mayActOnOwn(newer, clock.Now()), "a version not yet seen was judged by the older one's time")
	s.note(newer, clock.Now())
	require.False(t, s.mayActOnOwn(newer, clock.Now()), "a Lease written since this membership, acted on at once")
	clock.Step(3 * time.Second)
	require.True(t, s.mayActOnOwn(newer, clock.Now()), "a lease duration after it was seen")

	s.adopted(clock.Now())
	s.setMember(t.Context(), false)
	s.setMember(t.Context(), true)
	clock.Step(time.Second)
	require.False(t, s.mayActOnOwn(newer, clock.Now()), "a membership taken from a Lease naming nobody acted at once")
	clock.Step(3 * time.Second)
	require.True(t, s.mayActOnOwn(newer, clock.Now()))

	// Past the renew deadline: the release names nobody on nothing.
	s.renewedAt = clock.Now().Add(-3 * time.Second)
	s.release(t.Context(), 1, newer)
	l, err := client.CoordinationV1().Leases("ichor-system").Get(t.Context(), lease.Name, metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, "a", ptr.Deref(l.Spec.HolderIdentity, ""), "a process past its renew deadline released the shard")
}

// The review of 2026-12-06: deleted Leases were noted gone, and pruned only
// when a holder was taken from, which a steady sharding never does: whoever
// may create and delete Leases there grew every replica's memory at the
// API server's write rate. Past maxSeen, the ones gone for a lease duration
// are pruned as more go.
func TestLeasesDeletedUnderEverNewNamesAreNotKeptForEver(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Client: fake.NewClientset(), Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)
	for i := range 10 * maxSeen {
		s.forget(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("forged-%d", i), Namespace: "ichor-system"}})
		if i%100 == 0 {
			clock.Step(time.Second)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	require.LessOrEqual(t, len(s.seen), maxSeen+400, "every deleted Lease is still noted")
}

// The pruning of noteGone keeps a holder's own entry: deletions of other
// Leases, one after another past maxSeen, noted a gone holder afresh at
// each look, and its shards were never taken while they went on (review of
// 2026-12-06).
func TestDeletionsOfOtherLeasesDoNotKeepAGoneHoldersShards(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Client: fake.NewClientset(), Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)
	lease := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ichor-system"}}
	}
	s.forget(lease(MemberLeaseName("b")))
	require.False(t, s.membershipQuiet("b", clock.Now()), "b's Lease was gone for no time")
	for i := range maxSeen + 1 {
		s.forget(lease(fmt.Sprintf("forged-%d", i)))
	}
	clock.Step(3 * time.Second)
	s.forget(lease("forged-last"))
	require.True(t, s.membershipQuiet("b", clock.Now()), "b's Lease, gone for a lease duration, was noted afresh")
}

// Two gone holders asked about in turn: each look at one pruned the other's
// entry, which was then noted afresh, and their shards were taken one a
// lease duration rather than all at once (review of 2026-12-06).
func TestTwoGoneHoldersAreBothQuietAfterALeaseDuration(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Client: fake.NewClientset(), Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)
	for _, h := range []string{"b", "c"} {
		s.forget(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: MemberLeaseName(h), Namespace: "ichor-system"}})
		require.False(t, s.membershipQuiet(h, clock.Now()), "%s's Lease was gone for no time", h)
	}
	clock.Step(3 * time.Second)
	require.True(t, s.membershipQuiet("b", clock.Now()))
	require.True(t, s.membershipQuiet("c", clock.Now()), "c's entry was pruned by the look at b, and noted afresh")
	// Kept no longer than holderKept lease durations by another's look.
	clock.Step(holderKept * 3 * time.Second)
	s.membershipQuiet("b", clock.Now())
	s.mu.Lock()
	_, kept := s.seen[MemberLeaseName("c")]
	s.mu.Unlock()
	require.False(t, kept, "a gone holder's entry is kept for ever")
}

// A shard named nobody is not taken while another process of this identity,
// seen renewing the membership lately, may still serve it (CI, 2026-12-06:
// both processes of one identity held shard 2); the first guard was passed
// by "nobody live holds it", which a Lease naming nobody always is. A
// sibling's Lease seen unchanged (a process that crashed) is noted once.
func TestAShardNamedNobodyWaitsForASiblingToStopServing(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Client: fake.NewClientset(), Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)
	v := view{isLive: map[string]bool{"a": true}}
	require.True(t, s.takable(nil, "", v, clock.Now(), true), "no sibling: taken at once")
	require.True(t, s.takable(nil, "b", v, clock.Now(), false), "a replica not live")

	s.sawSibling(clock.Now())
	for _, quiet := range []bool{false, true} {
		require.False(t, s.takable(nil, "", v, clock.Now(), quiet), "taken while a sibling may serve it")
	}
	clock.Step(s.o.LeaseDuration + 3*s.o.RetryPeriod)
	require.True(t, s.takable(nil, "", v, clock.Now(), false), "still waiting once the sibling cannot serve")

	// The Lease of a crashed sibling, read again and again unchanged.
	r := &renewals{s: s}
	renewed := metav1.NewTime(clock.Now())
	crashed, err := processHolder("a")
	require.NoError(t, err)
	record := &resourcelock.LeaderElectionRecord{HolderIdentity: crashed, RenewTime: renewed}
	r.Interface = staticLock{record}
	_, _, err = r.Get(t.Context())
	require.NoError(t, err)
	seen := clock.Now()
	clock.Step(time.Second)
	_, _, err = r.Get(t.Context())
	require.NoError(t, err)
	s.mu.Lock()
	require.Equal(t, seen, s.siblingAt, "an unchanged Lease noted as a sibling renewing it")
	s.mu.Unlock()
	// Renewed: a sibling that may serve, noted now.
	record.RenewTime = metav1.NewTime(clock.Now())
	_, _, err = r.Get(t.Context())
	require.NoError(t, err)
	s.mu.Lock()
	require.Equal(t, clock.Now(), s.siblingAt, "a renewing sibling not noted")
	s.mu.Unlock()
}

// staticLock is a membership lock whose Lease reads as record.
type staticLock struct {
	record *resourcelock.LeaderElectionRecord
}

func (l staticLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return l.record, nil, nil
}
func (staticLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return nil }
func (staticLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return nil }
func (staticLock) RecordEvent(string)                                              {}
func (staticLock) Identity() string                                                { return "a#test" }
func (staticLock) Describe() string                                                { return "static" }
