package kubeletserving

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

func csrOf(user, name string, created time.Time) certificatesv1.CertificateSigningRequest {
	return certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Username: user, SignerName: certificatesv1.KubeletServingSignerName},
	}
}

// A requester's requests are listed oldest first (the name breaks a tie),
// and only that requester's.
func TestARequestersRequestsAreListedOldestFirst(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var csrs []certificatesv1.CertificateSigningRequest
	for i := range 4 {
		// Created newest first, as a cache may list them.
		csrs = append(csrs, csrOf("system:node:flood", string(rune('d'-i)), t0.Add(time.Duration(3-i)*time.Second)))
	}
	csrs = append(csrs, csrOf("system:node:flood", "0", t0.Add(3*time.Second)), csrOf("system:node:calm", "z", t0))
	f := newQueueFixture(t, clock.RealClock{}, csrs...)
	p, ok, err := f.r.passFor(context.Background(), f.cluster)
	require.NoError(t, err)
	require.True(t, ok)
	list, err := p.requestsOf(context.Background(), "system:node:flood")
	require.NoError(t, err)
	var got []string
	for _, c := range list {
		got = append(got, c.Name)
	}
	assert.Equal(t, []string{"a", "b", "c", "0", "d"}, got)
}

func TestNewerBreaksTiesByName(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	a, b := csrOf("u", "csr-a", t0), csrOf("u", "csr-b", t0)
	if !newer(&b, &a) || newer(&a, &b) {
		t.Fatal("within one second, the name orders the requests")
	}
	c := csrOf("u", "csr-0", t0.Add(time.Second))
	if !newer(&c, &b) {
		t.Fatal("a later second is newer, whatever the name")
	}
}

func TestOnlyUndecidedKubeletServingRequestsAreCounted(t *testing.T) {
	c := csrOf("system:node:x", "a", time.Unix(0, 0))
	if got := undecidedKeys(&c); !slices.Equal(got, []string{undecidedAll, "user:system:node:x", "made-by:system:node:x"}) {
		t.Fatalf("keys %v", got)
	}
	approved := c
	approved.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved}}
	denied := c
	denied.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied}}
	issued := c
	issued.Status.Certificate = []byte("x")
	for name, csr := range map[string]*certificatesv1.CertificateSigningRequest{"approved": &approved, "denied": &denied, "issued": &issued} {
		if got := undecidedKeys(csr); !slices.Equal(got, []string{"made-by:system:node:x"}) {
			t.Fatalf("%s: keys %v, want only the requester's: it still counts as newer than an older request", name, got)
		}
	}
	other := c
	other.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	if got := undecidedKeys(&other); got != nil {
		t.Fatalf("another signer: keys %v, want none", got)
	}
}

// The flood counts are listed once, then kept by the events: a request made,
// decided or deleted changes them without a listing, the same event twice
// counts once, each requester counts up to the rule's limit (its requests
// for its own judged node name first), and a change of what they are summed
// on (the judged machines, the limits) sums them again without listing the
// requests.
func TestTheFloodCountsFollowTheEventsAfterOneListing(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	// A test request asks for the node name its spec.request holds.
	nodeOf := func(c *certificatesv1.CertificateSigningRequest) string { return string(c.Spec.Request) }
	cache := map[string]*certificatesv1.CertificateSigningRequest{}
	var f floodCounts
	made := func(name, requester, node string) *certificatesv1.CertificateSigningRequest {
		c := csrOf(requester, name, t0)
		c.UID, c.Spec.Request = types.UID("uid-"+name), []byte(node)
		cache[name] = &c
		f.noteEvent(&c, false, nodeOf)
		return &c
	}
	listed := 0
	list := func() ([]*certificatesv1.CertificateSigningRequest, error) {
		listed++
		var out []*certificatesv1.CertificateSigningRequest
		for _, c := range cache {
			if isUndecided(c) {
				out = append(out, c)
			}
		}
		return out, nil
	}
	judged := map[string]bool{"n1": true, "n2": true}
	namesListed := 0
	names := func() (map[string]bool, int, error) {
		namesListed++
		return judged, len(judged), nil
	}
	basis := countsBasis{limits: engine.KubeletServingLimits{MaxUndecidedPerRequester: 3, NodeUserPrefix: "system:node:"}, names: namesBasis{machineEpoch: 1, judges: "uid/1"}}
	get := func() csrinput.Requests {
		t.Helper()
		got, err := f.get(basis, list, nodeOf, names)
		require.NoError(t, err)
		return got
	}

	a := made("a", "system:node:n1", "n1")
	// Told of before the first count, and deleted since: the listing, which
	// no longer holds it, is what counts.
	gone := made("gone", "system:node:n2", "n2")
	delete(cache, "gone")
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 1}, get(), "first: listed")
	assert.Equal(t, 1, listed)
	f.noteEvent(gone, true, nodeOf)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 1}, get(), "its deletion told of at last")
	// A request told of while the listing was taken is kept once.
	f.mu.Lock()
	f.keep(requestKey(a), undecidedRequest{requester: a.Spec.Username, node: "n1"})
	f.mu.Unlock()
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 1}, get(), "kept twice")

	made("b", "system:node:n2", "n2")
	made("c", "system:node:n2", "n1")                // a node asking for another's name
	ghost := made("d", "system:node:ghost", "ghost") // a name no machine has
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 2, Unknown: 2}, get(), "new requests, from their events")
	f.noteEvent(ghost, false, nodeOf)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 2, Unknown: 2}, get(), "the same event again (a relist)")

	approved := a.DeepCopy()
	approved.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: "True"}}
	cache["a"] = approved
	f.noteEvent(approved, false, nodeOf)
	delete(cache, "d")
	f.noteEvent(ghost, true, nodeOf)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 1, Unknown: 1}, get(), "a request decided, another deleted")
	issued := cache["b"].DeepCopy()
	issued.Status.Certificate = []byte("x")
	cache["b"] = issued
	f.noteEvent(issued, false, nodeOf)
	assert.Equal(t, csrinput.Requests{Machines: 2, Unknown: 1}, get(), "a request holding a certificate")
	// A requester whose requests came and went between two counts is not
	// kept until the next: no count may come (no cluster judges).
	late := made("late", "system:node:late", "late")
	delete(cache, "late")
	f.noteEvent(late, true, nodeOf)
	f.mu.Lock()
	assert.NotContains(t, f.requesters, "system:node:late")
	f.mu.Unlock()

	for i := range 4 {
		made(fmt.Sprintf("flood-%d", i), "system:node:n2", "n2")
	}
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 3}, get(), "n2's up to the limit, those for its own name first")
	assert.Equal(t, 1, listed, "the requests were listed again")
	assert.Equal(t, 1, namesListed, "the judged names were listed again")

	basis.names.machineEpoch++
	judged = map[string]bool{"n1": true}
	assert.Equal(t, csrinput.Requests{Machines: 1, Unknown: 3}, get(), "n2's machine gone: its requests are unknown")
	basis.limits.MaxUndecidedPerRequester = 10
	assert.Equal(t, csrinput.Requests{Machines: 1, Unknown: 5}, get(), "a higher limit")
	assert.Equal(t, 2, namesListed, "a new limit sums again, on the same names")
	// A full pass asks the same names (requestsToLookAt): kept, not listed.
	kept, machines, err := f.judgedNames(basis.names, func() (map[string]bool, int, error) { return nil, 0, assert.AnError })
	require.NoError(t, err)
	assert.Equal(t, map[string]bool{"n1": true}, kept)
	assert.Equal(t, 1, machines)
	basis.names.judges += ";uid2/1"
	judged = map[string]bool{"n1": true, "n2": true}
	kept, _, err = f.judgedNames(basis.names, names)
	require.NoError(t, err)
	assert.Equal(t, judged, kept, "another cluster judging: listed again")
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 4, Unknown: 1}, get(), "another cluster judging")
	assert.Equal(t, 3, namesListed, "the counts sum on the names the full pass listed")
	// A full pass that read which clusters judge before the second did
	// asks the names on that older basis; the counts, on the newer, are
	// summed again on its names, not on the older listing.
	older := basis.names
	older.judges = "uid/1"
	_, _, err = f.judgedNames(older, func() (map[string]bool, int, error) { return map[string]bool{"n1": true}, 1, nil })
	require.NoError(t, err)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 4, Unknown: 1}, get(), "the counts after a full pass asked older names")
	assert.Equal(t, 4, namesListed, "the newer names listed again")
	assert.Equal(t, 1, listed, "the requests were listed again")

	basis.names.machineEpoch++
	_, err = f.get(basis, list, nodeOf, func() (map[string]bool, int, error) { return nil, 0, assert.AnError })
	require.ErrorIs(t, err, assert.AnError)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 4, Unknown: 1}, get(), "a failed listing of the names is listed again")

	var none *floodCounts
	before := listed
	for want := before + 1; want <= before+2; want++ {
		got, err := none.get(basis, list, nodeOf, names)
		require.NoError(t, err)
		assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 4, Unknown: 1}, got)
		assert.Equal(t, want, listed, "no cache: listed every time")
	}
	none.noteEvent(a, false, nodeOf)

	var failed floodCounts
	_, err = failed.get(basis, func() ([]*certificatesv1.CertificateSigningRequest, error) { return nil, assert.AnError }, nodeOf, names)
	require.ErrorIs(t, err, assert.AnError)
	got, err := failed.get(basis, list, nodeOf, names)
	require.NoError(t, err)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 4, Unknown: 1}, got, "a failed listing of the requests is listed again")
}

// Whatever the events, in whatever mix (requests made, decided, deleted,
// made again under their name while the watch was down, for this signer or
// another, told twice), the counts the events keep are those a listing of
// the cache gives; and once the requests are gone, nothing is kept of them.
func TestTheFloodCountsTheEventsKeepAreThoseOfAListing(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 0)) //nolint:gosec // G404: a reproducible sequence of events, not a secret
	nodes := []string{"n0", "n1", "n2", "n3", "ghost"}
	requests := map[string][]byte{}
	for _, n := range nodes {
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject(n)})
		require.NoError(t, err)
		requests[n] = req
	}
	var f floodCounts
	var names nodeNames
	handler := csrEvents(&f, &names, func(context.Context, *certificatesv1.CertificateSigningRequest) {})
	// The events as the source delivers them: through its predicate.
	pred := kubeletServingEvents()
	ctx := context.Background()
	create := func(c *certificatesv1.CertificateSigningRequest) {
		if e := (event.TypedCreateEvent[*certificatesv1.CertificateSigningRequest]{Object: c}); pred.Create(e) {
			handler.Create(ctx, e, nil)
		}
	}
	update := func(old, c *certificatesv1.CertificateSigningRequest) {
		if e := (event.TypedUpdateEvent[*certificatesv1.CertificateSigningRequest]{ObjectOld: old, ObjectNew: c}); pred.Update(e) {
			handler.Update(ctx, e, nil)
		}
	}
	remove := func(c *certificatesv1.CertificateSigningRequest) {
		if e := (event.TypedDeleteEvent[*certificatesv1.CertificateSigningRequest]{Object: c}); pred.Delete(e) {
			handler.Delete(ctx, e, nil)
		}
	}
	cache := map[string]*certificatesv1.CertificateSigningRequest{}
	list := func() ([]*certificatesv1.CertificateSigningRequest, error) {
		var out []*certificatesv1.CertificateSigningRequest
		for _, c := range cache {
			if isKubeletServing(c) && isUndecided(c) {
				out = append(out, c)
			}
		}
		return out, nil
	}
	judged := map[string]bool{"n0": true, "n1": true, "n2": true}
	// The counts keep the map a listing returns, which nothing changes
	// after (floodCounts.names): each listing is a copy of judged.
	namesOf := func() (map[string]bool, int, error) { return maps.Clone(judged), len(judged), nil }
	basis := countsBasis{limits: engine.KubeletServingLimits{MaxUndecidedPerRequester: 3, NodeUserPrefix: "system:node:"}, names: namesBasis{machineEpoch: 1}}
	// One of the cache's requests, chosen by the seed alone (a map's order
	// is not): the logged seed, set in place of the clock's, replays a failure.
	pick := func() *certificatesv1.CertificateSigningRequest {
		names := slices.Sorted(maps.Keys(cache))
		return cache[names[rnd.IntN(len(names))]]
	}
	uid := 0
	for step := range 2000 {
		switch op := rnd.IntN(10); {
		case op < 4 || len(cache) == 0:
			requester, node := nodes[rnd.IntN(len(nodes))], nodes[rnd.IntN(len(nodes))]
			if rnd.IntN(3) > 0 {
				node = requester // mostly a node asking for its own name
			}
			uid++
			c := csrOf("system:node:"+requester, fmt.Sprintf("csr-%d", uid), time.Unix(int64(uid), 0))
			c.UID, c.Spec.Request = types.UID(fmt.Sprintf("uid-%d", uid)), requests[node]
			cache[c.Name] = &c
			create(&c)
		case op < 6:
			old := pick()
			decided := old.DeepCopy()
			condition := []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed}[rnd.IntN(3)]
			decided.Status.Conditions = append(decided.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: condition, Status: "True"})
			cache[old.Name] = decided
			update(old, decided)
		case op < 8:
			old := pick()
			delete(cache, old.Name)
			remove(old)
		case op < 9:
			// Deleted and made again while the watch was down: the relist
			// tells of it as an update.
			old := pick()
			uid++
			again := old.DeepCopy()
			again.UID, again.Status = types.UID(fmt.Sprintf("uid-%d", uid)), certificatesv1.CertificateSigningRequestStatus{}
			again.Spec.Request = requests[nodes[rnd.IntN(len(nodes))]]
			if rnd.IntN(4) == 0 {
				again.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
			}
			cache[old.Name] = again
			update(old, again)
		default:
			// A relist tells of a request as it is.
			c := pick()
			update(c, c)
		}
		if rnd.IntN(50) == 0 {
			basis.names.machineEpoch++
			delete(judged, nodes[rnd.IntN(3)])
			judged[nodes[rnd.IntN(3)]] = true
		}
		if step%7 != 0 {
			continue
		}
		kept, err := f.get(basis, list, names.of, namesOf)
		require.NoError(t, err)
		var fresh floodCounts
		listed, err := fresh.get(basis, list, names.of, namesOf)
		require.NoError(t, err)
		require.Equal(t, listed, kept, "step %d (seed %d)", step, seed)
	}
	for _, c := range cache {
		delete(cache, c.Name)
		remove(c)
	}
	for u, c := range f.requesters {
		assert.Positive(t, c.undecided+c.unknown, "requester %s kept with no requests and nothing to take from the sums", u)
	}
	kept, err := f.get(basis, list, names.of, namesOf)
	require.NoError(t, err)
	assert.Equal(t, csrinput.Requests{Machines: len(judged)}, kept)
	assert.Empty(t, f.requests, "requests kept after they were deleted")
	assert.Empty(t, f.requesters, "requesters kept after their requests were deleted")
	assert.Empty(t, names.m, "node names kept after their requests were deleted")
}

// The counts a decision weighs see the machines as the events left them: a
// machine deleted, one made, another cluster judging. The judged node names
// are kept between counts, so each of these must be in what they are kept
// on.
func TestTheCountsSeeEveryChangeOfTheJudgedMachines(t *testing.T) {
	ctx := context.Background()
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	clusterObj := func(ns, name string) *ichorv1alpha1.TalosCluster {
		c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), Generation: 1}}
		c.Spec.Security.KubeletServingCertificates.Enabled = true
		return c
	}
	machine := func(ns, node, clusterName string) *ichorv1alpha1.TalosMachine {
		m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node, UID: types.UID("uid-" + node)}}
		m.Spec.ClusterName, m.Spec.Hostname = clusterName, node
		return m
	}
	alpha := clusterObj("a", "alpha")
	objs := []client.Object{alpha, clusterObj("b", "beta"), machine("a", "node-1", "alpha"), machine("a", "node-2", "alpha"), machine("b", "node-3", "beta")}
	for i, node := range []string{"node-1", "node-2", "node-3", "node-4"} {
		csr := csrOf("system:node:"+node, "csr-"+node, time.Unix(int64(i), 0))
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject(node)})
		require.NoError(t, err)
		csr.Spec.Request, csr.UID = req, types.UID("uid-csr-"+node)
		objs = append(objs, &csr)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	require.NoError(t, AddIndexes(ctx, indexerOf{b}))
	c := b.Build()
	local, err := cluster.ParseLocal([]string{"a/alpha"})
	require.NoError(t, err)
	r := &Reconciler{Client: c, Engine: &decider{}, LocalClusters: local, Clock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0))}
	for _, o := range objs {
		// The machines as their creation events noted them.
		r.noteMachine(o)
	}
	p := &pass{r: r, cluster: alpha, now: r.Clock.Now(), target: &target{reader: c, local: true, names: &r.localNames, counts: &floodCounts{}}}
	counts := func() csrinput.Requests {
		t.Helper()
		got, err := p.countAll(ctx)
		require.NoError(t, err)
		return got
	}
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 2, Unknown: 2}, counts())

	// Each change as the machine handler notes it (the cache first, then
	// the event).
	gone := machine("a", "node-2", "alpha")
	require.NoError(t, c.Delete(ctx, gone))
	r.machinesDeleted.Add(1)
	r.forgetMachine(gone)
	assert.Equal(t, csrinput.Requests{Machines: 1, Undecided: 1, Unknown: 3}, counts(), "a machine deleted")

	made := machine("a", "node-4", "alpha")
	require.NoError(t, c.Create(ctx, made))
	r.noteMachine(made)
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 2, Unknown: 2}, counts(), "a machine made")

	local.Add(types.NamespacedName{Namespace: "b", Name: "beta"})
	assert.Equal(t, csrinput.Requests{Machines: 3, Undecided: 3, Unknown: 1}, counts(), "another cluster judging")

	// Being deleted, which another controller's finalizer holds, it judges
	// no more: its machines and their requests are no longer counted as
	// judged (review 224 F1; the API server bumps the generation with the
	// deletion, which the fake client does not).
	var beta ichorv1alpha1.TalosCluster
	require.NoError(t, c.Get(ctx, types.NamespacedName{Namespace: "b", Name: "beta"}, &beta))
	beta.Finalizers = []string{"example.com/hold"}
	beta.Generation++
	require.NoError(t, c.Update(ctx, &beta))
	require.NoError(t, c.Delete(ctx, &beta))
	assert.Equal(t, csrinput.Requests{Machines: 2, Undecided: 2, Unknown: 2}, counts(), "another cluster being deleted")
}

// The rule's limits are asked once in limitsTTL, and again at once under a
// new bundle: its limits count from its first decision.
func TestTheLimitsAreAskedAgainOfANewBundle(t *testing.T) {
	d := &revisionDecider{revision: "r1"}
	var c limitsCache
	now := time.Unix(1_000_000, 0)
	get := func(at time.Time) int {
		t.Helper()
		l, err := c.get(t.Context(), d, at)
		require.NoError(t, err)
		return l.MaxUndecidedPerRequester
	}
	assert.Equal(t, 1, get(now))
	assert.Equal(t, 1, get(now.Add(limitsTTL-time.Second)), "kept within the TTL")
	d.revision = "r2"
	assert.Equal(t, 2, get(now.Add(time.Second)), "a new bundle's, at once")
	assert.Equal(t, 2, get(now.Add(2*time.Second)))
	assert.Equal(t, 3, get(now.Add(time.Second+limitsTTL)), "asked again after the TTL")
}
