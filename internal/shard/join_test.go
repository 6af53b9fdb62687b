package shard_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/ichor-dev/ichor-policy/internal/shard"
)

// A replica that joins while another is in the middle of a look (two
// replicas started together, as a scale-up starts them) is not taken from
// as from a replica gone. Before, the view of who is live was read once a
// look: e, held up in its first take, went on with a view that did not know
// d, took from d a shard d had just taken, and each recorded the verdicts
// in effect a second time (seen in TestShardScaleThreeToOneToThree under
// load). Here e's take of its first shard waits until d holds a shard that
// a view without d gives to e, and e's informer has stored it; e then
// passes that shard, taking the next of its own.
func TestShardAReplicaThatJoinsDuringAnothersLookIsNotTakenFrom(t *testing.T) {
	real := leaseEnv(t)
	const shards = 16
	// Identities for which the shards fall so that the test shows
	// something: e's first shard is not d's, a later one of e's (without
	// d) is d's, and one after that stays e's.
	var a, d, e string
	var first, contested, after int
	found := false
	for i := 0; i < 1000 && !found; i++ {
		a, d, e = fmt.Sprintf("a%d", i), fmt.Sprintf("d%d", i), fmt.Sprintf("e%d", i)
		without, with := []string{a, e}, []string{a, d, e}
		var es []int
		for s := range shards {
			if shard.Owner(without, s) == e {
				es = append(es, s)
			}
		}
		if len(es) < 3 || shard.Owner(with, es[0]) != e {
			continue
		}
		first = es[0]
		for j, s := range es[1:] {
			if shard.Owner(with, s) != d {
				continue
			}
			for _, u := range es[j+2:] {
				if shard.Owner(with, u) == e {
					contested, after, found = s, u, true
					break
				}
			}
			if found {
				break
			}
		}
	}
	require.True(t, found, "no identities split the shards as the test needs")

	ra := startReplica(t, real, a, shards)
	require.Eventually(t, func() bool { return len(ra.Held()) == shards }, 20*time.Second, 50*time.Millisecond)

	gate := &gatedTake{lease: shard.ShardLeaseName(shards, first), watched: shard.ShardLeaseName(shards, contested),
		holder: d, blocked: make(chan struct{}), seen: make(chan struct{}), open: make(chan struct{})}
	gate.after.Store(-1)
	re := startReplica(t, withLeases(real, gate.leases), e, shards)
	select {
	case <-gate.blocked:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not try to take shard %d", e, first)
	}

	rd := startReplica(t, real, d, shards)
	leases := real.CoordinationV1().Leases(leaseNamespace)
	require.Eventually(t, func() bool {
		l, err := leases.Get(t.Context(), shard.ShardLeaseName(shards, contested), metav1.GetOptions{})
		return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") == d && slices.Contains(rd.Held(), contested)
	}, 20*time.Second, 20*time.Millisecond, "%s did not take shard %d", d, contested)
	select {
	case <-gate.seen:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s's informer did not store %s holding shard %d", e, d, contested)
	}
	close(gate.open)

	// e's look goes on past the contested shard to the next of its own.
	require.Eventually(t, func() bool { return slices.Contains(re.Held(), after) }, 20*time.Second, 20*time.Millisecond,
		"%s did not take shard %d", e, after)
	require.False(t, gate.tookWatched.Load(), "%s took shard %d from %s, live", e, contested, d)
}

// gatedTake holds the first write of one shard Lease until open is closed,
// says when its watch has shown another shard Lease (watched) naming holder
// and the informer has stored it, and notes any write of watched naming
// someone else after that.
type gatedTake struct {
	lease, watched, holder string
	blocked, seen, open    chan struct{}
	blockOnce              sync.Once
	// after counts the events the watch passed on since it showed watched
	// naming holder (-1 before): the reflector takes an event from the
	// filter only once it has stored the one before, so by the second
	// event after, the informer's store holds it.
	after       atomic.Int32
	tookWatched atomic.Bool
}

func (g *gatedTake) leases(l coordinationv1client.LeaseInterface) coordinationv1client.LeaseInterface {
	return gatedLeases{l, g}
}

type gatedLeases struct {
	coordinationv1client.LeaseInterface
	g *gatedTake
}

func (l gatedLeases) hold(ctx context.Context, name string) {
	if name != l.g.lease {
		return
	}
	first := false
	l.g.blockOnce.Do(func() { first = true })
	if !first {
		return
	}
	close(l.g.blocked)
	select {
	case <-l.g.open:
	case <-ctx.Done():
	}
}

// wrote notes a write of watched naming another than holder once the gate
// is open (before, e may take it while a gives it up, as it should).
func (l gatedLeases) wrote(lease *coordinationv1.Lease, err error) {
	select {
	case <-l.g.open:
	default:
		return
	}
	if err == nil && lease.Name == l.g.watched && ptr.Deref(lease.Spec.HolderIdentity, "") != "" && ptr.Deref(lease.Spec.HolderIdentity, "") != l.g.holder {
		l.g.tookWatched.Store(true)
	}
}

func (l gatedLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	l.hold(ctx, lease.Name)
	result, err := l.LeaseInterface.Update(ctx, lease, opts)
	l.wrote(lease, err)
	return result, err
}

func (l gatedLeases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	l.hold(ctx, lease.Name)
	result, err := l.LeaseInterface.Create(ctx, lease, opts)
	l.wrote(lease, err)
	return result, err
}

func (l gatedLeases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := l.LeaseInterface.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
		if n := l.g.after.Load(); n >= 0 {
			if l.g.after.Add(1) == 2 {
				close(l.g.seen)
			}
		} else if lease, ok := ev.Object.(*coordinationv1.Lease); ok && lease.Name == l.g.watched && ptr.Deref(lease.Spec.HolderIdentity, "") == l.g.holder {
			l.g.after.Store(0)
		}
		return ev, true
	}), nil
}
