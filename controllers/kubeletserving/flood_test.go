package kubeletserving_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// rejectionGates hold the rejection decisions of the machines a test names
// until it opens their gate, so that a test can hold a requester's flood in
// the middle and see what else is decided meanwhile.
type rejectionGates struct {
	mu    sync.Mutex
	gates map[string]chan struct{}
	held  map[string]int
}

func (g *rejectionGates) hold(ctx context.Context, in csrinput.KubeletServing) (engine.CSRDecision, error) {
	if in.Machine == nil {
		return engine.CSRDecision{}, enginetest.ErrPass
	}
	g.mu.Lock()
	gate, ok := g.gates[in.Machine.Name]
	if ok {
		g.held[in.Machine.Name]++
	}
	g.mu.Unlock()
	if ok {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return engine.CSRDecision{}, enginetest.ErrPass
}

func (g *rejectionGates) close(machine string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gate, ok := g.gates[machine]; ok {
		close(gate)
		delete(g.gates, machine)
	}
}

func (g *rejectionGates) shut(t *testing.T, machine string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates == nil {
		g.gates, g.held = map[string]chan struct{}{}, map[string]int{}
	}
	g.gates[machine] = make(chan struct{})
	t.Cleanup(func() { g.close(machine) })
}

func (g *rejectionGates) heldCount(machine string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held[machine]
}

// A node credential that creates requests without end gets at most
// max_undecided_per_requester (5) of them decided on their merits, the
// newest; every older one is denied TooManyRequests without a Talos read.
// Its requests are decided one at a time, so while its flood is held in the
// middle another node of the same cluster is approved.
func TestAFloodFromOneNodeIsBoundedAndHoldsUpNoOtherNode(t *testing.T) {
	f := newFixture(t, false)
	f.machine("calm-1", "10.42.0.3")
	gates.shut(t, "flood-1")

	flooder := nodeClient(t, "system:node:flood-1", "system:nodes")
	const flood = 30
	var names []string
	for i := range flood {
		names = append(names, submit(t, flooder, fmt.Sprintf("flood-1-%02d", i), csrgen.Request{
			Subject: csrgen.NodeSubject("flood-1"), IPs: []net.IP{net.ParseIP("10.42.0.2")},
		}))
	}
	// The machine comes last, so that the flood is whole when the rejection
	// is first asked, not decided one by one as it arrives. Until then each
	// request is left pending (MachineUnknown), whatever a pass that looks
	// at it again finds: a request for a name no machine has is never
	// denied (ADR 0125). Neither costs a read.
	// Each left pending once is in the manager's cache: the machine's event
	// could otherwise come before the last requests' under load, and a
	// request judged then, finding fewer newer ones, would be read and
	// denied by the decision, not the rejection (seen once in a run of the
	// whole package).
	for _, name := range names {
		loggedPending(t, name, "MachineUnknown")
	}
	f.machine("flood-1", "10.42.0.2")
	// The flood is held at its first rejection...
	require.Eventually(t, func() bool { return gates.heldCount("flood-1") > 0 }, wait, 50*time.Millisecond)

	// ...and the calm node's request is decided meanwhile.
	calm := submit(t, nodeClient(t, "system:node:calm-1", "system:nodes"), "calm-1", csrgen.Request{
		Subject: csrgen.NodeSubject("calm-1"), IPs: []net.IP{net.ParseIP("10.42.0.3")},
	})
	c := decided(t, calm)
	assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
	assert.Equal(t, 1, gates.heldCount("flood-1"), "one request of the flood at a time")

	gates.close("flood-1")
	for _, name := range names {
		decided(t, name)
	}

	// The newest five were decided on their merits; every other was denied
	// without a Talos read: by the rejection once its machine was known, by
	// the decision before that.
	csrs := make([]*certificatesv1.CertificateSigningRequest, 0, flood)
	for _, name := range names {
		csrs = append(csrs, env.GetCSR(t, name))
	}
	sort.Slice(csrs, func(i, j int) bool {
		a, b := csrs[i], csrs[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	for i, csr := range csrs {
		v := harness.Verdict(csr)
		if i >= flood-5 {
			assert.Equal(t, certificatesv1.CertificateApproved, v.Type, "%s, one of the newest five: %s", csr.Name, v.Message)
			continue
		}
		assert.Equal(t, certificatesv1.CertificateDenied, v.Type, "%s: %s", csr.Name, v.Message)
		assert.Equal(t, "TooManyRequests", v.Reason, csr.Name)
		entries := entriesFor(csr.Name)
		require.NotEmpty(t, entries, csr.Name)
		if last := entries[len(entries)-1]; len(last.Input.Machine) > 0 {
			assert.Equal(t, engine.PathKubeletServingRejection, last.Path, "%s was denied as a rejection once its machine was known", csr.Name)
		}
		for _, e := range entries {
			assert.Empty(t, e.Input.Node, "%s was decided without a Talos read", csr.Name)
		}
	}
}

// When the API server holds more undecided requests that Ichor could approve
// than its machines explain, nothing is approved: a request that passes
// every check stays pending (TooManyPendingRequests), the cluster says so in
// its condition KubeletServingRequests and the metric
// ichor_kubelet_serving_flood_guard is 1, until a person clears the flood.
// The flood here is of machines' own nodes, whose Talos API cannot be read,
// each within its own limit: the test bundle has no allowance per machine, so
// that these are more than the machines explain.
func TestAFloodOfUndecidedRequestsWithholdsApprovalsUntilItIsCleared(t *testing.T) {
	f := newFixture(t, false)
	f.machine("held-1", "10.43.0.2")

	var flood []string
	for u := range 5 {
		stuck := fmt.Sprintf("stuck-%d", u)
		f.addMachine(stuck, "127.0.0.1:1")
		cs := nodeClient(t, "system:node:"+stuck, "system:nodes")
		for i := range 5 {
			flood = append(flood, submit(t, cs, fmt.Sprintf("%s-%d", stuck, i), csrgen.Request{
				Subject: csrgen.NodeSubject(stuck), IPs: []net.IP{net.ParseIP("10.43.1.2")},
			}))
		}
	}
	require.Greater(t, len(flood), floodAllowance)
	for _, name := range flood {
		loggedPending(t, name, "NodeUnreadable")
	}

	held := submit(t, nodeClient(t, "system:node:held-1", "system:nodes"), "held-1", csrgen.Request{
		Subject: csrgen.NodeSubject("held-1"), IPs: []net.IP{net.ParseIP("10.43.0.2")},
	})
	loggedPending(t, held, "TooManyPendingRequests")
	c := f.waitCondition(ichorv1alpha1.ConditionKubeletServingRequests, metav1.ConditionFalse)
	assert.Equal(t, ichorv1alpha1.ReasonTooManyPendingRequests, c.Reason)
	assert.Contains(t, c.Message, "nothing is approved until a person looks")
	require.Eventually(t, func() bool { return floodGuard(t, f.ns) == 1 }, wait, 100*time.Millisecond, "the flood guard's metric is not 1")
	// Whoever may create a CSR made the flood: Ready, which GitOps tools
	// gate on, is not theirs to turn. The cluster is served as configured;
	// KubeletServingRequests and the flood guard's alert say what is wrong.
	ready := f.readyWhen(ichorv1alpha1.ConditionKubeletServingRequests, metav1.ConditionFalse, "withheld")
	assert.Equal(t, metav1.ConditionTrue, ready.Status, "a flood made Ready %s: %s", ready.Status, ready.Message)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// A person deletes the flood and the machines that cannot be read: the
	// request is approved, and the cluster says the requests are within
	// bounds again.
	for _, name := range flood {
		require.NoError(t, env.Clientset.CertificatesV1().CertificateSigningRequests().Delete(f.ctx, name, metav1.DeleteOptions{}))
	}
	for u := range 5 {
		require.NoError(t, env.Client.Delete(f.ctx, &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: fmt.Sprintf("stuck-%d", u)}}))
	}
	v := decided(t, held)
	assert.Equal(t, certificatesv1.CertificateApproved, v.Type, v.Message)
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingRequests, metav1.ConditionTrue)
	require.Eventually(t, func() bool { return floodGuard(t, f.ns) == 0 }, wait, 100*time.Millisecond)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)
}

// Whoever holds a bootstrap token (every worker's machine config has it) has
// kube-controller-manager issue a node identity for any name, and each such
// identity may have five undecided serving requests. 200 requests for names
// no machine has (40 identities, five each: ten times the test bundle's
// allowance) are left pending, each with one decision, and withhold nothing:
// a real node that comes after them is approved. A machine's change does not
// decide them again.
func TestRequestsForUnknownNamesDoNotHoldUpARealNode(t *testing.T) {
	f := newFixture(t, false)

	var flood []string
	for u := range 40 {
		ghost := fmt.Sprintf("ghost-%02d", u)
		cs := nodeClient(t, "system:node:"+ghost, "system:nodes")
		for i := range 5 {
			flood = append(flood, submit(t, cs, fmt.Sprintf("%s-%d", ghost, i), csrgen.Request{
				Subject: csrgen.NodeSubject(ghost), IPs: []net.IP{net.ParseIP("10.44.1.2")},
			}))
		}
	}
	require.Len(t, flood, 200)
	require.Greater(t, len(flood), floodAllowance)
	for _, name := range flood {
		loggedPending(t, name, "MachineUnknown")
	}
	// The real node's machine comes after them (a machine change), and then
	// its request.
	f.machine("real-1", "10.44.0.2")
	real := submit(t, nodeClient(t, "system:node:real-1", "system:nodes"), "real-1", csrgen.Request{
		Subject: csrgen.NodeSubject("real-1"), IPs: []net.IP{net.ParseIP("10.44.0.2")},
	})
	v := decided(t, real)
	assert.Equal(t, certificatesv1.CertificateApproved, v.Type, v.Message)
	entries := entriesFor(real)
	require.NotEmpty(t, entries)
	last := entries[len(entries)-1]
	require.NotNil(t, last.Input.Requests)
	assert.GreaterOrEqual(t, last.Input.Requests.Unknown, 200, "the decision saw the requests for unknown names, counted apart")
	assert.Less(t, last.Input.Requests.Undecided, floodAllowance)

	f.waitCondition(ichorv1alpha1.ConditionKubeletServingRequests, metav1.ConditionTrue)
	assert.Equal(t, float64(0), floodGuard(t, f.ns), "the flood guard is not tripped")
	for _, name := range flood {
		assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "%s stays pending", name)
	}
	// They are the person's to clear; the next tests' guards need them gone.
	for _, name := range flood {
		require.NoError(t, env.Clientset.CertificatesV1().CertificateSigningRequests().Delete(f.ctx, name, metav1.DeleteOptions{}))
	}
}

// floodGuard is the value of ichor_kubelet_serving_flood_guard for the
// namespace's cluster demo; -1 when it has none.
func floodGuard(t *testing.T, namespace string) float64 {
	t.Helper()
	v, ok := metricValue(t, "ichor_kubelet_serving_flood_guard", map[string]string{"namespace": namespace, "cluster": "demo"})
	if !ok {
		return -1
	}
	return v
}

// A requester's newer requests count once they are decided too, so the order
// requests are judged in cannot save an old one: here the five newer requests
// of a node are denied by a person while the oldest waits for its machine,
// and when the machine comes the oldest is still one of the flood's oldest
// (TooManyRequests), not judged on its merits as if it were the newest.
func TestAnOldRequestStaysOldOnceTheNewerAreDecided(t *testing.T) {
	f := newFixture(t, false)
	node := nodeClient(t, "system:node:late-1", "system:nodes")
	req := csrgen.Request{Subject: csrgen.NodeSubject("late-1"), IPs: []net.IP{net.ParseIP("10.45.0.2")}}
	oldest := submit(t, node, "late-1-0", req)
	loggedPending(t, oldest, "MachineUnknown")
	for i := 1; i <= 5; i++ {
		name := submit(t, node, fmt.Sprintf("late-1-%d", i), req)
		denyByHand(t, name)
	}
	f.machine("late-1", "10.45.0.2")
	requireDenied(t, oldest, "TooManyRequests")
}

// denyByHand denies a CSR as the cluster's admin would with kubectl, retrying
// on a conflict with the approver's own write.
func denyByHand(t *testing.T, name string) {
	t.Helper()
	csrs := env.Clientset.CertificatesV1().CertificateSigningRequests()
	require.Eventually(t, func() bool {
		csr, err := csrs.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if harness.Verdict(csr) != nil {
			return true
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateDenied, Status: "True", Reason: "DeniedByHand", Message: "a person denied it",
		})
		_, err = csrs.UpdateApproval(t.Context(), name, csr, metav1.UpdateOptions{})
		return err == nil
	}, wait, 50*time.Millisecond, "deny %s", name)
}
