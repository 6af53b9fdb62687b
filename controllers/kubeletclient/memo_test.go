package kubeletclient

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ichor-dev/ichor-policy/engine"
)

func memoCSR(uid, rv string) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{
		Name: "csr-" + uid, UID: types.UID(uid), ResourceVersion: rv,
	}}
}

func pendingWith(codes ...string) engine.CSRDecision {
	d := engine.CSRDecision{Action: engine.ActionPending}
	for _, c := range codes {
		d.Reasons = append(d.Reasons, engine.Reason{Code: c})
	}
	return d
}

func TestPendingVerdictIsRecheckedWithDoublingBackoffUpToTheCap(t *testing.T) {
	var m verdictMemo
	now := time.Unix(1_000_000, 0)
	csr := memoCSR("a", "1")
	d := pendingWith("NodeClientNotAuthorized")

	var waits []time.Duration
	for i := range 6 {
		_, skip := m.skip(csr, 0, now)
		require.False(t, skip, "attempt %d is due", i)
		first, wait := m.pending(csr, "worker-1", 0, d, now, 30*time.Second, 5*time.Minute)
		assert.Equal(t, i == 0, first, "only the first verdict is new")
		waits = append(waits, wait)

		// Not due before the wait is over: the remaining time is reported.
		left, skip := m.skip(csr, 0, now.Add(wait-time.Second))
		require.True(t, skip)
		assert.Equal(t, time.Second, left)
		now = now.Add(wait)
	}
	assert.Equal(t, []time.Duration{
		30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute,
	}, waits)
}

func TestNewVerdictRestartsTheBackoff(t *testing.T) {
	var m verdictMemo
	now := time.Unix(1_000_000, 0)
	csr := memoCSR("a", "1")
	m.pending(csr, "worker-1", 0, pendingWith("MachineUnknown"), now, time.Second, time.Minute)
	_, wait := m.pending(csr, "worker-1", 0, pendingWith("MachineUnknown"), now, time.Second, time.Minute)
	require.Equal(t, 2*time.Second, wait)

	first, wait := m.pending(csr, "worker-1", 0, pendingWith("NodeClientNotAuthorized"), now, time.Second, time.Minute)
	assert.True(t, first)
	assert.Equal(t, time.Second, wait)
}

func TestChangedRequestOrMachinesAreDecidedAgainAtOnce(t *testing.T) {
	var m verdictMemo
	now := time.Unix(1_000_000, 0)
	m.pending(memoCSR("a", "1"), "worker-1", 7, pendingWith("MachineUnknown"), now, time.Minute, time.Hour)

	_, skip := m.skip(memoCSR("a", "1"), 7, now)
	assert.True(t, skip, "nothing changed")
	_, skip = m.skip(memoCSR("a", "2"), 7, now)
	assert.False(t, skip, "the request changed")
	_, skip = m.skip(memoCSR("a", "1"), 8, now)
	assert.False(t, skip, "the machines changed")
	_, skip = m.skip(memoCSR("b", "1"), 7, now)
	assert.False(t, skip, "another request")
}

func TestApprovedVersionIsNotApprovedAgainFromAStaleCache(t *testing.T) {
	var m verdictMemo
	now := time.Unix(1_000_000, 0)
	m.approved(memoCSR("a", "1"), "worker-1")

	wait, skip := m.skip(memoCSR("a", "1"), 3, now)
	assert.True(t, skip)
	assert.Zero(t, wait, "no timer: the approval's own update event comes next")
	assert.Empty(t, m.pendingFor("worker-1"), "an approved request is not woken by machines")

	_, skip = m.skip(memoCSR("a", "2"), 3, now)
	assert.False(t, skip, "a newer version is looked at")
}

func TestMachinesWakeOnlyThePendingRequestsForTheirNames(t *testing.T) {
	var m verdictMemo
	now := time.Unix(1_000_000, 0)
	m.pending(memoCSR("a", "1"), "worker-1", 0, pendingWith("MachineUnknown"), now, time.Minute, time.Hour)
	m.pending(memoCSR("b", "1"), "worker-2", 0, pendingWith("MachineUnknown"), now, time.Minute, time.Hour)
	m.pending(memoCSR("c", "1"), "", 0, pendingWith("CommonNameNotNode"), now, time.Minute, time.Hour)

	assert.Equal(t, []string{"csr-a"}, names(m.pendingFor("worker-1", "")))
	assert.ElementsMatch(t, []string{"csr-a", "csr-b", "csr-c"}, names(m.pendingFor()))

	m.forgetName("csr-a")
	m.forget("b")
	assert.Equal(t, []string{"csr-c"}, names(m.pendingFor()))
}

func TestEpochCountsOnlyChangedState(t *testing.T) {
	var e epoch
	assert.True(t, e.note("m1", "ns/demo/worker-1/worker-1"), "a new machine")
	assert.False(t, e.note("m1", "ns/demo/worker-1/worker-1"), "a status update that keeps its names")
	assert.True(t, e.note("m1", "ns/demo/worker-9/worker-1"), "a new node name")
	assert.Equal(t, uint64(2), e.get())
}

func names(reqs []reconcile.Request) []string {
	out := make([]string, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, r.Name)
	}
	return out
}
