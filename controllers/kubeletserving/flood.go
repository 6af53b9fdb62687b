package kubeletserving

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// IndexUndecided indexes the kubelet serving CSRs for the flood guards of
// the rule: the undecided ones by their requester ("user:" and spec.username)
// and all of them under one key (undecidedAll), and every one, decided or not,
// by its requester ("made-by:" and spec.username). The counts are a lookup in
// the cache, not a scan.
const IndexUndecided = "ichor.dev/undecidedKubeletServing"

const undecidedAll = "all"

func undecidedKeys(o client.Object) []string {
	csr, ok := o.(*certificatesv1.CertificateSigningRequest)
	if !ok || csr.Spec.SignerName != certificatesv1.KubeletServingSignerName {
		return nil
	}
	madeBy := "made-by:" + csr.Spec.Username
	if len(csr.Status.Certificate) > 0 || approval.IsDecided(csr) {
		return []string{madeBy}
	}
	return []string{undecidedAll, "user:" + csr.Spec.Username, madeBy}
}

func addUndecidedIndex(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &certificatesv1.CertificateSigningRequest{}, IndexUndecided, undecidedKeys); err != nil {
		return fmt.Errorf("index %s: %w", IndexUndecided, err)
	}
	return nil
}

// limitsTTL is how long the rule's limits are used before they are asked
// again: a new bundle's limits count within it, and a pass costs no extra
// decision (and log entry) of its own.
const limitsTTL = 10 * time.Second

// limitsCache keeps the rule's limits for limitsTTL.
type limitsCache struct {
	mu     sync.Mutex
	limits engine.KubeletServingLimits
	asked  time.Time
}

func (c *limitsCache) get(ctx context.Context, eng Decider, now time.Time) (engine.KubeletServingLimits, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.asked.IsZero() && now.Sub(c.asked) < limitsTTL {
		return c.limits, nil
	}
	limits, err := eng.KubeletServingLimits(ctx)
	if err != nil {
		return engine.KubeletServingLimits{}, err
	}
	c.limits, c.asked = limits, now
	return limits, nil
}

// countsTTL is how long the flood counts are used after an event that can
// only lower them (a request decided or deleted, a machine's status
// written; not a machine's deletion, which lowers the rule's limit): a count a little high withholds an approval a little longer,
// which is safe, and a mass reboot's approvals do not each cost a count.
const countsTTL = time.Second

// floodCounts keeps the counts of one API server's undecided requests
// (countAll) between the events that change them, so that the work of a
// burst of requests grows with the events and not with events × requesters:
// every requester key of a flood would otherwise list every undecided
// request again.
//
// The events are noted before their requester is queued, and the informer
// has stored the request before it tells of it, so the worker that decides
// a request finds it counted: counts taken before an event that may raise
// them (a new undecided request) are never used after it. Counts taken
// before one that can only lower them are used for up to countsTTL. One
// count runs at a time; the workers that wait for it use it when it is new
// enough. The zero value is ready; nil counts every time.
type floodCounts struct {
	// raised counts the events after which the counts may be higher;
	// lowered, every other.
	raised, lowered atomic.Uint64

	mu sync.Mutex
	// taken is when counts were taken, on basis, after raisedAt raising
	// and loweredAt other events; zero when there are none.
	taken     time.Time
	basis     countsBasis
	raisedAt  uint64
	loweredAt uint64
	counts    csrinput.Requests

	// judged are the node names the judging clusters' machines answer to,
	// kept while their basis holds: every request of a burst raises the
	// counts, and listing every machine for each was the larger part of
	// counting them (7.7% of the manager's CPU at 5,000 machines).
	judged judgedNames
}

// judgedNames are the node names of the judging clusters' machines, and how
// many machines those are, taken on basis.
type judgedNames struct {
	mu       sync.Mutex
	basis    namesBasis
	names    map[string]bool
	machines int
}

// namesBasis is what the judged node names depend on: a machine that
// appears, or changes the names it answers to or its cluster, starts a new
// machine epoch (noteMachine; it is noted after the cache holds the change,
// so names listed on an epoch are never older than it), a deleted one is
// counted, and which clusters judge is the judges' key.
type namesBasis struct {
	machineEpoch    uint64
	machinesDeleted uint64
	judges          string
}

// countsBasis is what the counts depend on besides the requests: the rule's
// limits, the machines' node names (their epoch), the machines deleted (a
// deletion lowers the rule's limit) and which clusters judge.
type countsBasis struct {
	limits          engine.KubeletServingLimits
	machineEpoch    uint64
	machinesDeleted uint64
	judges          string
}

// noteEvent notes a request's event: raising when, after it, the request
// is undecided (it is counted from now on), lowering otherwise.
func (f *floodCounts) noteEvent(csr *certificatesv1.CertificateSigningRequest, deleted bool) {
	if f == nil {
		return
	}
	if !deleted && len(csr.Status.Certificate) == 0 && !approval.IsDecided(csr) {
		f.raised.Add(1)
		return
	}
	f.lowered.Add(1)
}

// get is the counts on basis: the kept ones when no raising event came
// since they were taken and, when some other event did (or machines
// changed: machineEvents), they are younger than countsTTL; else count's,
// kept.
func (f *floodCounts) get(basis countsBasis, machineEvents uint64, now time.Time, count func() (csrinput.Requests, error)) (csrinput.Requests, error) {
	if f == nil {
		return count()
	}
	raised, lowered := f.raised.Load(), f.lowered.Load()+machineEvents
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.taken.IsZero() && f.basis == basis && f.raisedAt >= raised &&
		(f.loweredAt >= lowered || now.Sub(f.taken) < countsTTL) {
		return f.counts, nil
	}
	// Read again, before the listing: every event up to these is in it.
	raisedAt, loweredAt := f.raised.Load(), f.lowered.Load()+machineEvents
	counts, err := count()
	if err != nil {
		return csrinput.Requests{}, err
	}
	f.taken, f.basis, f.raisedAt, f.loweredAt, f.counts = now, basis, raisedAt, loweredAt, counts
	return counts, nil
}

// judgedNames are the judged node names on basis: the kept ones, else
// list's, kept. The map is shared: read only.
func (f *floodCounts) judgedNames(basis namesBasis, list func() (map[string]bool, int, error)) (map[string]bool, int, error) {
	if f == nil {
		return list()
	}
	j := &f.judged
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.names != nil && j.basis == basis {
		return j.names, j.machines, nil
	}
	names, machines, err := list()
	if err != nil {
		return nil, 0, err
	}
	j.basis, j.names, j.machines = basis, names, machines
	return names, machines, nil
}

// requests are the counts of input.requests for csr: its requester's
// undecided requests, and how many of its requests are newer, decided or not,
// from the target's cache; and the counts of every undecided request and of
// the machines, kept between events (floodCounts). Newer counts the decided
// ones too, so that the answer does not depend on the order requests are
// judged in: once a flood's newest were decided, an older one judged after
// them would otherwise find fewer newer ones and be judged on its merits.
func (p *pass) requests(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (*csrinput.Requests, error) {
	out, err := p.countAll(ctx)
	if err != nil {
		return nil, err
	}
	var mine certificatesv1.CertificateSigningRequestList
	if err := p.target.reader.List(ctx, &mine, client.MatchingFields{IndexUndecided: "made-by:" + csr.Spec.Username}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("count the requests of %s: %w", csr.Spec.Username, err)
	}
	for i := range mine.Items {
		other := &mine.Items[i]
		if len(other.Status.Certificate) == 0 && !approval.IsDecided(other) {
			out.FromRequester++
		}
		if newer(other, csr) {
			out.NewerFromRequester++
		}
	}
	return &out, nil
}

// countAll is the counts of every undecided request of the pass's API server
// and of the machines of the clusters that judge it: for a cluster with
// kubeconfigRef, its own; for the manager's API server, those of every
// enabled cluster the operator named (LocalClusters). The target's
// floodCounts keeps them between events (see there).
//
// Undecided are only the requests Ichor could approve for those clusters: the
// requester is system:node:<name>, <name> is the node name the request asks
// for, and a machine of theirs answers to it. Every other undecided request
// (a name no machine has: kube-controller-manager issues a client identity
// for any name to whoever holds a bootstrap token) is counted apart, as
// unknown, so that such names cannot hold up a real node's approval; the rule
// says what each count weighs.
func (p *pass) countAll(ctx context.Context) (csrinput.Requests, error) {
	limits, err := p.r.limits.get(ctx, p.r.Engine, p.now)
	if err != nil {
		return csrinput.Requests{}, fmt.Errorf("the limits of the kubelet serving rule: %w", err)
	}
	judges, err := p.judgingClusters(ctx)
	if err != nil {
		return csrinput.Requests{}, err
	}
	// The machines' epoch and deletions are read before anything is
	// listed: what is listed is never older than they say.
	basis := countsBasis{limits: limits, machineEpoch: p.r.machineEpoch.Get(), machinesDeleted: p.r.machinesDeleted.Load()}
	ids := make([]string, 0, len(judges))
	for _, c := range judges {
		ids = append(ids, fmt.Sprintf("%s/%d", c.UID, c.Generation))
	}
	// The cache lists them in no set order.
	slices.Sort(ids)
	basis.judges = strings.Join(ids, ";")
	return p.target.counts.get(basis, p.r.machineEvents.Load(), p.r.Clock.Now(), func() (csrinput.Requests, error) {
		return p.count(ctx, limits, judges, namesBasis{machineEpoch: basis.machineEpoch, machinesDeleted: basis.machinesDeleted, judges: basis.judges})
	})
}

// count lists every undecided request of the pass's API server and the
// machines of the judging clusters (their node names kept on namesAt), and
// counts them (countAll).
func (p *pass) count(ctx context.Context, limits engine.KubeletServingLimits, judges []ichorv1alpha1.TalosCluster, namesAt namesBasis) (csrinput.Requests, error) {
	names, machines, err := p.target.counts.judgedNames(namesAt, func() (map[string]bool, int, error) {
		return p.judgedNodeNames(ctx, judges)
	})
	if err != nil {
		return csrinput.Requests{}, err
	}
	var all certificatesv1.CertificateSigningRequestList
	if err := p.target.reader.List(ctx, &all, client.MatchingFields{IndexUndecided: undecidedAll}, client.UnsafeDisableDeepCopy); err != nil {
		return csrinput.Requests{}, fmt.Errorf("count the undecided requests: %w", err)
	}
	// Each requester's up to the rule's limit: beyond it the rule denies
	// them, so one node's flood does not make every node's look like one.
	perRequester := map[string]int{}
	out := csrinput.Requests{Machines: machines}
	for i := range all.Items {
		csr := &all.Items[i]
		u := csr.Spec.Username
		if perRequester[u] >= limits.MaxUndecidedPerRequester {
			continue
		}
		perRequester[u]++
		if node := p.target.names.of(csr); node != "" && names[node] && u == limits.NodeUserPrefix+node {
			out.Undecided++
		} else {
			out.Unknown++
		}
	}
	return out, nil
}

// judgingClusters are the clusters that judge the pass's API server. They
// share the cache's objects (every decision of a burst asks): read only.
func (p *pass) judgingClusters(ctx context.Context) ([]ichorv1alpha1.TalosCluster, error) {
	if !p.target.local {
		return []ichorv1alpha1.TalosCluster{*p.cluster}, nil
	}
	var enabled ichorv1alpha1.TalosClusterList
	if err := p.r.Client.List(ctx, &enabled, client.MatchingFields{IndexServingEnabled: "true"}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list enabled clusters: %w", err)
	}
	var judges []ichorv1alpha1.TalosCluster
	for _, c := range enabled.Items {
		if c.Spec.KubeconfigRef == nil && p.r.LocalClusters.Judges(&c) {
			judges = append(judges, c)
		}
	}
	return judges, nil
}

// judgedNodeNames are the node names the machines of the judging clusters
// answer to, and how many machines those are.
func (p *pass) judgedNodeNames(ctx context.Context, judges []ichorv1alpha1.TalosCluster) (map[string]bool, int, error) {
	names := map[string]bool{}
	count := 0
	for _, c := range judges {
		var list ichorv1alpha1.TalosMachineList
		if err := p.r.Client.List(ctx, &list, client.InNamespace(c.Namespace), client.MatchingFields{IndexCluster: c.Name}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, 0, fmt.Errorf("count the machines of cluster %s/%s: %w", c.Namespace, c.Name, err)
		}
		count += len(list.Items)
		for i := range list.Items {
			for _, n := range machines.NodeNames(&list.Items[i]) {
				names[n] = true
			}
		}
	}
	return names, count, nil
}

// newer reports whether a was created after b (the name breaks a tie: the
// API server's timestamps have whole seconds).
func newer(a, b *certificatesv1.CertificateSigningRequest) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

// oldestFirst orders requests by creation, then by name.
func oldestFirst(a, b certificatesv1.CertificateSigningRequest) int {
	switch {
	case newer(&b, &a):
		return -1
	case newer(&a, &b):
		return 1
	}
	return cmp.Compare(a.Name, b.Name)
}
