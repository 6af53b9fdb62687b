// Package shard splits the TalosClusters among the manager's replicas with
// Kubernetes' own coordination, coordination.k8s.io Leases:
//
//   - each replica holds a membership Lease of its own, renewed by client-go's
//     leader elector (a lock nobody else contends for): a replica is live
//     while that Lease is seen renewed within its lease duration;
//   - a cluster belongs to shard hash(UID) mod N, and shard s is meant for the
//     live replica that rendezvous hashing (highest random weight) picks for
//     s: when a replica comes or goes only the shards it wins or held move;
//   - a shard is held through a Lease of its own, ichor-policy-shard-<s>,
//     which names its holder. The holder's membership is what keeps it: a
//     shard Lease is not renewed, it is valid while its holder is live. A
//     replica takes a shard meant for it when its Lease names nobody, itself,
//     or a replica that is no longer live, by an update on the Lease's
//     resourceVersion, so two replicas cannot both take it; it gives up a
//     shard meant for another by ceasing to serve it and then naming nobody.
//
// A replica serves a cluster only while it holds the cluster's shard and its
// own membership is renewed; client-go's elector stops it after its renew
// deadline, before the others see its membership expire (the lease duration
// must exceed the renew deadline and a retry period).
package shard

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Labels of the Leases this package writes; the replicas watch their own
// namespace's Leases with LabelRole only.
const (
	// LabelRole is "member" on a membership Lease and "shard" on a shard's.
	LabelRole = "ichor.dev/shard-role"
	// LabelShard is the shard number of a shard Lease.
	LabelShard = "ichor.dev/shard"

	roleMember = "member"
	roleShard  = "shard"

	// MemberLeasePrefix and ShardLeasePrefix begin the Leases' names.
	MemberLeasePrefix = "ichor-policy-member-"
	ShardLeasePrefix  = "ichor-policy-shard-"
)

// Defaults of the timings: a replica that dies is replaced on its shards
// within about a lease duration and a retry period.
const (
	DefaultLeaseDuration = 3 * time.Second
	DefaultRenewDeadline = 2 * time.Second
	DefaultRetryPeriod   = 500 * time.Millisecond
)

// Options configure a replica's part in the sharding.
type Options struct {
	// Client reads, watches and writes the Leases.
	Client kubernetes.Interface
	// Namespace holds the Leases: the manager's own.
	Namespace string
	// Identity names this replica (its Pod's name): unique among the
	// replicas.
	Identity string
	// Shards is the number of shards, at least 1; every replica must be
	// given the same.
	Shards int

	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration

	Log logr.Logger
	// Metrics are the per-shard metrics; nil for none.
	Metrics *Metrics
	// OnChange is called, from the Set's own goroutine, with each shard this
	// replica began or ceased to serve: its clusters are to be looked at.
	OnChange func(shard int)
	// Clock tells the time liveness is judged by; the real one if nil.
	Clock clock.PassiveClock
}

// Set is this replica's membership and the shards it holds. It is a
// controller-runtime Runnable that runs on every replica.
type Set struct {
	o      Options
	lister coordinationlisters.LeaseNamespaceLister
	kick   chan struct{}

	mu sync.Mutex
	// member is whether this replica's membership Lease is renewed.
	member bool
	// held are the shards this replica serves.
	held map[int]bool
	// seen is, per Lease name, its last resourceVersion and when this
	// replica saw it change: liveness is judged by this replica's clock, as
	// client-go's elector judges a leader, never by the writer's.
	seen map[string]observation
	// wrote is, per shard, the Lease this replica last wrote and the
	// resourceVersion it replaced ("" for a create): until the watch brings
	// the write, the cache shows the Lease as it was before it.
	wrote map[int]written
}

type written struct {
	replaced string
	lease    *coordinationv1.Lease
}

type observation struct {
	resourceVersion string
	at              time.Time
}

// New checks the options and makes the Set.
func New(o Options) (*Set, error) {
	switch {
	case o.Client == nil:
		return nil, errors.New("shard: no client")
	case o.Namespace == "":
		return nil, errors.New("shard: the manager's namespace is unknown (POD_NAMESPACE): the shard Leases are kept there")
	case o.Identity == "":
		return nil, errors.New("shard: the replica has no identity (POD_NAME)")
	case o.Shards < 1:
		return nil, fmt.Errorf("shard: %d shards: at least one", o.Shards)
	case o.RetryPeriod <= 0 || o.RenewDeadline <= 0:
		return nil, fmt.Errorf("shard: the renew deadline %s and retry period %s must be positive", o.RenewDeadline, o.RetryPeriod)
	case o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0:
		// A Lease holds its duration in whole seconds, and client-go's
		// elector writes it so: a fraction would be cut off there.
		return nil, fmt.Errorf("shard: the lease duration %s must be whole seconds, at least one", o.LeaseDuration)
	case o.LeaseDuration <= o.RenewDeadline+o.RetryPeriod:
		// A replica must stop serving before the others can see its
		// membership expire: its last renewal, a retry period, then a renew
		// deadline of failures.
		return nil, fmt.Errorf("shard: the lease duration %s must exceed the renew deadline %s and a retry period %s", o.LeaseDuration, o.RenewDeadline, o.RetryPeriod)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.OnChange == nil {
		o.OnChange = func(int) {}
	}
	return &Set{o: o, kick: make(chan struct{}, 1), held: map[int]bool{}, seen: map[string]observation{}, wrote: map[int]written{}}, nil
}

// Identity is this replica's name.
func (s *Set) Identity() string { return s.o.Identity }

// Shards is the number of shards.
func (s *Set) Shards() int { return s.o.Shards }

// LeaseDuration is how long after its last renewal a replica that died is
// taken to be gone.
func (s *Set) LeaseDuration() time.Duration { return s.o.LeaseDuration }

// ShardOf is the shard of a cluster: its UID hashed, modulo the shard count.
// The UID, not the name, so that a cluster deleted and made again under the
// same name is a new cluster wherever it lands.
func (s *Set) ShardOf(uid types.UID) int { return Of(uid, s.o.Shards) }

// Of is the shard of the cluster of that UID among shards (at least 1):
// FNV-1a of the UID, modulo shards.
func Of(uid types.UID, shards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uid))
	return int(h.Sum32() % uint32(shards)) //nolint:gosec // G115: shards >= 1 fits, and so does the remainder
}

// Serves reports whether this replica serves the cluster of that UID now,
// and its shard.
func (s *Set) Serves(uid types.UID) (shard int, ok bool) {
	shard = s.ShardOf(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	return shard, s.member && s.held[shard]
}

// NeedLeaderElection is false: every replica takes part.
func (*Set) NeedLeaderElection() bool { return false }

// Start runs the membership and the shards' hand-over until ctx ends, then
// gives up every shard and the membership, so that the others take them over
// within a retry period.
func (s *Set) Start(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.o.Client, 0,
		informers.WithNamespace(s.o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = LabelRole }))
	leases := factory.Coordination().V1().Leases()
	if _, err := leases.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.observe(obj) },
		UpdateFunc: func(_, obj any) { s.observe(obj) },
		DeleteFunc: func(any) { s.poke() },
	}); err != nil {
		return fmt.Errorf("shard: watch the Leases: %w", err)
	}
	s.lister = leases.Lister().Leases(s.o.Namespace)
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), leases.Informer().HasSynced) {
		return nil
	}

	elector, err := s.elector()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	memberCtx, stopMember := context.WithCancel(context.WithoutCancel(ctx))
	wg.Go(func() {
		// Run returns when the membership is lost; the replica joins again.
		for memberCtx.Err() == nil {
			elector.Run(memberCtx)
		}
	})
	s.o.Log.Info("sharding", "identity", s.o.Identity, "shards", s.o.Shards, "lease_duration", s.o.LeaseDuration.String())
	ticker := time.NewTicker(s.o.RetryPeriod)
	defer ticker.Stop()
	for ctx.Err() == nil {
		s.tick(ctx)
		select {
		case <-ctx.Done():
		case <-ticker.C:
		case <-s.kick:
		}
	}
	// Give up the shards first, then the membership: a shard whose Lease
	// names nobody is taken at the others' next look.
	s.releaseAll(context.WithoutCancel(ctx))
	stopMember()
	wg.Wait()
	return nil
}

// elector is client-go's leader elector on this replica's membership Lease,
// released when the replica stops.
func (s *Set) elector() (*leaderelection.LeaderElector, error) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: s.o.Namespace, Name: MemberLeaseName(s.o.Identity)},
		Client:     s.o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.o.Identity},
		Labels:     map[string]string{LabelRole: roleMember},
	}
	e, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   s.o.LeaseDuration,
		RenewDeadline:   s.o.RenewDeadline,
		RetryPeriod:     s.o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            "ichor-policy-shard-member",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { s.setMember(true) },
			OnStoppedLeading: func() { s.setMember(false) },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("shard: membership: %w", err)
	}
	return e, nil
}

func (s *Set) setMember(member bool) {
	s.mu.Lock()
	was := s.member
	s.member = member
	var dropped []int
	if !member {
		// Without a renewed membership nothing is served: the others may
		// take every shard once they see it expire.
		for shard := range s.held {
			dropped = append(dropped, shard)
		}
		s.held = map[int]bool{}
	}
	s.mu.Unlock()
	if was != member {
		s.o.Log.Info("membership", "identity", s.o.Identity, "member", member)
	}
	for _, shard := range dropped {
		s.o.Metrics.held(shard, false, "lost")
		s.o.OnChange(shard)
	}
	s.poke()
}

func (s *Set) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// observe notes when a Lease was seen to change.
func (s *Set) observe(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	now := s.o.Clock.Now()
	s.mu.Lock()
	if o, ok := s.seen[l.Name]; !ok || o.resourceVersion != l.ResourceVersion {
		s.seen[l.Name] = observation{resourceVersion: l.ResourceVersion, at: now}
	}
	s.mu.Unlock()
	s.poke()
}

// live are the replicas whose membership Lease this replica saw renewed
// within that Lease's duration, this one included while its own is renewed.
func (s *Set) live(now time.Time) ([]string, error) {
	members, err := s.lister.List(labels.SelectorFromSet(labels.Set{LabelRole: roleMember}))
	if err != nil {
		return nil, fmt.Errorf("list membership Leases: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range members {
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if holder == "" || holder == s.o.Identity || MemberLeaseName(holder) != l.Name {
			continue
		}
		// The configured duration, which every replica shares, never the
		// Lease's own field: whoever may write Leases here could make a
		// member that one write keeps live for ever (review 4, S3).
		if o, ok := s.seen[l.Name]; ok && now.Sub(o.at) < s.o.LeaseDuration {
			out = append(out, holder)
		}
	}
	if s.member {
		out = append(out, s.o.Identity)
	}
	slices.Sort(out)
	return out, nil
}

// tick takes the shards meant for this replica that nobody live holds, and
// gives up those meant for another.
func (s *Set) tick(ctx context.Context) {
	now := s.o.Clock.Now()
	live, err := s.live(now)
	if err != nil {
		s.o.Log.Error(err, "shard hand-over")
		return
	}
	s.o.Metrics.members(len(live))
	s.mu.Lock()
	member := s.member
	s.mu.Unlock()
	if !member {
		return
	}
	isLive := map[string]bool{}
	for _, id := range live {
		isLive[id] = true
	}
	for shard := range s.o.Shards {
		mine := Owner(live, shard) == s.o.Identity
		lease, err := s.shardLease(shard)
		if err != nil {
			s.o.Log.Error(err, "read shard Lease", "shard", shard)
			continue
		}
		holder := ""
		if lease != nil {
			holder = ptr.Deref(lease.Spec.HolderIdentity, "")
		}
		s.mu.Lock()
		held := s.held[shard]
		s.mu.Unlock()
		switch {
		case held && holder != s.o.Identity:
			// Taken by another replica that judged this one gone: stop at once.
			s.drop(shard, "taken")
		case held && !mine:
			s.release(ctx, shard, lease)
		case !held && mine && (holder == "" || holder == s.o.Identity || !isLive[holder]):
			s.take(ctx, shard, lease, holder)
		case !held && !mine && holder == s.o.Identity:
			// A release whose write failed: the Lease still names this
			// replica, live, and the owner waits for it to name nobody
			// (review 4, S2). Name nobody again until the write succeeds.
			s.release(ctx, shard, lease)
		}
	}
}

// shardLease is a shard's Lease as the cache has it or, until the cache has
// this replica's last write of it, as written; nil if there is none.
func (s *Set) shardLease(shard int) (*coordinationv1.Lease, error) {
	lease, err := s.lister.Get(ShardLeaseName(shard))
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.wrote[shard]
	switch {
	case !ok:
		return lease, nil
	case lease == nil && w.replaced == "", lease != nil && lease.ResourceVersion == w.replaced:
		return w.lease, nil
	default:
		delete(s.wrote, shard)
		return lease, nil
	}
}

func (s *Set) noteWrite(shard int, replaced string, lease *coordinationv1.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wrote[shard] = written{replaced: replaced, lease: lease}
}

// take writes this replica as the shard's holder, on the resourceVersion it
// judged: if anyone wrote the Lease since, the write conflicts and the shard
// is looked at again on the next tick.
func (s *Set) take(ctx context.Context, shard int, lease *coordinationv1.Lease, previous string) {
	now := metav1.NewMicroTime(s.o.Clock.Now())
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(s.o.Identity),
		LeaseDurationSeconds: ptr.To(int32(s.o.LeaseDuration.Seconds())), //nolint:gosec // G115: seconds of a flag
		AcquireTime:          &now,
		RenewTime:            &now,
	}
	leases := s.o.Client.CoordinationV1().Leases(s.o.Namespace)
	var (
		err      error
		result   *coordinationv1.Lease
		replaced string
	)
	if lease == nil {
		spec.LeaseTransitions = ptr.To[int32](0)
		result, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: ShardLeaseName(shard), Namespace: s.o.Namespace,
				Labels: map[string]string{LabelRole: roleShard, LabelShard: strconv.Itoa(shard)}},
			Spec: spec,
		}, metav1.CreateOptions{})
	} else {
		updated := lease.DeepCopy()
		spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
		updated.Spec = spec
		replaced = lease.ResourceVersion
		result, err = leases.Update(ctx, updated, metav1.UpdateOptions{})
	}
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			s.o.Log.Error(err, "take shard", "shard", shard)
		}
		return
	}
	s.noteWrite(shard, replaced, result)
	s.mu.Lock()
	// The membership may have lapsed during the write: then the shard is
	// not served, and the Lease names a replica the others will see gone.
	ok := s.member
	if ok {
		s.held[shard] = true
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	s.o.Log.Info("shard taken", "shard", shard, "previous_holder", previous)
	s.o.Metrics.held(shard, true, "taken")
	s.o.OnChange(shard)
}

// drop ceases to serve a shard here, without writing.
func (s *Set) drop(shard int, why string) {
	s.mu.Lock()
	held := s.held[shard]
	delete(s.held, shard)
	s.mu.Unlock()
	if !held {
		return
	}
	s.o.Log.Info("shard given up", "shard", shard, "why", why)
	s.o.Metrics.held(shard, false, why)
	s.o.OnChange(shard)
}

// release ceases to serve a shard, then names nobody on its Lease, so that
// the replica it is meant for takes it at its next look.
func (s *Set) release(ctx context.Context, shard int, lease *coordinationv1.Lease) {
	s.drop(shard, "released")
	if lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") != s.o.Identity {
		return
	}
	updated := lease.DeepCopy()
	updated.Spec.HolderIdentity = ptr.To("")
	updated.Spec.RenewTime = ptr.To(metav1.NewMicroTime(s.o.Clock.Now()))
	result, err := s.o.Client.CoordinationV1().Leases(s.o.Namespace).Update(ctx, updated, metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) {
			// Not named free: tick tries again while it names this
			// replica, and the others take it once this replica's
			// membership expires.
			s.o.Log.Error(err, "release shard", "shard", shard)
		}
		return
	}
	s.noteWrite(shard, lease.ResourceVersion, result)
}

// releaseAll gives up every shard held, at shutdown.
func (s *Set) releaseAll(ctx context.Context) {
	s.mu.Lock()
	var held []int
	for shard := range s.held {
		held = append(held, shard)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.o.RenewDeadline)
	defer cancel()
	for _, shard := range held {
		lease, err := s.o.Client.CoordinationV1().Leases(s.o.Namespace).Get(ctx, ShardLeaseName(shard), metav1.GetOptions{})
		if err != nil {
			s.drop(shard, "stopping")
			continue
		}
		s.release(ctx, shard, lease)
	}
}

// Held are the shards this replica serves, in order.
func (s *Set) Held() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for shard := range s.held {
		out = append(out, shard)
	}
	slices.Sort(out)
	return out
}

// Owner is the replica of live that rendezvous hashing picks for shard: the
// one with the highest weight hash(replica, shard). When a replica joins it
// wins only the shards it outweighs their holder on; when one leaves only
// its shards move. Empty when nobody is live.
func Owner(live []string, shard int) string {
	var best string
	var bestWeight uint64
	for _, id := range live {
		sum := sha256.Sum256([]byte(id + "\x00" + strconv.Itoa(shard)))
		w := binary.BigEndian.Uint64(sum[:8])
		if best == "" || w > bestWeight || (w == bestWeight && id < best) {
			best, bestWeight = id, w
		}
	}
	return best
}

// MemberLeaseName is the name of a replica's membership Lease: a digest of
// its identity, which need not be a valid object name.
func MemberLeaseName(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return MemberLeasePrefix + hex.EncodeToString(sum[:8])
}

// ShardLeaseName is the name of a shard's Lease.
func ShardLeaseName(shard int) string {
	return ShardLeasePrefix + strconv.Itoa(shard)
}
