package kubeletserving

import (
	"context"
	"fmt"
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

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
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

// The flood counts are taken again after any event that may raise them,
// even one that came while they were being taken; after one that can only
// lower them (or a machine's event), only once they are countsTTL old; and
// whenever what they are taken on changes. A failed count is not kept.
func TestTheFloodCountsAreKeptUntilAnEventMayHaveRaisedThem(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	undecided := csrOf("system:node:a", "new", t0)
	decided := csrOf("system:node:a", "old", t0)
	decided.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: "True"}}
	basis := countsBasis{machineEpoch: 1, judges: "uid/1;"}

	var f floodCounts
	taken := 0
	var during func()
	count := func() (csrinput.Requests, error) {
		taken++
		if during != nil {
			during()
			during = nil
		}
		return csrinput.Requests{Undecided: taken}, nil
	}
	get := func(b countsBasis, machineEvents uint64, now time.Time) int {
		t.Helper()
		got, err := f.get(b, machineEvents, now, count)
		require.NoError(t, err)
		return got.Undecided
	}

	assert.Equal(t, 1, get(basis, 0, t0), "first: counted")
	assert.Equal(t, 1, get(basis, 0, t0.Add(time.Hour)), "no event: kept, however old")

	f.noteEvent(&undecided, false)
	assert.Equal(t, 2, get(basis, 0, t0.Add(time.Hour)), "a new undecided request: counted again")

	f.noteEvent(&decided, false)
	f.noteEvent(&undecided, true)
	assert.Equal(t, 2, get(basis, 0, t0.Add(time.Hour+countsTTL/2)), "a decision and a deletion: kept while young")
	assert.Equal(t, 3, get(basis, 0, t0.Add(time.Hour+countsTTL)), "and counted again once countsTTL old")

	assert.Equal(t, 3, get(basis, 0, t0.Add(2*time.Hour)), "nothing since: kept")
	assert.Equal(t, 4, get(basis, 1, t0.Add(2*time.Hour)), "a machine's event: counted again once old")

	moved := basis
	moved.machineEpoch++
	assert.Equal(t, 5, get(moved, 1, t0.Add(2*time.Hour)), "machines answering to other names: counted again at once")
	judged := moved
	judged.judges += "uid2/1;"
	assert.Equal(t, 6, get(judged, 1, t0.Add(2*time.Hour)), "another judging cluster: counted again at once")

	// A request that arrives while the counts are taken may be missing from
	// them: they are not used after its event.
	during = func() { f.noteEvent(&undecided, false) }
	f.noteEvent(&undecided, false)
	assert.Equal(t, 7, get(judged, 1, t0.Add(2*time.Hour)), "counted, and another request came meanwhile")
	assert.Equal(t, 8, get(judged, 1, t0.Add(2*time.Hour)), "so counted again")
	assert.Equal(t, 8, get(judged, 1, t0.Add(2*time.Hour)), "then kept")

	f.noteEvent(&undecided, false)
	_, err := f.get(judged, 1, t0.Add(3*time.Hour), func() (csrinput.Requests, error) { return csrinput.Requests{}, assert.AnError })
	require.ErrorIs(t, err, assert.AnError)
	assert.Equal(t, 9, get(judged, 1, t0.Add(3*time.Hour)), "a failed count is not kept: counted again")

	var none *floodCounts
	none.noteEvent(&undecided, false)
	for want := 10; want <= 11; want++ {
		got, err := none.get(judged, 1, t0, count)
		require.NoError(t, err)
		assert.Equal(t, want, got.Undecided, "no cache: counted every time")
	}
}

// The judged node names are listed again only when a machine appears,
// changes its names or cluster (a new epoch), is deleted, or the judging
// clusters change: not for each request of a burst.
func TestTheJudgedNodeNamesAreKeptWhileTheMachinesAreAsTheyWere(t *testing.T) {
	var f floodCounts
	listed := 0
	list := func() (map[string]bool, int, error) {
		listed++
		return map[string]bool{fmt.Sprintf("node-%d", listed): true}, listed, nil
	}
	get := func(b namesBasis) int {
		t.Helper()
		names, machines, err := f.judgedNames(b, list)
		require.NoError(t, err)
		require.True(t, names[fmt.Sprintf("node-%d", machines)], "the names and the machines were not taken together")
		return machines
	}
	basis := namesBasis{machineEpoch: 1, judges: "uid/1"}
	assert.Equal(t, 1, get(basis), "first: listed")
	assert.Equal(t, 1, get(basis), "the same machines: kept")

	for _, tc := range []struct {
		name   string
		change func(*namesBasis)
	}{
		{"a machine appeared or answers to another name", func(b *namesBasis) { b.machineEpoch++ }},
		{"a machine was deleted", func(b *namesBasis) { b.machinesDeleted++ }},
		{"another cluster judges", func(b *namesBasis) { b.judges += ";uid2/1" }},
	} {
		before := listed
		tc.change(&basis)
		assert.Equal(t, before+1, get(basis), "%s: not listed again", tc.name)
		assert.Equal(t, before+1, get(basis), "%s: then not kept", tc.name)
	}

	basis.machineEpoch++
	_, _, err := f.judgedNames(basis, func() (map[string]bool, int, error) { return nil, 0, assert.AnError })
	require.ErrorIs(t, err, assert.AnError)
	want := listed + 1
	assert.Equal(t, want, get(basis), "a failed listing was kept")

	var none *floodCounts
	_, first, err := none.judgedNames(basis, list)
	require.NoError(t, err)
	_, second, err := none.judgedNames(basis, list)
	require.NoError(t, err)
	assert.Equal(t, first+1, second, "no cache: listed every time")
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
}
