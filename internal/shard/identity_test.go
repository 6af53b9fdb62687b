package shard_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/ichor-dev/ichor-policy/internal/shard"
)

// Two processes given one identity (a --shard-identity given twice; a
// StatefulSet's Pod made again beside the process of the one force-deleted,
// still running on a node cut off) never serve a shard at the same time:
// one is the member, the other stands by until its membership lapses.
// Before, client-go's elector took a membership Lease naming its own
// identity as its own, so both were members and both held every shard.
// Here the first is cut off from writing, the second takes over, and the
// first, back, stays out until the second stops.
func TestShardTwoProcessesUnderOneIdentityNeverServeTogether(t *testing.T) {
	real := leaseEnv(t)
	const shards = 8
	var cut atomic.Bool
	firstReads := &memberReads{lease: shard.MemberLeaseName("a")}
	first, stopFirst := startStoppable(t, firstReads.counting(failing(real, func(*coordinationv1.Lease) error {
		if cut.Load() {
			return errors.New("injected: this node is cut off from the API server")
		}
		return nil
	})), "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, first) }, 20*time.Second, 50*time.Millisecond)

	// Every 10 ms from now on: no shard is served by both.
	var secondSet atomic.Pointer[shard.Set]
	overlap, stopWatching := servedByBoth(first, &secondSet)

	// The second process reads the membership Lease as a candidate does,
	// at each retry period; it is given three of them to make itself a
	// member, as it did before.
	reads := &memberReads{lease: shard.MemberLeaseName("a")}
	second, stopSecond := startStoppable(t, reads.counting(real), "a", shards)
	secondSet.Store(second)
	require.Eventually(t, func() bool { return reads.n.Load() >= 3 }, 20*time.Second, 10*time.Millisecond)
	require.Empty(t, overlap(), "both processes of identity a served shards %v", overlap())
	require.Empty(t, second.Held(), "the second process of identity a serves %v while the first is its member", second.Held())

	// The first is cut off: it gives every shard up at its renew deadline,
	// and the second, once the membership has lapsed, takes them.
	cut.Store(true)
	require.Eventually(t, func() bool { return servedOnce(shards, second) }, 20*time.Second, 50*time.Millisecond,
		"the second process holds %v", second.Held())
	require.Empty(t, first.Held())

	// Back, the first stays out while the second is the member; once the
	// second stops (and gives its membership up), it is the member again.
	cut.Store(false)
	n := firstReads.n.Load()
	require.Eventually(t, func() bool { return firstReads.n.Load() >= n+3 }, 20*time.Second, 10*time.Millisecond)
	require.Empty(t, first.Held(), "the first process, back, serves %v beside the second", first.Held())
	stopSecond()
	require.Eventually(t, func() bool { return servedOnce(shards, first) }, 20*time.Second, 50*time.Millisecond,
		"the first process holds %v after the second stopped", first.Held())
	require.Empty(t, stopWatching(), "both processes of identity a served shards %v", overlap())
	stopFirst()
}

// A membership Lease deleted (or made to name nobody) while two processes
// of its identity run: the one that makes it again takes the shards naming
// the identity only a lease duration later, by when the other has ceased to
// serve them; a shard named nobody either may take, and the one that loses
// the take waits a lease duration before it takes it from the identity.
// Before, the new member took the shards naming the identity at once, while
// the other served them until its renew deadline, and the other took back,
// as its own, a shard the new member had taken. In each round the member
// cannot write its membership until the other has made it again, and a
// shard's Lease is made to name nobody then.
func TestShardTwoProcessesUnderOneIdentityOutliveTheirMembershipsDeletion(t *testing.T) {
	real := leaseEnv(t)
	const shards = 8
	cuttable := func(cut *atomic.Bool) kubernetes.Interface {
		return failing(real, func(l *coordinationv1.Lease) error {
			if cut.Load() && l.Name == shard.MemberLeaseName("a") {
				return errors.New("injected: the member's renewals are held up")
			}
			return nil
		})
	}
	var cutFirst, cutSecond atomic.Bool
	first := startReplica(t, cuttable(&cutFirst), "a", shards)
	require.Eventually(t, func() bool { return servedOnce(shards, first) }, 20*time.Second, 50*time.Millisecond)
	reads := &memberReads{lease: shard.MemberLeaseName("a")}
	var secondSet atomic.Pointer[shard.Set]
	overlap, stopWatching := servedByBoth(first, &secondSet)
	second := startReplica(t, reads.counting(cuttable(&cutSecond)), "a", shards)
	secondSet.Store(second)
	require.Eventually(t, func() bool { return reads.n.Load() >= 3 }, 20*time.Second, 10*time.Millisecond)

	leases := real.CoordinationV1().Leases(leaseNamespace)
	for round, blank := range []bool{false, true, false, true} {
		member := &cutFirst
		if len(second.Held()) > 0 {
			member = &cutSecond
		}
		member.Store(true)
		name := shard.MemberLeaseName("a")
		if blank {
			// On the version read after the cut: a renewal sent before it
			// may still land (seen once in CI as a conflict).
			require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
				l, err := leases.Get(t.Context(), name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				l.Spec.HolderIdentity = ptr.To("")
				_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
				return err
			}))
		} else {
			require.NoError(t, leases.Delete(t.Context(), name, metav1.DeleteOptions{}))
		}
		require.Eventually(t, func() bool {
			l, err := leases.Get(t.Context(), name, metav1.GetOptions{})
			return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") != ""
		}, 20*time.Second, 10*time.Millisecond, "round %d: the process standing by did not make the membership again", round)
		// The other process is the member now, the one before still serving
		// until its renew deadline: both may take a shard named nobody, and
		// only one of them may serve it.
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l, err := leases.Get(t.Context(), shard.ShardLeaseName(shards, round), metav1.GetOptions{})
			if err != nil {
				return err
			}
			l.Spec.HolderIdentity = ptr.To("")
			_, err = leases.Update(t.Context(), l, metav1.UpdateOptions{})
			return err
		}))
		member.Store(false)
		// Settled: one process serves every shard, and both have had the
		// time to act on the change (a lease duration and a renew
		// deadline).
		changed := time.Now()
		require.Eventually(t, func() bool {
			return time.Since(changed) > 5*time.Second && servedOnce(shards, first, second) &&
				(len(first.Held()) == shards || len(second.Held()) == shards)
		}, 30*time.Second, 50*time.Millisecond, "round %d: the first holds %v, the second %v", round, first.Held(), second.Held())
		require.Empty(t, overlap(), "round %d: both processes of identity a served shards %v", round, overlap())
	}
	require.Empty(t, stopWatching(), "both processes of identity a served shards %v", overlap())
}

// servedByBoth samples, every 10 ms until stopped, the shards that first and
// the set second points to (once it does) both serve. overlap says which
// have been so far; stop ends the sampling and says the same.
func servedByBoth(first *shard.Set, second *atomic.Pointer[shard.Set]) (overlap, stop func() []int) {
	var (
		mu   sync.Mutex
		both = map[int]bool{}
	)
	watching := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if s := second.Load(); s != nil {
				for _, h := range first.Held() {
					if slices.Contains(s.Held(), h) {
						mu.Lock()
						both[h] = true
						mu.Unlock()
					}
				}
			}
			select {
			case <-watching:
				return
			case <-tick.C:
			}
		}
	}()
	overlap = func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Sorted(maps.Keys(both))
	}
	var once sync.Once
	stop = func() []int {
		once.Do(func() { close(watching); <-watched })
		return overlap()
	}
	return overlap, stop
}

// memberReads counts the reads of one membership Lease by name: a
// candidate's elector reads it at each retry period.
type memberReads struct {
	lease string
	n     atomic.Int32
}

// counting is cs counting the reads into r.
func (r *memberReads) counting(cs kubernetes.Interface) kubernetes.Interface {
	return withLeases(cs, func(l coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface {
		return countingLeases{l, r}
	})
}

type countingLeases struct {
	coordinationv1client.LeaseInterface
	r *memberReads
}

func (l countingLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if name == l.r.lease {
		l.r.n.Add(1)
	}
	return l.LeaseInterface.Get(ctx, name, opts)
}
