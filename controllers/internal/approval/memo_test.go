package approval_test

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
)

var start = time.Unix(1_000_000, 0)

func backoff(initial, limit time.Duration) func(int) time.Duration {
	return approval.Backoff{Initial: initial, Max: limit}.After
}

func TestBackoffDoublesUpToItsCap(t *testing.T) {
	b := approval.Backoff{Initial: 30 * time.Second, Max: 5 * time.Minute}
	var waits []time.Duration
	for attempts := range 7 {
		waits = append(waits, b.After(attempts))
	}
	assert.Equal(t, []time.Duration{
		30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute,
	}, waits)
	assert.Equal(t, 5*time.Minute, b.After(1_000_000), "many attempts neither overflow nor pass the cap")
}

func TestPendingVerdictIsDecidedAgainWhenItsWaitIsOver(t *testing.T) {
	var m approval.Memo[string, string]
	now := start
	v := approval.Verdict{ResourceVersion: "1", Key: "NodeClientNotAuthorized"}
	for i := range 4 {
		_, skip := m.Skip("a", "1", 0, "", now)
		require.False(t, skip, "attempt %d is due", i)
		first, wait := m.Pending("a", v, "worker-1", now, backoff(30*time.Second, 5*time.Minute))
		assert.Equal(t, i == 0, first, "only the first verdict is new")
		assert.Equal(t, (30*time.Second)<<i, wait)

		// Not due before the wait is over: the remaining time is reported.
		left, skip := m.Skip("a", "1", 0, "", now.Add(wait-time.Second))
		require.True(t, skip)
		assert.Equal(t, time.Second, left)
		now = now.Add(wait)
	}
}

func TestANewVerdictStartsTheBackoffAgain(t *testing.T) {
	var m approval.Memo[string, string]
	wait := backoff(time.Second, time.Minute)
	m.Pending("a", approval.Verdict{ResourceVersion: "1", Key: "MachineUnknown"}, "", start, wait)
	_, after := m.Pending("a", approval.Verdict{ResourceVersion: "1", Key: "MachineUnknown"}, "", start, wait)
	require.Equal(t, 2*time.Second, after)

	first, after := m.Pending("a", approval.Verdict{ResourceVersion: "1", Key: "NodeClientNotAuthorized"}, "", start, wait)
	assert.True(t, first)
	assert.Equal(t, time.Second, after)
}

func TestAChangedRequestOrNewMachinesAreDecidedAgainAtOnce(t *testing.T) {
	var m approval.Memo[string, string]
	m.Pending("a", approval.Verdict{ResourceVersion: "1", Epoch: 7, Key: "MachineUnknown"}, "", start, backoff(time.Minute, time.Hour))

	_, skip := m.Skip("a", "1", 7, "", start)
	assert.True(t, skip, "nothing changed")
	_, skip = m.Skip("a", "2", 7, "", start)
	assert.False(t, skip, "the request changed")
	_, skip = m.Skip("a", "1", 8, "", start)
	assert.False(t, skip, "the machines changed")
	_, skip = m.Skip("b", "1", 7, "", start)
	assert.False(t, skip, "another request")
}

// A verdict holds under the bundle it was reached under: another revision
// decides again at once, even a verdict that waits only for a change, and
// breaks a hold.
func TestAnotherBundleDecidesAgainAtOnce(t *testing.T) {
	var m approval.Memo[string, string]
	never := func(int) time.Duration { return 0 }
	m.Pending("a", approval.Verdict{ResourceVersion: "1", Epoch: 7, Revision: "r1", Key: "MachineUnknown"}, "", start, never)
	_, skip := m.Skip("a", "1", 7, "r1", start.Add(24*time.Hour))
	assert.True(t, skip, "the same bundle: only a change wakes it")
	_, skip = m.Skip("a", "1", 7, "r2", start)
	assert.False(t, skip, "another bundle")

	v := approval.Verdict{ResourceVersion: "1", Epoch: 7, Revision: "r1", Key: "NodeUnreadable"}
	m.Pending("b", v, "", start, backoff(time.Minute, time.Hour))
	_, skip = m.Skip("b", "1", 7, "r2", start)
	assert.False(t, skip, "another bundle, before the wait is over")
	other := v
	other.Revision = "r2"
	assert.False(t, m.Hold("b", other, 5*time.Minute, 3*time.Second, start), "another bundle")
	assert.True(t, m.Hold("b", v, 5*time.Minute, 3*time.Second, start), "the same bundle")
	assert.Equal(t, approval.Verdict{ResourceVersion: "1", Epoch: 7, Revision: "r1", Key: "X"}, v.WithKey("X"), "the same facts, another key")
}

func TestAVerdictWithoutATimerWaitsForAChange(t *testing.T) {
	var m approval.Memo[string, string]
	never := func(int) time.Duration { return 0 }
	_, after := m.Pending("a", approval.Verdict{ResourceVersion: "1", Epoch: 3, Key: "MachineUnknown"}, "", start, never)
	require.Zero(t, after)

	wait, skip := m.Skip("a", "1", 3, "", start.Add(24*time.Hour))
	assert.True(t, skip, "no timer: only a change wakes it")
	assert.Zero(t, wait)
	_, skip = m.Skip("a", "1", 4, "", start)
	assert.False(t, skip, "a machine changed")
}

func TestAWrittenVersionIsNotWrittenAgainFromAStaleCache(t *testing.T) {
	var m approval.Memo[string, string]
	m.Applied("a", "1", "worker-1")

	wait, skip := m.Skip("a", "1", 3, "", start)
	assert.True(t, skip, "whatever the epoch")
	assert.Zero(t, wait, "no timer: the write's own update event comes next")
	assert.Empty(t, m.Waiting(func(string) bool { return true }), "a written verdict is not woken by machines")

	_, skip = m.Skip("a", "2", 3, "", start)
	assert.True(t, skip, "an undecided copy of a newer version is stale too: the API server never removes an Approved or Denied condition, and the write may have been made on a newer version than the one decided on")

	first, _ := m.Pending("a", approval.Verdict{ResourceVersion: "2", Key: "X"}, "worker-1", start, backoff(time.Second, time.Minute))
	assert.True(t, first, "a verdict after a write is new")
}

func TestHoldKeepsAnUnchangedVerdictForAWhileOnly(t *testing.T) {
	var m approval.Memo[string, string]
	v := approval.Verdict{ResourceVersion: "1", Epoch: 2, Key: "NodeUnreadable"}
	fixed := func(int) time.Duration { return 3 * time.Second }
	m.Pending("a", v, "", start, fixed)

	require.True(t, m.Hold("a", v, 5*time.Minute, 3*time.Second, start.Add(time.Minute)), "the same verdict, a minute old")
	wait, skip := m.Skip("a", "1", 2, "", start.Add(time.Minute+time.Second))
	assert.True(t, skip)
	assert.Equal(t, 2*time.Second, wait, "held for another 3 s")

	other := v
	other.Epoch = 3
	assert.False(t, m.Hold("a", other, 5*time.Minute, 3*time.Second, start), "the machines changed")
	other = v
	other.Key = "MachineUnknown"
	assert.False(t, m.Hold("a", other, 5*time.Minute, 3*time.Second, start), "another verdict")
	assert.False(t, m.Hold("a", v, 5*time.Minute, 3*time.Second, start.Add(5*time.Minute)), "too old: decide (and log) again")
	assert.False(t, m.Hold("b", v, 5*time.Minute, 3*time.Second, start), "nothing remembered")
}

func TestForgetAndWaiting(t *testing.T) {
	var m approval.Memo[string, string]
	wait := backoff(time.Minute, time.Hour)
	m.Pending("a", approval.Verdict{Key: "MachineUnknown"}, "worker-1", start, wait)
	m.Pending("b", approval.Verdict{Key: "MachineUnknown"}, "worker-2", start, wait)
	m.Pending("c", approval.Verdict{Key: "CommonNameNotNode"}, "", start, wait)

	assert.Equal(t, []string{"worker-1"}, m.Waiting(func(node string) bool { return node == "worker-1" }))
	assert.ElementsMatch(t, []string{"worker-1", "worker-2", ""}, m.Waiting(func(string) bool { return true }))
	assert.True(t, m.Has("b"))

	m.ForgetIf(func(_ string, node string) bool { return node == "worker-1" }, math.MaxUint64)
	m.Forget("b")
	assert.False(t, m.Has("a"))
	assert.False(t, m.Has("b"))
	assert.Equal(t, []string{""}, m.Waiting(func(string) bool { return true }))
}

// A list taken before a worker remembered a request does not have the
// request: forgetting what the list lacks spares what was written after
// the generation taken before it (a request approved meanwhile would be
// decided again from a stale copy).
func TestForgetIfSparesWhatWasWrittenAfterTheList(t *testing.T) {
	var m approval.Memo[string, string]
	wait := backoff(time.Minute, time.Hour)
	m.Pending("old", approval.Verdict{Key: "MachineUnknown"}, "", start, wait)
	upTo := m.Generation()
	m.Applied("approved-meanwhile", "1", "")
	m.Pending("pending-meanwhile", approval.Verdict{Key: "MachineUnknown"}, "", start, wait)

	gone := func(string, string) bool { return true }
	m.ForgetIf(gone, upTo)
	assert.False(t, m.Has("old"), "written before the list, and not in it: gone")
	assert.True(t, m.Has("approved-meanwhile"), "written after the list")
	assert.True(t, m.Has("pending-meanwhile"), "written after the list")

	m.ForgetIf(gone, math.MaxUint64)
	assert.False(t, m.Has("approved-meanwhile"))
	assert.False(t, m.Has("pending-meanwhile"))
}

func TestEpochCountsOnlyChangedState(t *testing.T) {
	var e approval.Epoch
	assert.True(t, e.Note("m1", "ns/demo/worker-1/worker-1"), "a new machine")
	assert.False(t, e.Note("m1", "ns/demo/worker-1/worker-1"), "a status update that keeps its names")
	assert.True(t, e.Note("m1", "ns/demo/worker-9/worker-1"), "a new node name")
	assert.True(t, e.Note("m2", "ns/demo/worker-9/worker-1"), "another machine")
	assert.Equal(t, uint64(3), e.Get())
}

func TestEpochForgetsADeletedObjectWithoutAChange(t *testing.T) {
	var e approval.Epoch
	e.Note("m1", "ns/demo/worker-1/worker-1")
	assert.False(t, e.Forget("m1", "ns/demo/worker-1/worker-1"), "a deletion is no change")
	assert.Equal(t, uint64(1), e.Get())
	assert.True(t, e.Note("m1", "ns/demo/worker-1/worker-1"), "forgotten: seen again, it is new")
	assert.True(t, e.Forget("m1", "ns/demo/worker-2/worker-1"), "a last state not seen before is a change")
	assert.Equal(t, uint64(3), e.Get())
	assert.True(t, e.Note("m1", "ns/demo/worker-2/worker-1"), "forgotten, whatever its last state")
}

// Take forgets and tells, at once: of many takers of one key, one is told
// it was there.
func TestTakeIsTrueForOneTakerOnly(t *testing.T) {
	var m approval.Memo[string, string]
	m.Pending("k", approval.Verdict{Key: "x"}, "", start, backoff(time.Second, time.Minute))
	var told atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if m.Take("k") {
				told.Add(1)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), told.Load())
	assert.False(t, m.Has("k"))
}
