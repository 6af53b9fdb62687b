package kubeletserving

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	if !isUndecided(csr) {
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
// again, so that a pass costs no extra decision (and log entry) of its own.
const limitsTTL = 10 * time.Second

// limitsCache keeps the rule's limits for limitsTTL, and for the bundle
// revision they were asked of: a new bundle's limits count at once.
type limitsCache struct {
	mu       sync.Mutex
	limits   engine.KubeletServingLimits
	asked    time.Time
	revision string
}

func (c *limitsCache) get(ctx context.Context, eng Decider, now time.Time) (engine.KubeletServingLimits, error) {
	revision := approval.ActiveRevision(eng)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.asked.IsZero() && now.Sub(c.asked) < limitsTTL && c.revision == revision {
		return c.limits, nil
	}
	limits, err := eng.KubeletServingLimits(ctx)
	if err != nil {
		return engine.KubeletServingLimits{}, err
	}
	c.limits, c.asked, c.revision = limits, now, revision
	return limits, nil
}

// floodCounts keeps one API server's undecided kubelet serving requests, by
// requester, as its informer's events tell of them, and the counts the rule
// weighs (countAll), so that a count costs the requesters whose requests
// changed since the last, not a listing of every undecided request: a burst
// raises the counts with every request, and listing them for each decision
// made the burst's work grow with the square of its size (7% of the
// manager's CPU at 5,000 machines).
//
// The counts are exact for the events noted: each event is noted before its
// requester is queued (csrEvents), so the worker that decides a request
// finds it counted. The first count lists the undecided requests from the
// cache (seed), since a worker may decide before the informer has told this
// handler of every request it holds; from then on the events keep them. An
// event the listing already holds changes nothing, and one older than it can
// only count a request that is since decided until the event that says so
// follows: a decision is never undone, so no event makes a count lower than
// it is. The zero value is ready; nil lists them for every count.
type floodCounts struct {
	mu sync.Mutex
	// seeded: the undecided requests were listed once; the events keep
	// requests and requesters since.
	seeded bool
	// requests are the undecided requests by key (requestKey), and
	// requesters the same by requester.
	requests   map[string]undecidedRequest
	requesters map[string]*requesterCounts
	// changed are the requesters whose requests changed since the sums.
	changed map[string]bool

	// summed: undecided and unknown were summed on basis, each
	// requester's part in its requesterCounts, with the names listed on
	// basis.names (which a full pass's ask of other names replaces: then
	// they are summed again).
	summed             bool
	basis              countsBasis
	undecided, unknown int
	// named: names are the node names the judging clusters' machines
	// answer to, and machines how many machines those are, listed on
	// namesBasis. A new listing replaces the map, which is never changed:
	// read only.
	named      bool
	namesBasis namesBasis
	names      map[string]bool
	machines   int
}

// undecidedRequest is what the counts know of an undecided request: who made
// it, and the node name it asks for (csrinput.NodeName).
type undecidedRequest struct {
	requester, node string
}

// requesterCounts are one requester's undecided requests, and what they
// added to the sums.
type requesterCounts struct {
	requests int
	// byNode counts its requests by the node name they ask for.
	byNode map[string]int
	// undecided and unknown are its part of the sums.
	undecided, unknown int
}

// countsBasis is what the counts depend on besides the requests: the rule's
// limits and the judged node names.
type countsBasis struct {
	limits engine.KubeletServingLimits
	names  namesBasis
}

// namesBasis is what the judged node names depend on: the machines' node
// names (their epoch: a machine that appears, or changes the names it
// answers to or its cluster, starts a new one), the machines deleted (a
// deletion lowers the rule's limit) and which clusters judge.
type namesBasis struct {
	machineEpoch    uint64
	machinesDeleted uint64
	judges          string
}

// requestKey is the request's UID; a request without one (only a fake
// client makes those) is known by its name, as unique at any one time.
func requestKey(csr *certificatesv1.CertificateSigningRequest) string {
	if csr.UID != "" {
		return string(csr.UID)
	}
	return "name:" + csr.Name
}

// isUndecided says whether the request is one the counts keep: neither
// approved, denied nor failed, and holding no certificate.
func isUndecided(csr *certificatesv1.CertificateSigningRequest) bool {
	return len(csr.Status.Certificate) == 0 && !approval.IsDecided(csr)
}

// noteEvent notes a request's event: an undecided one is kept, with the
// node name nodeName says it asks for, and a decided or deleted one is
// forgotten.
func (f *floodCounts) noteEvent(csr *certificatesv1.CertificateSigningRequest, deleted bool, nodeName func(*certificatesv1.CertificateSigningRequest) string) {
	if f == nil || !isKubeletServing(csr) {
		return
	}
	key := requestKey(csr)
	if deleted || !isUndecided(csr) {
		f.mu.Lock()
		f.forget(key)
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	_, known := f.requests[key]
	f.mu.Unlock()
	if known {
		return
	}
	// Parsed outside the lock: the node name does not change (a request's
	// spec cannot), and keep leaves a request kept meanwhile as it is.
	node := nodeName(csr)
	f.mu.Lock()
	f.keep(key, undecidedRequest{requester: csr.Spec.Username, node: node})
	f.mu.Unlock()
}

// keep adds an undecided request, once; f.mu is held.
func (f *floodCounts) keep(key string, req undecidedRequest) {
	if _, ok := f.requests[key]; ok {
		return
	}
	if f.requests == nil {
		f.requests, f.requesters, f.changed = map[string]undecidedRequest{}, map[string]*requesterCounts{}, map[string]bool{}
	}
	f.requests[key] = req
	c := f.requesters[req.requester]
	if c == nil {
		c = &requesterCounts{byNode: map[string]int{}}
		f.requesters[req.requester] = c
	}
	c.requests++
	c.byNode[req.node]++
	f.changed[req.requester] = true
}

// forget removes a request no longer undecided, if kept; f.mu is held. A
// requester left with none goes at once when it adds nothing to the sums,
// else at the next sum, which takes its part away.
func (f *floodCounts) forget(key string) {
	req, ok := f.requests[key]
	if !ok {
		return
	}
	delete(f.requests, key)
	c := f.requesters[req.requester]
	c.requests--
	if c.byNode[req.node]--; c.byNode[req.node] == 0 {
		delete(c.byNode, req.node)
	}
	if c.requests == 0 && c.undecided == 0 && c.unknown == 0 {
		delete(f.requesters, req.requester)
		delete(f.changed, req.requester)
		return
	}
	f.changed[req.requester] = true
}

// get is the counts on basis. The first lists the undecided requests
// (listUndecided) and keeps them; names lists the judged node names when
// the names kept are not those of basis.names. A failed listing leaves
// nothing behind: the next count lists again.
func (f *floodCounts) get(
	basis countsBasis,
	listUndecided func() ([]*certificatesv1.CertificateSigningRequest, error),
	nodeName func(*certificatesv1.CertificateSigningRequest) string,
	names func() (map[string]bool, int, error),
) (csrinput.Requests, error) {
	if f == nil {
		f = &floodCounts{}
	} else {
		f.mu.Lock()
		defer f.mu.Unlock()
	}
	if !f.seeded {
		// Under the lock, so that no event is noted between the listing
		// and its keeping: every event after it is noted on top of it.
		listed, err := listUndecided()
		if err != nil {
			return csrinput.Requests{}, err
		}
		f.requests, f.requesters, f.changed = nil, nil, nil
		for _, csr := range listed {
			f.keep(requestKey(csr), undecidedRequest{requester: csr.Spec.Username, node: nodeName(csr)})
		}
		f.seeded, f.summed = true, false
	}
	if !f.summed || f.basis != basis || f.namesBasis != basis.names {
		// The names kept may be another basis's since the sums: a full
		// pass asks them on what it read, which may be older or newer.
		if _, _, err := f.judgedNamesLocked(basis.names, names); err != nil {
			return csrinput.Requests{}, err
		}
		f.basis = basis
		f.undecided, f.unknown = 0, 0
		for u, c := range f.requesters {
			f.changed[u] = true
			c.undecided, c.unknown = 0, 0
		}
		f.summed = true
	}
	for u := range f.changed {
		c := f.requesters[u]
		f.undecided -= c.undecided
		f.unknown -= c.unknown
		if c.requests == 0 {
			delete(f.requesters, u)
			continue
		}
		c.undecided, c.unknown = c.part(u, basis.limits, f.names)
		f.undecided += c.undecided
		f.unknown += c.unknown
	}
	clear(f.changed)
	return csrinput.Requests{Machines: f.machines, Undecided: f.undecided, Unknown: f.unknown}, nil
}

// judgedNames is the node names the judging clusters' machines answer to,
// and how many machines those are, on basis: listed (list) when the basis is
// new, the same map until then. Read only. The counts weigh them with every
// decision, and a full pass over K clusters asks them which requests are
// another cluster's (requestsToLookAt). nil lists them for every call.
func (f *floodCounts) judgedNames(basis namesBasis, list func() (map[string]bool, int, error)) (map[string]bool, int, error) {
	if f == nil {
		return list()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.judgedNamesLocked(basis, list)
}

// judgedNamesLocked is judgedNames; f.mu is held (or f is no one else's).
// A failed listing keeps nothing: the next call lists again.
func (f *floodCounts) judgedNamesLocked(basis namesBasis, list func() (map[string]bool, int, error)) (map[string]bool, int, error) {
	if f.named && f.namesBasis == basis {
		return f.names, f.machines, nil
	}
	names, machines, err := list()
	if err != nil {
		return nil, 0, err
	}
	f.names, f.machines, f.namesBasis, f.named = names, machines, basis, true
	return names, machines, nil
}

// part is what requester's undecided requests add to the counts: up to the
// rule's limit of them (beyond it the rule denies them, so one node's flood
// does not make every node's look like one), those a judged node makes for
// its own node name as undecided first, the rest as unknown.
func (c *requesterCounts) part(requester string, limits engine.KubeletServingLimits, names map[string]bool) (undecided, unknown int) {
	counted := max(0, min(c.requests, limits.MaxUndecidedPerRequester))
	own := 0
	if node, ok := strings.CutPrefix(requester, limits.NodeUserPrefix); ok && node != "" && names[node] {
		own = c.byNode[node]
	}
	undecided = min(own, counted)
	return undecided, counted - undecided
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
		if isUndecided(other) {
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
// floodCounts keeps them as its events come (see there).
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
	names, judges, err := p.judgedNamesBasis(ctx)
	if err != nil {
		return csrinput.Requests{}, err
	}
	return p.target.counts.get(countsBasis{limits: limits, names: names}, func() ([]*certificatesv1.CertificateSigningRequest, error) {
		var all certificatesv1.CertificateSigningRequestList
		if err := p.target.reader.List(ctx, &all, client.MatchingFields{IndexUndecided: undecidedAll}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("count the undecided requests: %w", err)
		}
		listed := make([]*certificatesv1.CertificateSigningRequest, len(all.Items))
		for i := range all.Items {
			listed[i] = &all.Items[i]
		}
		return listed, nil
	}, p.target.names.of, func() (map[string]bool, int, error) {
		return p.judgedNodeNames(ctx, judges)
	})
}

// judgedNamesBasis is what the judged node names of the pass's API server
// depend on now (namesBasis), and the clusters that judge it.
func (p *pass) judgedNamesBasis(ctx context.Context) (namesBasis, []*ichorv1alpha1.TalosCluster, error) {
	judges, err := p.judgingClusters(ctx)
	if err != nil {
		return namesBasis{}, nil, err
	}
	// The machines' epoch and deletions are read before anything is
	// listed: what is listed is never older than they say.
	basis := namesBasis{machineEpoch: p.r.machineEpoch.Get(), machinesDeleted: p.r.machinesDeleted.Load()}
	ids := make([]string, 0, len(judges))
	for _, c := range judges {
		ids = append(ids, fmt.Sprintf("%s/%d", c.UID, c.Generation))
	}
	// The cache lists them in no set order.
	slices.Sort(ids)
	basis.judges = strings.Join(ids, ";")
	return basis, judges, nil
}

// judgedNames is the node names the machines of the clusters judging the
// pass's API server answer to, read only: kept between calls while their
// basis holds (floodCounts.judgedNames).
func (p *pass) judgedNames(ctx context.Context) (map[string]bool, error) {
	basis, judges, err := p.judgedNamesBasis(ctx)
	if err != nil {
		return nil, err
	}
	names, _, err := p.target.counts.judgedNames(basis, func() (map[string]bool, int, error) {
		return p.judgedNodeNames(ctx, judges)
	})
	return names, err
}

// judgingClusters are the clusters that judge the pass's API server. They
// share the cache's objects (every decision of a burst asks): read only.
func (p *pass) judgingClusters(ctx context.Context) ([]*ichorv1alpha1.TalosCluster, error) {
	if !p.target.local {
		return []*ichorv1alpha1.TalosCluster{p.cluster}, nil
	}
	var enabled ichorv1alpha1.TalosClusterList
	if err := p.r.Client.List(ctx, &enabled, client.MatchingFields{IndexServed: "true"}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list enabled clusters: %w", err)
	}
	judges := make([]*ichorv1alpha1.TalosCluster, 0, len(enabled.Items))
	for i := range enabled.Items {
		if c := &enabled.Items[i]; c.Spec.KubeconfigRef == nil && p.r.LocalClusters.Judges(c) {
			judges = append(judges, c)
		}
	}
	return judges, nil
}

// judgedNodeNames are the node names the machines of the judging clusters
// answer to, and how many machines those are.
func (p *pass) judgedNodeNames(ctx context.Context, judges []*ichorv1alpha1.TalosCluster) (map[string]bool, int, error) {
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
