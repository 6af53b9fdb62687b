// Package shard splits the TalosClusters among the manager's replicas with
// Kubernetes' own coordination, coordination.k8s.io Leases:
//
//   - each replica holds a membership Lease of its own, renewed by client-go's
//     leader elector (a lock only another process given the same identity
//     contends for: the holder carries a nonce of the process, so that
//     such a process stands by): a replica is live while that Lease is seen
//     renewed within its lease duration;
//   - a cluster belongs to shard hash(UID) mod N, and shard s is meant for the
//     live replica that rendezvous hashing (highest random weight) picks for
//     s: when a replica comes or goes only the shards it wins or held move;
//   - a shard is held through a Lease of its own, ichor-policy-shard-<N>-<s>,
//     which names its holder. The holder's membership is what keeps it: a
//     shard Lease is not renewed, it is valid while its holder is live. A
//     replica takes a shard meant for it when its Lease names nobody, itself,
//     or a replica that is no longer live, by an update on the Lease's
//     resourceVersion, so two replicas cannot both take it; it gives up a
//     shard meant for another by ceasing to serve it and then naming nobody.
//
// A replica serves a cluster only while it holds the cluster's shard, its
// own membership was renewed within the renew deadline (on the monotonic
// clock: a replica paused past it serves nothing until it has given up and
// taken its shards again), and no live replica announces another shard
// count. A replica takes a shard from a holder it judges gone only once a
// read of that holder's membership from the API server (not the cache)
// shows it unrenewed since seen a lease duration ago (a Lease deleted, or
// naming another holder, is such a change too). The approver acts
// under a Fence: its context ends when the shard goes, and each write
// re-checks all this just before it is sent (docs/architecture.md,
// "Sharding", says what is left: a write already on the wire).
package shard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
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
// namespace's Leases whose LabelRole is one of the two roles only.
const (
	// LabelRole is "member" on a membership Lease and "shard" on a shard's.
	LabelRole = "ichor.dev/shard-role"
	// LabelShard is the shard number of a shard Lease.
	LabelShard = "ichor.dev/shard"
	// LabelShards is the shard count a membership Lease's replica was given,
	// and that of a shard Lease: replicas given different counts would
	// serve some clusters twice, so none serves while they disagree.
	LabelShards = "ichor.dev/shards"
	// AnnotationSettledUntil, on a shard Lease that names nobody, is when
	// the replica that gave the shard up had recorded every verdict it
	// wrote for the shard's clusters (RFC 3339, its clock): the next
	// holder need not record them again.
	AnnotationSettledUntil = "ichor.dev/settled-until"
	// AnnotationUnsettledSince, on a shard Lease that names nobody and says
	// no settled-until, is the time stamped on the earliest act the replica
	// that gave the shard up may have applied without its record and had
	// not settled since (RFC 3339, its clock, as the act's own stamp): the
	// next holder records again the verdicts stamped since then, not only
	// those of the last lease duration (review 12, M1).
	AnnotationUnsettledSince = "ichor.dev/unsettled-since"

	roleMember = "member"
	roleShard  = "shard"

	// MemberLeasePrefix and ShardLeasePrefix begin the Leases' names.
	MemberLeasePrefix = "ichor-policy-member-"
	ShardLeasePrefix  = "ichor-policy-shard-"
)

// MaxShards bounds the shard count: each shard is a Lease every replica
// watches and looks at each retry period, and the chart's alerts list them
// (a count of a million rendered a PrometheusRule of megabytes, review 256
// F5). A few times the most replicas one runs is the advice; this is far
// beyond it.
const MaxShards = 1024

// Defaults of the timings: a replica that dies is replaced on its shards
// within about a lease duration and a retry period.
const (
	DefaultLeaseDuration = 3 * time.Second
	DefaultRenewDeadline = 2 * time.Second
	DefaultRetryPeriod   = 500 * time.Millisecond
	// DefaultStaleMemberAfter is how long a membership Lease of a replica
	// not live stays unchanged before it is deleted: long past any pause
	// a replica could come back from, short of the Leases of every Pod a
	// rollout or eviction ever ran piling up.
	DefaultStaleMemberAfter = 10 * time.Minute
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
	// StaleMemberAfter is how long another replica's membership Lease is
	// seen unchanged, its replica not live, before the first live replica
	// deletes it (DefaultStaleMemberAfter if 0): each Pod name ever run
	// leaves one, and every replica lists them at each look.
	StaleMemberAfter time.Duration

	Log logr.Logger
	// Metrics are the per-shard metrics; nil for none.
	Metrics *Metrics
	// OnChange is called with each shard this replica began or ceased to
	// serve: its clusters are to be looked at. It may be called from several
	// goroutines at once (releases run together, the membership's lapse).
	OnChange func(shard int)
	// Clock tells the time liveness is judged by; the real one if nil.
	Clock clock.PassiveClock
	// OnCountMismatch is called, from the Set's own goroutine, when a live
	// replica announces another shard count than this one's (others names
	// them, with their counts) and when none does any more (others empty):
	// meanwhile this replica serves nothing.
	OnCountMismatch func(others map[string]string)
}

// Set is this replica's membership and the shards it holds. It is a
// controller-runtime Runnable that runs on every replica.
type Set struct {
	o      Options
	lister coordinationlisters.LeaseNamespaceLister
	kick   chan struct{}
	// process is the holder this process writes on its membership Lease:
	// the identity and a nonce of this process's own (processHolder).
	process string

	// base is the context the holds' contexts derive from: Start's values,
	// not its end. A hold ends when it is dropped or released, and Start
	// releases every hold before it returns, once the acts in progress
	// under it are done (review 12, L2): the manager cancels Start's
	// context first at a stop, and a write cancelled once sent may have
	// been applied all the same.
	base context.Context

	mu sync.Mutex
	// member is whether this replica's membership Lease is renewed.
	member bool
	// memberSince is when this process last became a member.
	memberSince time.Time
	// adoptedAt is when this process took its membership from a Lease
	// that named nobody, or from none (adopted).
	adoptedAt time.Time
	// siblingAt is when a read of this replica's membership Lease last
	// showed it held by another process of this identity (siblingMayServe).
	siblingAt time.Time
	// lapseTimer gives up every shard at the renew deadline after the last
	// renewal (armLapse).
	lapseTimer *time.Timer
	// renewedAt is when the last renewal of the membership that succeeded
	// was sent, on the monotonic clock: the others cannot judge this replica
	// gone before a lease duration after it, and it serves only within the
	// renew deadline after it.
	renewedAt time.Time
	// mismatch names the live replicas announcing another shard count.
	mismatch map[string]string
	// held are the shards this replica serves, each with its hold.
	held map[int]*hold
	// settled is, per shard taken from a replica that gave it up, when that
	// replica had recorded its verdicts (the Lease's annotation).
	settled map[int]time.Time
	// unsettledSince is, per shard taken from a replica that gave it up
	// unsettled, the stamp of its earliest act left unsettled (the Lease's
	// annotation); absent when not known.
	unsettledSince map[int]time.Time
	// releasedSettled is, per shard this replica last gave up, what its
	// release wrote on the Lease: a release whose write failed is tried
	// again without the hold.
	releasedSettled map[int]releaseNote
	// given are, per shard, the hold this replica last gave up and whose
	// unsettled state no Lease write has said yet (a drop, or a release
	// whose write failed): if this replica takes the shard again from
	// itself, its acts are what the new hold records from (review 14, M3).
	given map[int]*hold
	// seen is, per Lease name, its last resourceVersion and when this
	// replica saw it change: liveness is judged by this replica's clock, as
	// client-go's elector judges a leader, never by the writer's.
	seen map[string]observation
	// wrote is, per shard, the Lease this replica last wrote and the
	// resourceVersion it replaced ("" for a create): until the watch brings
	// the write, the cache shows the Lease as it was before it.
	wrote map[int]written
	// collectAfter is when this replica may next look for stale membership
	// Leases (collectMembers), touched by Start's goroutine only.
	collectAfter time.Time
}

// hold is this replica's hold on one shard, from its take to its drop.
type hold struct {
	ctx    context.Context
	cancel context.CancelFunc
	// acts are the acts begun under the hold (Fence.Begin) and not done: a
	// release waits for them before it says the shard settled.
	acts sync.WaitGroup
	// unsettled counts the adoptions not settled (Fence.Adopt), under the
	// Set's lock: while there are any, a release does not say it settled.
	unsettled int
	// noting is true from the take of a shard whose previous holder did not
	// say until when it had recorded its verdicts, until the approver has
	// noted the adoptions of its clusters (AdoptionsNoted): it counts as one
	// unsettled adoption meanwhile, so that a release in between does not
	// say settled (review 5, F3).
	noting bool
	// settled is when the replica this one took the shard from had
	// recorded its verdicts; zero if not known (it died, or none said).
	settled time.Time
	// pending are the acts under the hold that may have been applied
	// without their record (Fence.Unsettle) and are not settled since
	// (Fence.Settle), each with the time stamped on it, under the Set's
	// lock: while there are any, a release does not say it settled, and
	// says since when it did not.
	pending map[string]time.Time
	// inflight are the stamps of the acts begun (Fence.Begin) and not done,
	// by a number of their own, under the Set's lock.
	inflight map[int]time.Time
	nextAct  int
	// takenAt is when the hold was taken, by this replica's clock: the
	// approver's window of verdicts to record again counts back from it,
	// not from when the change reaches it.
	takenAt time.Time
	// inherited is, for a hold taken from a replica that did not say it
	// settled, the earliest stamp of the verdicts the approver records
	// again (those of its window, a lease duration and two seconds before
	// the take, or the previous holder's unsettled-since): while its
	// adoptions are not settled, a release says it, so that the next holder
	// records them in its turn (review 13, M3).
	inherited time.Time
}

// releaseNote is what a release wrote on a shard's Lease, as its
// annotations' values ("" for none).
type releaseNote struct {
	settledUntil, unsettledSince string
}

type written struct {
	replaced string
	lease    *coordinationv1.Lease
}

type observation struct {
	// resourceVersion is "" for a Lease seen gone (deleted, or absent from
	// a read of the API server).
	resourceVersion string
	at              time.Time
	// holder is true once the Lease was asked about as a shard holder's
	// membership (membershipQuiet): noteGone's pruning keeps it, or
	// deletions of other Leases, one after another, would note it afresh
	// at each look and keep that holder's shards from being taken for as
	// long as they went on (review of 2026-12-06).
	holder bool
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
	if o.StaleMemberAfter == 0 {
		o.StaleMemberAfter = DefaultStaleMemberAfter
	}
	if o.StaleMemberAfter <= o.LeaseDuration {
		return nil, fmt.Errorf("shard: a membership Lease is deleted %s after it stopped changing, which must exceed the lease duration %s", o.StaleMemberAfter, o.LeaseDuration)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.OnChange == nil {
		o.OnChange = func(int) {}
	}
	if o.OnCountMismatch == nil {
		o.OnCountMismatch = func(map[string]string) {}
	}
	process, err := processHolder(o.Identity)
	if err != nil {
		return nil, err
	}
	return &Set{o: o, process: process, base: context.Background(), kick: make(chan struct{}, 1), held: map[int]*hold{}, settled: map[int]time.Time{}, unsettledSince: map[int]time.Time{}, releasedSettled: map[int]releaseNote{}, given: map[int]*hold{},
		seen: map[string]observation{}, wrote: map[int]written{}}, nil
}

// Identity is this replica's name.
func (s *Set) Identity() string { return s.o.Identity }

// Shards is the number of shards.
func (s *Set) Shards() int { return s.o.Shards }

// LookBack is how far before a take of a shard from a holder that did not
// say it had settled its verdicts may still be a verdict of that holder's
// without its record: a replica that died may have served its shards until
// its Lease ran out, and two seconds more cover a second of clock skew
// between replicas and the conditions' whole seconds.
func (s *Set) LookBack() time.Duration { return s.o.LeaseDuration + 2*time.Second }

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
// and its shard: it holds the shard, its membership was renewed within the
// renew deadline, and no live replica announces another shard count.
func (s *Set) Serves(uid types.UID) (shard int, ok bool) {
	shard = s.ShardOf(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	return shard, s.servesLocked(shard, nil)
}

// servesLocked reports whether the shard is served, and under h when h is
// not nil.
func (s *Set) servesLocked(shard int, h *hold) bool {
	cur := s.held[shard]
	return cur != nil && (h == nil || h == cur) && s.member && len(s.mismatch) == 0 && s.freshLocked(s.o.Clock.Now())
}

// freshLocked reports whether the membership's last renewal that succeeded
// was sent within the renew deadline.
func (s *Set) freshLocked(now time.Time) bool {
	return !s.renewedAt.IsZero() && now.Sub(s.renewedAt) < s.o.RenewDeadline
}

// Fence is this replica's hold on the shard of a cluster, taken when a pass
// over the cluster begins.
type Fence interface {
	// Context ends when this replica ceases to serve the shard (given up,
	// taken, the membership lost or unrenewed): what runs under it stops.
	Context() context.Context
	// Begin is called just before an act that another replica must not do
	// at the same time (an approval or denial, and its record), with the
	// time stamped on it (zero for an act that stamps none). ok is false
	// unless the hold is still this replica's, its membership was renewed
	// within the renew deadline and the shard counts agree; done must then
	// be called once the act and its record are done. A release that
	// cannot wait for an act says its stamp (review 13, M2).
	Begin(at time.Time) (done func(), ok bool)
	// Adopt says the hold may have verdicts another replica wrote to
	// record (a cluster taken over from a replica that died, or that did not
	// say until when it had recorded its own): until settled is called, a
	// release of the shard does not say this replica recorded every
	// verdict, and the next holder records them.
	Adopt() (settled func())
	// Unsettle says an act under the hold, named act and stamped at, may
	// have been applied without its record (its write failed otherwise
	// than by a conflict, which may mean it was applied all the same, or
	// its record failed): until Settle is called for it, a release of the
	// shard does not say this replica recorded every verdict, and says the
	// earliest such stamp, so that the next holder records the verdicts in
	// effect since then (review 5, F1; review 12, M1).
	Unsettle(act string, at time.Time)
	// Settle says the act named was recorded since, or proved not applied
	// (the request was still undecided, or is gone). An act unsettled under
	// another hold is not this hold's: nothing happens.
	Settle(act string)
}

type fence struct {
	s     *Set
	shard int
	h     *hold
}

func (f fence) Context() context.Context { return f.h.ctx }

func (f fence) Begin(at time.Time) (func(), bool) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if f.h.ctx.Err() != nil || !f.s.servesLocked(f.shard, f.h) {
		return nil, false
	}
	f.h.acts.Add(1)
	if at.IsZero() {
		return f.h.acts.Done, true
	}
	if f.h.inflight == nil {
		f.h.inflight = map[int]time.Time{}
	}
	id := f.h.nextAct
	f.h.nextAct++
	f.h.inflight[id] = at
	return sync.OnceFunc(func() {
		f.s.mu.Lock()
		delete(f.h.inflight, id)
		f.s.mu.Unlock()
		f.h.acts.Done()
	}), true
}

func (f fence) Unsettle(act string, at time.Time) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if f.h.pending == nil {
		f.h.pending = map[string]time.Time{}
	}
	if old, ok := f.h.pending[act]; !ok || at.Before(old) {
		f.h.pending[act] = at
	}
}

func (f fence) Settle(act string) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	delete(f.h.pending, act)
}

func (f fence) Adopt() func() {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	if !f.h.settled.IsZero() {
		// Taken from a replica that gave it up and said until when it had
		// recorded its verdicts: nobody wrote any since, so there is
		// nothing of another's to record.
		return func() {}
	}
	f.h.unsettled++
	return sync.OnceFunc(func() {
		f.s.mu.Lock()
		defer f.s.mu.Unlock()
		f.h.unsettled--
	})
}

// Fence is this replica's hold on the shard of the cluster of that UID, if
// it serves the cluster now.
func (s *Set) Fence(uid types.UID) (Fence, bool) {
	shard := s.ShardOf(uid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.servesLocked(shard, nil) {
		return nil, false
	}
	return fence{s: s, shard: shard, h: s.held[shard]}, true
}

// UnsettledSince is, for this replica's hold of shard taken from a replica
// that gave it up unsettled, the time stamped on that replica's earliest
// act it had not settled; zero when not known or none.
func (s *Set) UnsettledSince(shard int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unsettledSince[shard]
}

// TakenAt is when this replica took its hold of shard, by its clock; zero
// when it does not hold the shard. A replica that died may have written
// verdicts until about a lease duration before it: the approver records
// again those written since then (review 14: counted from the moment the
// shard change reached the approver, the window missed the verdicts of the
// delay in between).
func (s *Set) TakenAt(shard int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[shard]; h != nil {
		return h.takenAt
	}
	return time.Time{}
}

// Settled is when the replica that gave this replica's hold of shard up
// (by a release, not a death) had recorded every verdict it wrote for the
// shard's clusters; zero when that is not known.
func (s *Set) Settled(shard int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled[shard]
}

// AdoptionsNoted says the approver has noted, under the current hold of
// shard, the adoptions of every cluster of the shard (Fence.Adopt): until
// then a hold taken from a replica that did not say until when it had
// recorded its verdicts counts as unsettled.
func (s *Set) AdoptionsNoted(shard int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[shard]; h != nil && h.noting {
		h.noting = false
		h.unsettled--
	}
}

// NeedLeaderElection is false: every replica takes part.
func (*Set) NeedLeaderElection() bool { return false }

// Start runs the membership and the shards' hand-over until ctx ends, then
// gives up every shard and the membership, so that the others take them over
// within a retry period.
func (s *Set) Start(ctx context.Context) error {
	s.base = context.WithoutCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(s.o.Client, 0,
		informers.WithNamespace(s.o.Namespace),
		// The two roles only: a Lease that merely has the label is not
		// cached, nor tracked.
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = LabelRole + " in (" + roleMember + "," + roleShard + ")"
		}))
	leases := factory.Coordination().V1().Leases()
	if _, err := leases.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.observe(obj) },
		UpdateFunc: func(_, obj any) { s.observe(obj) },
		DeleteFunc: func(obj any) { s.forget(obj) },
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
	e, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            s.membershipLock(),
		LeaseDuration:   s.o.LeaseDuration,
		RenewDeadline:   s.o.RenewDeadline,
		RetryPeriod:     s.o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            "ichor-policy-shard-member",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(term context.Context) { s.setMember(term, true) },
			OnStoppedLeading: func() { s.setMember(context.Background(), false) },
			OnNewLeader: func(holder string) {
				if holder != s.process && replicaOf(holder) == s.o.Identity {
					s.o.Log.Info("another process holds this replica's membership: this one serves nothing until that membership lapses or is given up",
						"identity", s.o.Identity, "holder", holder, "process", s.process)
				}
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("shard: membership: %w", err)
	}
	return e, nil
}

// membershipLock is this replica's membership Lease as its elector's lock.
func (s *Set) membershipLock() *renewals {
	return &renewals{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: s.o.Namespace, Name: MemberLeaseName(s.o.Identity)},
		Client:     s.o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.process},
		Labels:     map[string]string{LabelRole: roleMember, LabelShards: strconv.Itoa(s.o.Shards)},
	}, s: s}
}

// renewals is the membership's lock as the elector uses it, noting when
// each renewal that succeeded was sent, and which process the Lease named
// when the elector last read it.
type renewals struct {
	resourcelock.Interface
	s *Set

	mu sync.Mutex
	// seen is the holder the Lease named at the elector's last read that
	// answered ("" for none, or no Lease), or this process's after its last
	// write. The elector reads before any write but its renewals.
	seen string
	// sibling and siblingRenewed are the other process of this identity
	// last seen holding the membership, and its renewal then.
	sibling        string
	siblingRenewed metav1.Time
	// adopting is true from a write of this process's membership sent
	// over a Lease that named nobody, or none, until one succeeds or a
	// read shows another holder: a write applied whose answer was lost
	// is an adoption all the same.
	adopting bool
}

// Get reads the membership Lease as the elector does, noting its holder.
// A duration shorter than the configured one is read as the configured
// one: a process standing by under this identity judges the member's Lease
// as the other replicas do, never by a shorter duration someone wrote.
func (r *renewals) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	record, raw, err := r.Interface.Get(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil && record.HolderIdentity != r.s.process && replicaOf(record.HolderIdentity) == r.s.o.Identity &&
		(record.HolderIdentity != r.sibling || !record.RenewTime.Equal(&r.siblingRenewed)) {
		// Another process of this identity renewing the membership (the
		// Lease of one that crashed, seen unchanged, is not a sibling
		// that may serve: it is noted once). Set.mu is never held while
		// r.mu is taken.
		r.sibling, r.siblingRenewed = record.HolderIdentity, record.RenewTime
		r.s.sawSibling(r.s.o.Clock.Now())
	}
	switch {
	case err == nil:
		r.seen = record.HolderIdentity
		if r.seen != "" && r.seen != r.s.process {
			r.adopting = false
		}
		if configured := int(r.s.o.LeaseDuration / time.Second); record.LeaseDurationSeconds < configured {
			record.LeaseDurationSeconds = configured
		}
	case apierrors.IsNotFound(err):
		r.seen = ""
	}
	// A read that failed says nothing new: the elector writes nothing
	// after it.
	return record, raw, err
}

func (r *renewals) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.renew(ler, func() error { return r.Interface.Create(ctx, ler) })
}

func (r *renewals) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.renew(ler, func() error { return r.Interface.Update(ctx, ler) })
}

// renew writes the membership. A write that names this replica is a
// renewal: it is timed from before it is sent, since the others may see it
// from then on. If the last renewal is older than the renew deadline when
// this one is sent, or was by the time it succeeded (the replica was paused
// or the API server slow: the others may have judged it gone meanwhile),
// every shard is given up first: the replica takes them again only through
// their Leases, as any other would.
func (r *renewals) renew(ler resourcelock.LeaderElectionRecord, write func() error) error {
	r.mu.Lock()
	seen := r.seen
	if ler.HolderIdentity == r.s.process && seen == "" {
		// Taken without having seen a holder's renewals lapse (the elector
		// takes a Lease that names someone only once it has seen it
		// unrenewed for the lease duration): the Lease was deleted or named
		// nobody. Another process of this identity may still serve the
		// shards naming it until its renew deadline.
		r.adopting = true
	}
	adopting := r.adopting
	r.mu.Unlock()
	if ler.HolderIdentity != r.s.process {
		// The release. client-go's elector releases after a renewal that
		// failed too, on the Lease as it reads it then, but judges whether
		// it holds it by what it read before: it would name nobody on a
		// Lease another process of this identity has since taken, and then
		// take it back at once while the other serves. Only a Lease read
		// naming this process is released.
		if seen != r.s.process {
			r.s.o.Log.V(1).Info("membership not released: the Lease names another process", "holder", seen)
			return nil
		}
		return write()
	}
	sent := r.s.o.Clock.Now()
	r.s.lapse(sent)
	if err := write(); err != nil {
		return err
	}
	r.mu.Lock()
	r.seen, r.adopting = r.s.process, false
	r.mu.Unlock()
	if adopting {
		r.s.adopted(sent)
	}
	r.s.lapse(r.s.o.Clock.Now())
	r.s.mu.Lock()
	r.s.renewedAt = sent
	r.s.mu.Unlock()
	r.s.armLapse(sent)
	return nil
}

// armLapse gives up every shard once the renew deadline after the renewal
// sent at sent has passed with none since: a renewal held up in the API
// server or behind the client's rate limiter must not keep the shards, and
// the writes begun under them, past it (review 5, F2). Each renewal moves
// the one timer on.
func (s *Set) armLapse(sent time.Time) {
	d := max(s.o.RenewDeadline-s.o.Clock.Since(sent), 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lapseTimer != nil {
		s.lapseTimer.Stop()
	}
	s.lapseTimer = time.AfterFunc(d, func() { s.lapse(s.o.Clock.Now()) })
}

// lapse gives up every shard if the last renewal is older than the renew
// deadline at now.
func (s *Set) lapse(now time.Time) {
	s.mu.Lock()
	lapsed := len(s.held) > 0 && !s.freshLocked(now)
	s.mu.Unlock()
	if lapsed {
		s.o.Log.Info("membership renewal older than the renew deadline: every shard given up", "identity", s.o.Identity)
		s.dropAll("unrenewed")
	}
}

// adopted notes a membership taken at sent from a Lease that named nobody
// (or none): a shard whose Lease names this identity is taken only a lease
// duration after it (mayActOnOwn), by when any other process of this
// identity has ceased to serve it.
func (s *Set) adopted(sent time.Time) {
	s.mu.Lock()
	s.adoptedAt = sent
	s.mu.Unlock()
	s.o.Log.V(1).Info("membership taken from a Lease that named nobody: the shards naming this replica are taken after a lease duration", "identity", s.o.Identity)
}

// mayActOnOwn says whether this process may act on a shard whose Lease
// names this replica and which it does not serve (take it, or name nobody
// on it) at now. Another process of this identity may have written it:
// client-go's elector lets a process take a membership that names nobody at
// once, and the one that held it serves until its renew deadline (and
// takes, as its own, any shard named by the identity). A Lease seen
// written since this process became a member was written by such a
// process (or by a take of this one's whose answer was lost), and is acted
// on a lease duration after it was seen, by when every other process of
// the identity has ceased to serve: none can renew the membership this one
// holds. One seen written before is the last member's: acted on at once
// after a membership taken from it as it lapsed, and a lease duration
// after one taken from a Lease that named nobody (adoptedRecently). A
// shard's Lease is seen written when this replica's watch shows it: a
// version not yet seen so waits.
func (s *Set) mayActOnOwn(lease *coordinationv1.Lease, now time.Time) bool {
	s.mu.Lock()
	o, ok := s.seen[lease.Name]
	since := s.memberSince
	s.mu.Unlock()
	switch {
	case !ok || o.resourceVersion != lease.ResourceVersion:
		// Not seen yet as it is: the informer's store runs ahead of its
		// handlers, and when this version was written is not known.
		return false
	case !o.at.Before(since):
		return now.Sub(o.at) >= s.o.LeaseDuration
	default:
		return !s.adoptedRecently(now)
	}
}

// sawSibling notes another process of this identity seen holding its
// membership at now.
func (s *Set) sawSibling(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.siblingAt = now
}

// siblingMayServe says whether another process of this identity, seen
// holding the membership lately, may still serve shards at now: until its
// renew deadline after its last renewal, which came at most a jittered
// retry period or two after it was last seen. A shard whose Lease names
// nobody is taken only after that: the other process serves one named
// nobody by someone else until it sees the change, and this one would
// serve it beside it (review of 2026-12-06: seen in CI, the Lease blanked
// while the other process still served).
func (s *Set) siblingMayServe(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.siblingAt.IsZero() && now.Sub(s.siblingAt) < s.o.LeaseDuration+3*s.o.RetryPeriod
}

// adoptedRecently says whether the membership was adopted within the lease
// duration before now.
func (s *Set) adoptedRecently(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.adoptedAt.IsZero() && now.Sub(s.adoptedAt) < s.o.LeaseDuration
}

// setMember notes the membership won, for the elector's term (its context),
// or lost. The elector starts a term's callback in a goroutine of its own,
// which may run after the term has ended and its loss been noted: a term
// already over is no membership (review of fc2f1a6, 3).
func (s *Set) setMember(term context.Context, won bool) {
	s.mu.Lock()
	was := s.member
	member := won && term.Err() == nil
	s.member = member
	if member && !was {
		s.memberSince = s.o.Clock.Now()
	}
	s.mu.Unlock()
	if !member {
		// Without a renewed membership nothing is served: the others may
		// take every shard once they see it expire.
		s.dropAll("lost")
	}
	if was != member {
		s.o.Log.Info("membership", "identity", s.o.Identity, "member", member)
	}
	s.poke()
}

// dropAll ceases to serve every shard held, without writing.
func (s *Set) dropAll(why string) {
	s.mu.Lock()
	var held []int
	for shard := range s.held {
		held = append(held, shard)
	}
	s.mu.Unlock()
	for _, shard := range held {
		s.drop(shard, why)
	}
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
	s.note(l, s.o.Clock.Now())
	s.poke()
}

// note records a Lease's resourceVersion and, if it changed, when.
func (s *Set) note(l *coordinationv1.Lease, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.seen[l.Name]; !ok || o.resourceVersion != l.ResourceVersion {
		s.seen[l.Name] = observation{resourceVersion: l.ResourceVersion, at: now}
	}
}

// forget notes a deleted Lease as a change, not as the end of what was
// seen of it: a membership Lease deleted while its replica runs is made
// again at its next renewal, and the replica is not gone meanwhile.
func (s *Set) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if l, ok := obj.(*coordinationv1.Lease); ok {
		s.noteGone(l.Name, s.o.Clock.Now())
	}
	s.poke()
}

// noteGone notes that the Lease name is gone, if it was not already.
// Whoever may create and delete Leases in the namespace can make deletions
// under ever new names, each noted here: past maxSeen names, the ones gone
// for a lease duration are pruned here too, not only when a holder is taken
// from (membershipQuiet), which a steady sharding never does (review of
// 2026-12-06). A holder's own entry is kept (observation.holder), for
// membershipQuiet to judge, and to prune after holderKept lease durations.
func (s *Set) noteGone(name string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.seen[name]; !ok || o.resourceVersion != "" {
		s.seen[name] = observation{at: now}
	}
	if len(s.seen) > maxSeen {
		for n, o := range s.seen {
			if o.resourceVersion == "" && !o.holder && now.Sub(o.at) >= s.o.LeaseDuration {
				delete(s.seen, n)
			}
		}
	}
}

// holderKept is how many lease durations membershipQuiet keeps the gone
// membership of another holder it was asked about: enough for that holder's
// shards to be taken at a look, as its own entry says it quiet.
const holderKept = 4

// maxSeen is how many Leases' observations are kept before those of Leases
// gone for a lease duration are pruned: far more than a sharding's Leases.
const maxSeen = 1024

// membershipQuiet says whether holder's membership Lease shows no change
// within the lease duration: present, renamed or gone, it stayed so. A
// holder whose Lease is not live is taken from only then (review of issue
// 24, sharding: a deleted or renamed membership Lease made its replica's
// shards taken at once while it still served them). Gone entries older
// than the lease duration are pruned here (and by noteGone past maxSeen),
// so deleted Leases of any name leave nothing behind for long.
func (s *Set) membershipQuiet(holder string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, o := range s.seen {
		// Another holder's entry is kept for a few lease durations more:
		// pruned as soon as this one's, it would be noted afresh when
		// that holder is next asked about, and two gone holders asked
		// about in turn would each delay the other's shards (review of
		// 2026-12-06).
		keep := s.o.LeaseDuration
		if o.holder {
			keep *= holderKept
		}
		if o.resourceVersion == "" && now.Sub(o.at) >= keep && name != MemberLeaseName(holder) {
			delete(s.seen, name)
		}
	}
	o, ok := s.seen[MemberLeaseName(holder)]
	if !ok {
		// Never seen, present or gone: its state is noted from now.
		s.seen[MemberLeaseName(holder)] = observation{at: now, holder: true}
		return false
	}
	if !o.holder {
		o.holder = true
		s.seen[MemberLeaseName(holder)] = o
	}
	return now.Sub(o.at) >= s.o.LeaseDuration
}

// view is who is live, as this replica judges it: the replicas whose
// membership Lease it saw change within the lease duration, this one
// included while its own is renewed, and those of them that announce
// another shard count (with the count).
type view struct {
	live     []string
	isLive   map[string]bool
	mismatch map[string]string
}

// live judges the membership Leases: those of the cache, or members, read
// from the API server, noting first the changes they show.
func (s *Set) live(now time.Time, members []*coordinationv1.Lease) (view, error) {
	if members == nil {
		var err error
		if members, err = s.lister.List(labels.SelectorFromSet(labels.Set{LabelRole: roleMember})); err != nil {
			return view{}, fmt.Errorf("list membership Leases: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := view{isLive: map[string]bool{}, mismatch: map[string]string{}}
	mine := strconv.Itoa(s.o.Shards)
	for _, l := range members {
		holder := replicaOf(ptr.Deref(l.Spec.HolderIdentity, ""))
		if holder == "" || holder == s.o.Identity || MemberLeaseName(holder) != l.Name {
			continue
		}
		// The configured duration, which every replica shares, never the
		// Lease's own field: whoever may write Leases here could make a
		// member that one write keeps live for ever (review 4, S3).
		if o, ok := s.seen[l.Name]; ok && now.Sub(o.at) < s.o.LeaseDuration {
			v.live = append(v.live, holder)
			v.isLive[holder] = true
			// A replica of before the count was announced announces none,
			// which is another count too (review 4, S4).
			if n := l.Labels[LabelShards]; n != mine {
				v.mismatch[holder] = n
			}
		}
	}
	if s.member {
		v.live = append(v.live, s.o.Identity)
		v.isLive[s.o.Identity] = true
	}
	slices.Sort(v.live)
	return v, nil
}

// call bounds one request of a hand-over by the renew deadline: on a
// connection that hangs, a take or release waits no longer than a renewal
// would, and the shards after it in the look are not held up for the tens
// of seconds HTTP/2's health check takes to close it. A take whose answer
// is lost so is read back at the next look (the Lease names this replica,
// or not).
func (s *Set) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.o.RenewDeadline)
}

// verified is who is live, judged on the membership Leases read from the
// API server (a quorum read, not the cache): a replica this replica's watch
// has not seen renewed within the lease duration may have been renewed
// all the same (the watch lags, or this replica was paused). A replica is
// gone only if its Lease is still the one seen a lease duration ago.
func (s *Set) verified(ctx context.Context) (view, error) {
	callCtx, cancel := s.call(ctx)
	defer cancel()
	list, err := s.o.Client.CoordinationV1().Leases(s.o.Namespace).List(callCtx, metav1.ListOptions{LabelSelector: LabelRole + "=" + roleMember})
	if err != nil {
		return view{}, fmt.Errorf("read the membership Leases: %w", err)
	}
	// The time the answer came, not the time the read was sent: a renewal
	// the read is the first to show may have been made while it was on its
	// way, and noted as seen earlier it would expire early by the read's
	// latency (review of ee75044).
	now := s.o.Clock.Now()
	members := make([]*coordinationv1.Lease, 0, len(list.Items))
	listed := map[string]bool{}
	for i := range list.Items {
		l := &list.Items[i]
		if l.Labels[LabelRole] != roleMember {
			continue
		}
		s.note(l, now)
		members = append(members, l)
		listed[l.Name] = true
	}
	// A membership Lease this replica saw and the read does not show is
	// gone since now at the latest (its watch has not said so yet).
	s.mu.Lock()
	var gone []string
	for name, o := range s.seen {
		if strings.HasPrefix(name, MemberLeasePrefix) && o.resourceVersion != "" && !listed[name] {
			gone = append(gone, name)
		}
	}
	s.mu.Unlock()
	for _, name := range gone {
		s.noteGone(name, now)
	}
	return s.live(now, members)
}

// tick takes the shards meant for this replica that nobody live holds, and
// gives up those meant for another. While a live replica announces another
// shard count, it serves nothing.
func (s *Set) tick(ctx context.Context) {
	now := s.o.Clock.Now()
	v, err := s.live(now, nil)
	if err != nil {
		s.o.Log.Error(err, "shard hand-over")
		return
	}
	s.o.Metrics.members(len(v.live))
	if s.setMismatch(v.mismatch) {
		return
	}
	s.mu.Lock()
	member := s.member
	s.mu.Unlock()
	if !member {
		return
	}
	// One replica deletes, so that the others do not send the same
	// deletions only to have them refused; after the shards are looked at,
	// so that a take-over does not wait for them.
	if len(v.live) > 0 && v.live[0] == s.o.Identity && !now.Before(s.collectAfter) {
		s.collectAfter = now.Add(s.o.LeaseDuration)
		defer s.collectMembers(ctx, v, now)
	}
	// Releases at once, not one after the other: each waits for the acts
	// begun under its hold, up to the renew deadline, and a replica giving
	// up half its shards to one that joins would hand the last over only
	// after as many deadlines. Each hold is detached here, before anything
	// else in the look can drop it, so that its release writes what that
	// hold left unsettled. Not cancelled by a stop: the shard is no longer
	// held, so the stop's own releases would not name nobody on it. The
	// next look begins once they are done.
	var releases sync.WaitGroup
	defer releases.Wait()
	releaseCtx := context.WithoutCancel(ctx)
	for shard := range s.o.Shards {
		mine := Owner(v.live, shard) == s.o.Identity
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
		held := s.held[shard] != nil
		s.mu.Unlock()
		switch {
		case held && lease == nil:
			// Deleted, or out of the watch's selection (its role label
			// removed): stop at once, as for a take; the owner makes it
			// again, or puts its labels back (relabel).
			s.drop(shard, "lease-gone")
		case held && holder != s.o.Identity:
			// Taken by another replica that judged this one gone: stop at once.
			s.drop(shard, "taken")
		case held && !mine:
			h := s.detach(shard, "released")
			releases.Go(func() { s.finishRelease(releaseCtx, shard, lease, h) })
		case !held && mine && s.takable(lease, holder, v, now, false):
			// The view from the API server, read for each take and after
			// the shard's Lease was read: the holder this replica's watch
			// saw unrenewed may have been renewed (review 4, S1), and a
			// view read earlier in this look does not know a replica that
			// joined since, took this shard and names itself on its Lease
			// (its membership is written before any take). Taking from it
			// as from a replica gone would make both record the verdicts
			// in effect again.
			checked, err := s.verified(ctx)
			if err != nil {
				s.o.Log.Error(err, "shard hand-over")
				return
			}
			if s.setMismatch(checked.mismatch) {
				return
			}
			checkedAt := s.o.Clock.Now()
			if Owner(checked.live, shard) == s.o.Identity && s.takable(lease, holder, checked, checkedAt, true) {
				s.take(ctx, shard, lease, holder)
			}
		case !held && !mine && holder == s.o.Identity && s.mayActOnOwn(lease, now):
			// A release whose write failed: the Lease still names this
			// replica, live, and the owner waits for it to name nobody
			// (review 4, S2). Name nobody again until the write succeeds.
			// Not on a Lease another process of this identity may still
			// serve under: the owner would take it while it does.
			releases.Go(func() { s.finishRelease(releaseCtx, shard, lease, nil) })
		}
	}
}

// collectMembers deletes the membership Leases of other replicas that are
// not live and that this replica saw unchanged for StaleMemberAfter: a Pod
// gone (a rollout, an eviction, a node lost) leaves its Lease, named after
// it, for ever otherwise, and every replica lists them all at each look
// (review of stop 63). The deletion is conditional on the resourceVersion
// seen, so a Lease renewed meanwhile (its replica back from a pause, or
// this replica's watch behind) is kept; a replica whose Lease was deleted
// all the same makes it again at its next renewal. Its shards were taken
// long before (a lease duration after its last renewal).
//
// The shard Leases of another shard count than the one every live replica
// announces (this look saw no mismatch) are deleted the same way: a change
// of count left N of them for ever, which every replica watches. None of
// them can be held: a replica of another count that is live serves nothing
// and makes the looks see a mismatch, and one back from a pause finds its
// Lease gone and its hold lapsed.
func (s *Set) collectMembers(ctx context.Context, v view, now time.Time) {
	members, err := s.lister.List(labels.SelectorFromSet(labels.Set{LabelRole: roleMember}))
	if err != nil {
		s.o.Log.Error(err, "list membership Leases")
		return
	}
	shards, err := s.lister.List(labels.SelectorFromSet(labels.Set{LabelRole: roleShard}))
	if err != nil {
		s.o.Log.Error(err, "list shard Leases")
		return
	}
	mine := strconv.Itoa(s.o.Shards)
	for _, l := range shards {
		if strings.HasPrefix(l.Name, ShardLeasePrefix) && !strings.HasPrefix(l.Name, ShardLeasePrefix+mine+"-") && l.Labels[LabelShards] != mine {
			members = append(members, l)
		}
	}
	deletions := 0
	for _, l := range members {
		if deletions == maxCollected {
			// The rest at the next looks: a look is not held up for
			// long by a backlog (the first after an upgrade).
			return
		}
		// A shard Lease of another count is held by no process of this
		// count, even one named as its holder (a replica restarted with
		// the new count): only its being unchanged counts.
		if l.Labels[LabelRole] == roleMember {
			holder := replicaOf(ptr.Deref(l.Spec.HolderIdentity, ""))
			if !strings.HasPrefix(l.Name, MemberLeasePrefix) || l.Name == MemberLeaseName(s.o.Identity) || (holder != "" && v.isLive[holder]) {
				continue
			}
		}
		s.mu.Lock()
		o, ok := s.seen[l.Name]
		s.mu.Unlock()
		if !ok || o.resourceVersion != l.ResourceVersion || now.Sub(o.at) < s.o.StaleMemberAfter {
			continue
		}
		deletions++
		callCtx, cancel := s.call(ctx)
		err := s.o.Client.CoordinationV1().Leases(s.o.Namespace).Delete(callCtx, l.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion},
		})
		cancel()
		switch {
		case err == nil:
			what := "the membership Lease of a replica gone"
			if l.Labels[LabelRole] == roleShard {
				what = "a shard Lease of a shard count no longer given"
			}
			s.o.Log.Info("deleted "+what, "lease", l.Name, "holder", ptr.Deref(l.Spec.HolderIdentity, ""),
				"unchanged_since", o.at.UTC().Format(time.RFC3339))
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// Deleted by another, or changed since: the next look judges it again.
		case ctx.Err() != nil:
			return
		default:
			// Forbidden (RBAC kept outside the chart) or failing: said
			// once, and tried again only after StaleMemberAfter, not at
			// every look.
			s.collectAfter = now.Add(s.o.StaleMemberAfter)
			s.o.Log.Error(err, "delete a Lease of a replica gone or of a shard count no longer given; tried again later", "lease", l.Name,
				"next", s.collectAfter.UTC().Format(time.RFC3339))
			return
		}
	}
}

// maxCollected is how many membership Leases one look deletes at most.
const maxCollected = 10

// takable says whether this replica, the shard's owner, may take the shard
// whose Lease names holder at now: named nobody, unless another process of
// this identity may still serve it (siblingMayServe); named this replica,
// as mayActOnOwn says; named a replica not live in v, and, when quiet is
// asked (the check before the take), one whose membership stayed as it was
// for the lease duration (membershipQuiet).
func (s *Set) takable(lease *coordinationv1.Lease, holder string, v view, now time.Time, quiet bool) bool {
	switch holder {
	case "":
		return !s.siblingMayServe(now)
	case s.o.Identity:
		return s.mayActOnOwn(lease, now)
	default:
		return !v.isLive[holder] && (!quiet || s.membershipQuiet(holder, now))
	}
}

// setMismatch notes the live replicas that announce another shard count
// and, if there are any, gives up every shard: replicas given different
// counts (a rollout that changes it) would serve some clusters twice and
// others not at all. It reports whether there are.
func (s *Set) setMismatch(others map[string]string) bool {
	s.mu.Lock()
	was := len(s.mismatch) > 0
	changed := !maps.Equal(s.mismatch, others)
	if len(others) == 0 {
		s.mismatch = nil
	} else {
		s.mismatch = maps.Clone(others)
	}
	s.mu.Unlock()
	s.o.Metrics.mismatch(len(others) > 0)
	if len(others) > 0 {
		s.dropAll("shard-count-mismatch")
	}
	if changed && (was || len(others) > 0) {
		if len(others) > 0 {
			s.o.Log.Info("live replicas announce another shard count: this replica serves nothing until they agree", "shards", s.o.Shards, "others", others)
		} else {
			s.o.Log.Info("the live replicas agree on the shard count again", "shards", s.o.Shards)
		}
		s.o.OnCountMismatch(maps.Clone(others))
	}
	return len(others) > 0
}

// shardLease is a shard's Lease as the cache has it or, until the cache has
// this replica's last write of it, as written; nil if there is none.
func (s *Set) shardLease(shard int) (*coordinationv1.Lease, error) {
	lease, err := s.lister.Get(s.shardLeaseName(shard))
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
	callCtx, cancel := s.call(ctx)
	defer cancel()
	var (
		err      error
		result   *coordinationv1.Lease
		replaced string
		settled  time.Time
		// unsettled is the stamp of the earliest act the previous holder
		// gave the shard up without settling; zero when not known.
		unsettled time.Time
	)
	if lease == nil {
		spec.LeaseTransitions = ptr.To[int32](0)
		result, err = leases.Create(callCtx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.shardLeaseName(shard), Namespace: s.o.Namespace, Labels: s.shardLabels(shard)},
			Spec:       spec,
		}, metav1.CreateOptions{})
	} else {
		updated := lease.DeepCopy()
		spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
		updated.Spec = spec
		if previous == "" {
			// Given up, not lost: its holder said until when it recorded
			// its verdicts. The next holder is told afresh.
			settled, _ = time.Parse(time.RFC3339Nano, lease.Annotations[AnnotationSettledUntil])
			unsettled, _ = time.Parse(time.RFC3339Nano, lease.Annotations[AnnotationUnsettledSince])
		}
		delete(updated.Annotations, AnnotationSettledUntil)
		delete(updated.Annotations, AnnotationUnsettledSince)
		replaced = lease.ResourceVersion
		result, err = leases.Update(callCtx, updated, metav1.UpdateOptions{})
	}
	if err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			s.relabel(ctx, shard)
		case !apierrors.IsConflict(err):
			s.o.Log.Error(err, "take shard", "shard", shard)
		}
		return
	}
	s.noteWrite(shard, replaced, result)
	s.mu.Lock()
	// The membership may have lapsed during the write: then the shard is
	// not served, and the Lease names a replica the others will see gone.
	ok := s.member && s.freshLocked(s.o.Clock.Now()) && len(s.mismatch) == 0 && s.held[shard] == nil
	if ok {
		// A settled-until ahead of this replica's clock (a forged one, or a
		// skewed clock) says no more than "settled now" (review 5, F10).
		now := s.o.Clock.Now()
		if settled.After(now) {
			settled = now
		}
		// An unsettled-since ahead of this replica's clock (the releasing
		// replica's runs ahead, or it is forged) says "unsettled now": its
		// time is no earlier than the window the approver looks back
		// anyway, but the write it stamps may yet commit, and the approver
		// looks again until such a write no longer can. Dropped, it left
		// the adoption settled at the first pass, and a write committed
		// after it unrecorded (review 197C F1).
		if !settled.IsZero() {
			unsettled = time.Time{}
		} else if unsettled.After(now) {
			unsettled = now
		}
		if gone := s.given[shard]; gone != nil && previous == s.o.Identity {
			// Taken back from itself, the Lease naming this replica since
			// this process gave it up (dropped, or its release's write
			// failed; another process of this identity may have held it
			// meanwhile, and then the look back covers its verdicts too):
			// what that hold left unsettled is this one's to record.
			if at := earliestLocked(gone, false); !at.IsZero() && (unsettled.IsZero() || at.Before(unsettled)) {
				unsettled = at
			}
		}
		delete(s.given, shard)
		h := &hold{settled: settled, noting: settled.IsZero(), takenAt: now}
		if h.noting {
			h.unsettled = 1
		}
		if h.noting && replaced != "" {
			// Held before (a Lease made now had no holder, so no verdicts
			// of another's to record).
			h.inherited = now.Add(-s.LookBack())
			if !unsettled.IsZero() && unsettled.Before(h.inherited) {
				h.inherited = unsettled
			}
		}
		h.ctx, h.cancel = context.WithCancel(s.base)
		s.held[shard] = h
		s.settled[shard] = settled
		s.unsettledSince[shard] = unsettled
		delete(s.releasedSettled, shard)
		// Under the lock, as detach's: a drop between the two (the lapse's
		// timer) would otherwise leave the gauge at 1 for a shard not held.
		s.o.Metrics.held(shard, true, "taken")
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	s.o.Log.Info("shard taken", "shard", shard, "previous_holder", previous, "settled_until", settled, "unsettled_since", unsettled)
	s.o.OnChange(shard)
}

// shardLabels are the labels of a shard's Lease.
func (s *Set) shardLabels(shard int) map[string]string {
	return map[string]string{LabelRole: roleShard, LabelShard: strconv.Itoa(shard), LabelShards: strconv.Itoa(s.o.Shards)}
}

// relabel puts its labels back on a shard's Lease that the take's create
// found existing while the cache has none of that name. Usually the cache
// lags a Lease another replica just made, and the next look sees it; but a
// Lease whose ichor.dev/shard-role label someone removed or changed has
// left every replica's watch: its holder gave the shard up (lease-gone),
// and every take's create would fail as already existing, the shard served
// by no one, for as long as the label stays off. Only the labels are written,
// on the version read: the holder it names and its annotations stay, and
// the next look judges the Lease as it would any other (one naming this
// replica is taken once mayActOnOwn allows it).
func (s *Set) relabel(ctx context.Context, shard int) {
	leases := s.o.Client.CoordinationV1().Leases(s.o.Namespace)
	ctx, cancel := s.call(ctx)
	defer cancel()
	lease, err := leases.Get(ctx, s.shardLeaseName(shard), metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			s.o.Log.Error(err, "read shard Lease outside the cache", "shard", shard)
		}
		return
	}
	if role := lease.Labels[LabelRole]; role == roleShard || role == roleMember {
		return // in the watch's selection: the cache has not seen it yet
	}
	s.o.Log.Error(errors.New("a shard's Lease lost its "+LabelRole+" label: no replica watched it, and none served the shard"),
		"putting the shard Lease's labels back", "shard", shard, "lease", lease.Name, "role_label", lease.Labels[LabelRole])
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	maps.Copy(lease.Labels, s.shardLabels(shard))
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		s.o.Log.Error(err, "put the shard Lease's labels back", "shard", shard)
	}
}

// drop ceases to serve a shard here, without writing: what runs under its
// hold is cancelled. It returns the hold, nil if the shard was not held.
func (s *Set) drop(shard int, why string) *hold {
	h := s.detach(shard, why)
	if h != nil {
		h.cancel()
	}
	return h
}

// detach ceases to serve a shard here, without writing and without
// cancelling what runs under its hold: no act begins under it any more.
// It returns the hold, nil if the shard was not held.
func (s *Set) detach(shard int, why string) *hold {
	s.mu.Lock()
	h := s.held[shard]
	delete(s.held, shard)
	if h != nil {
		s.given[shard] = h
		s.o.Metrics.held(shard, false, why)
	}
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	s.o.Log.Info("shard given up", "shard", shard, "why", why)
	s.o.OnChange(shard)
	return h
}

// release ceases to serve a shard, then names nobody on its Lease, so that
// the replica it is meant for takes it at its next look. Once the acts begun
// under the hold are done (within the renew deadline), the Lease says until
// when this replica recorded its verdicts, so that the next holder does not
// record them again (review 4, S6).
func (s *Set) release(ctx context.Context, shard int, lease *coordinationv1.Lease) {
	s.finishRelease(ctx, shard, lease, s.detach(shard, "released"))
}

// finishRelease is release once the hold h (nil if the shard was not held
// any more) is detached.
func (s *Set) finishRelease(ctx context.Context, shard int, lease *coordinationv1.Lease, h *hold) {
	// The writes begun under the hold are let finish (within the renew
	// deadline) before it is cancelled: a write cancelled once sent may
	// have been applied all the same, and its record would be lost
	// (review 5, F1). No act begins once it is detached.
	if h != nil {
		defer h.cancel()
	}
	if lease == nil || ptr.Deref(lease.Spec.HolderIdentity, "") != s.o.Identity {
		return
	}
	updated := lease.DeepCopy()
	updated.Spec.HolderIdentity = ptr.To("")
	updated.Spec.RenewTime = ptr.To(metav1.NewMicroTime(s.o.Clock.Now()))
	delete(updated.Annotations, AnnotationSettledUntil)
	delete(updated.Annotations, AnnotationUnsettledSince)
	var note releaseNote
	if h == nil {
		// A release tried again (the last write failed): what the first
		// found of the hold still holds. A hold dropped without a release
		// (lost, unrenewed, its Lease out of the watch) wrote no note: what
		// it left unsettled, acts in progress included, is said instead.
		s.mu.Lock()
		var recorded bool
		note, recorded = s.releasedSettled[shard]
		if g := s.given[shard]; !recorded && g != nil {
			if since := earliestLocked(g, false); !since.IsZero() {
				note.unsettledSince = since.UTC().Format(time.RFC3339Nano)
			}
		}
		s.mu.Unlock()
	} else {
		acted := waitFor(&h.acts, s.o.RenewDeadline)
		unsettled, pending, since := s.unsettledOf(h, acted)
		switch {
		case !acted:
			s.o.Log.Info("shard released unsettled: writes still in progress after the renew deadline", "shard", shard)
		case unsettled > 0:
			s.o.Log.Info("shard released unsettled: clusters taken over from a replica gone not yet passed", "shard", shard, "clusters", unsettled)
		case pending > 0:
			s.o.Log.Info("shard released unsettled: verdicts that may be in effect without their record", "shard", shard, "verdicts", pending, "since", since)
		default:
			note.settledUntil = s.o.Clock.Now().UTC().Format(time.RFC3339Nano)
		}
		if note.settledUntil == "" && !since.IsZero() {
			note.unsettledSince = since.UTC().Format(time.RFC3339Nano)
		}
		s.mu.Lock()
		s.releasedSettled[shard] = note
		s.mu.Unlock()
	}
	for key, value := range map[string]string{AnnotationSettledUntil: note.settledUntil, AnnotationUnsettledSince: note.unsettledSince} {
		if value == "" {
			continue
		}
		if updated.Annotations == nil {
			updated.Annotations = map[string]string{}
		}
		updated.Annotations[key] = value
	}
	s.mu.Lock()
	fresh := s.freshLocked(s.o.Clock.Now())
	s.mu.Unlock()
	if !fresh {
		// Paused past the renew deadline (a stop's release read the Lease
		// after the pause): another process of this identity may have
		// taken the membership and this shard since, and the Lease read
		// may be its take. Naming nobody on it would hand the shard over
		// while that one serves it (review of fc2f1a6, 1).
		s.o.Log.V(1).Info("shard not released: the membership is older than the renew deadline", "shard", shard)
		return
	}
	callCtx, cancel := s.call(ctx)
	defer cancel()
	result, err := s.o.Client.CoordinationV1().Leases(s.o.Namespace).Update(callCtx, updated, metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) {
			// Not named free: tick tries again while it names this
			// replica, and the others take it once this replica's
			// membership expires.
			s.o.Log.Error(err, "release shard", "shard", shard)
		}
		return
	}
	s.o.Log.V(1).Info("shard released", "shard", shard, "settled_until", note.settledUntil, "unsettled_since", note.unsettledSince)
	s.mu.Lock()
	// The Lease says it now.
	delete(s.given, shard)
	s.mu.Unlock()
	s.noteWrite(shard, lease.ResourceVersion, result)
}

// unsettledOf is how many adoptions the hold has left to settle, how many
// of its acts, and the earliest stamp a next holder must record from: of
// those acts, of the acts in progress (when acted is false: the release
// could not wait for them), and, while adoptions are left, of the verdicts
// they would record.
func (s *Set) unsettledOf(h *hold, acted bool) (adoptions, acts int, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return h.unsettled, len(h.pending), earliestLocked(h, acted)
}

// earliestLocked is the earliest stamp a next holder of h's shard must
// record from (see unsettledOf); zero for none. Under the Set's lock.
func earliestLocked(h *hold, acted bool) (since time.Time) {
	earliest := func(at time.Time) {
		if !at.IsZero() && (since.IsZero() || at.Before(since)) {
			since = at
		}
	}
	for _, at := range h.pending {
		earliest(at)
	}
	if !acted {
		for _, at := range h.inflight {
			earliest(at)
		}
	}
	if h.unsettled > 0 {
		earliest(h.inherited)
	}
	return since
}

// waitFor waits for wg at most d, and reports whether it is done.
func waitFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// releaseAll gives up every shard held, at shutdown.
func (s *Set) releaseAll(ctx context.Context) {
	s.mu.Lock()
	var held []int
	for shard := range s.held {
		held = append(held, shard)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*s.o.RenewDeadline)
	defer cancel()
	// At once, not one after the other: on a slow API server the budget
	// would run out before the last, whose Lease the others then take
	// only once the membership expires, and without its settled-until.
	var wg sync.WaitGroup
	for _, shard := range held {
		wg.Go(func() {
			lease, err := s.o.Client.CoordinationV1().Leases(s.o.Namespace).Get(ctx, s.shardLeaseName(shard), metav1.GetOptions{})
			if err != nil {
				s.o.Log.Error(err, "release shard", "shard", shard)
				s.drop(shard, "stopping")
				return
			}
			s.release(ctx, shard, lease)
		})
	}
	wg.Wait()
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

// processHolder is the holder a process of the replica identity writes on
// its membership Lease: the identity, '#' and a random nonce of 16 hex
// digits. client-go's elector takes a Lease naming its own identity as its
// own, so two processes given one identity (a --shard-identity given twice;
// a StatefulSet's Pod made again while the process of the one
// force-deleted still runs on a node cut off) were both members and both
// served every shard of the replica's. With the nonce they are two
// candidates for one membership: one serves, the other stands by until the
// first's membership lapses or is given up. A process restarted under its
// identity waits for the last one's membership to lapse (a lease duration)
// unless that one gave it up when it stopped.
func processHolder(identity string) (string, error) {
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", fmt.Errorf("shard: the membership's nonce: %w", err)
	}
	return identity + "#" + hex.EncodeToString(nonce[:]), nil
}

// replicaOf is the replica identity a membership Lease's holder names: a
// process's holder without its nonce, or the holder as it is (a replica of
// a version that wrote its identity alone).
func replicaOf(holder string) string {
	i := strings.LastIndexByte(holder, '#')
	if i < 0 || len(holder)-i-1 != 16 {
		return holder
	}
	if _, err := hex.DecodeString(holder[i+1:]); err != nil {
		return holder
	}
	return holder[:i]
}

// MemberLeaseName is the name of a replica's membership Lease: a digest of
// its identity, which need not be a valid object name.
func MemberLeaseName(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return MemberLeasePrefix + hex.EncodeToString(sum[:8])
}

// ShardLeaseName is the name of the Lease of a shard of shards: the count is
// in the name, so that replicas given different counts (a rollout that
// changes it) never take one another's Leases for their own.
func ShardLeaseName(shards, shard int) string {
	return ShardLeasePrefix + strconv.Itoa(shards) + "-" + strconv.Itoa(shard)
}

func (s *Set) shardLeaseName(shard int) string { return ShardLeaseName(s.o.Shards, shard) }
