package talosnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Past maxHeld entries, each record sweeps out what no longer matters: a
// success older than a read's timeout, a timeout timeoutKept past its hold.
// A timeout within that is kept, so that its node, read again, goes on with
// its growing hold, and so is a node being tried again (review 214 F4: the
// sweep had no test; review 216 F3).
func TestTheSweepKeepsWhatTheNextReadsNeed(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := &Reader{timeout: 10 * time.Second, holdTimedOut: 3 * time.Second, holdTimedOutMax: time.Minute, clock: func() time.Time { return now }}
	timedOut := errors.New("deadline exceeded")

	r.hold("answers", now, nil, false)
	r.hold("hangs-long-ago", now, timedOut, true)
	r.hold("tried-long", now, timedOut, true)
	now = now.Add(3 * time.Second)
	_, retry := r.beginRead("tried-long")
	require.True(t, retry)
	now = now.Add(timeoutKept + time.Second)
	r.hold("hangs", now, timedOut, true)
	r.hold("hangs", now, timedOut, true)
	for i := range maxHeld {
		r.hold(fmt.Sprintf("other-%d", i), now, timedOut, true)
	}
	// The latest holds are over, within timeoutKept.
	now = now.Add(6*time.Second + time.Minute)
	r.hold("one-more", now, timedOut, true)

	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	assert.NotContains(t, r.held, "answers", "an old success was kept")
	assert.NotContains(t, r.held, "hangs-long-ago", "a timeout past timeoutKept was kept")
	assert.Contains(t, r.held, "tried-long", "a node being tried again was swept")
	require.Contains(t, r.held, "hangs", "a timeout within timeoutKept was swept: its node's hold starts anew")
	assert.Equal(t, 2, r.held["hangs"].timeouts)
}

// A timeout long past its hold says nothing of its node any more (it may
// have answered its watch since, which records nothing here): with fewer
// entries than the sweep waits for, the next reads are first reads again,
// side by side, and the next timeout holds the node HoldTimedOut, not the
// hold it had grown to (review 217 F1).
func TestATimeoutLongPastItsHoldIsForgotten(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := &Reader{timeout: 10 * time.Second, holdTimedOut: 3 * time.Second, holdTimedOutMax: time.Minute, clock: func() time.Time { return now }}
	timedOut := errors.New("deadline exceeded")

	r.hold("n", now, timedOut, true)
	now = now.Add(3 * time.Second)
	_, retry := r.beginRead("n")
	require.True(t, retry)
	r.hold("n", now, timedOut, true)
	r.endRetry("n")
	require.Equal(t, 2, r.held["n"].timeouts)

	now = r.held["n"].until.Add(timeoutKept + time.Second)
	for range 2 {
		err, retry := r.beginRead("n")
		require.NoError(t, err, "a read got a timeout of long ago")
		assert.False(t, retry, "a read long after the hold was a retry, the others waiting for it")
	}
	r.hold("n", now, timedOut, true)
	assert.Equal(t, 1, r.held["n"].timeouts)
	assert.Equal(t, now.Add(3*time.Second), r.held["n"].until, "the hold went on growing from long ago")
}

// Reads under way when a node's timeout is held (its own request's and the
// audit's, say) time out too, soon after: they are not timeouts in a row,
// and the hold stays the first (review 217 F5).
func TestReadsUnderWayWhenANodeIsHeldCountAsOneTimeout(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := &Reader{timeout: 10 * time.Second, holdTimedOut: 3 * time.Second, holdTimedOutMax: time.Minute, clock: func() time.Time { return now }}
	timedOut := errors.New("deadline exceeded")

	started := now.Add(-10 * time.Second)
	r.hold("n", started, timedOut, true)
	until := r.held["n"].until
	for i := range 3 {
		now = now.Add(100 * time.Millisecond)
		r.hold("n", started.Add(time.Duration(i+1)*100*time.Millisecond), timedOut, true)
	}
	assert.Equal(t, 1, r.held["n"].timeouts)
	assert.Equal(t, until, r.held["n"].until)
}

// Without a longest hold the hold does not grow, nor shrink by its jitter
// (review 217 F6).
func TestWithoutALongestHoldEveryHoldIsTheFirst(t *testing.T) {
	r := &Reader{holdTimedOut: 3 * time.Second, holdTimedOutMax: 3 * time.Second}
	for n := 1; n <= 50; n++ {
		require.Equal(t, 3*time.Second, r.holdFor(n), "hold %d", n)
	}
	grown := &Reader{holdTimedOut: 3 * time.Second, holdTimedOutMax: time.Minute}
	for n := 1; n <= 50; n++ {
		want := min(3*time.Second<<min(n-1, 10), time.Minute)
		got := grown.holdFor(n)
		assert.LessOrEqual(t, got, want, "hold %d", n)
		assert.GreaterOrEqual(t, got, max(want*9/10, 3*time.Second), "hold %d", n)
	}
}

// A client dials until a node's certificate is verified on one of its
// connections (gRPC tries each address a name resolves to, and a failed
// handshake leaves the next to try), then never again, and accepts no
// other node's handshake (reviews 261 F1, 262 F1 and F2).
func TestAClientKeepsTheFirstNodeItVerified(t *testing.T) {
	dials := 0
	o := &oneConnection{dial: func(context.Context, string) (net.Conn, error) {
		dials++
		return nil, errors.New("dialled")
	}}
	for range 2 {
		_, err := o.dialOnce(t.Context(), "10.5.0.1:50000")
		assert.EqualError(t, err, "dialled", "a dial before any node was verified")
	}
	require.NoError(t, o.verifyOnce(tls.ConnectionState{}))
	assert.ErrorIs(t, o.verifyOnce(tls.ConnectionState{}), errConnectionLost, "a second node's handshake")
	_, err := o.dialOnce(t.Context(), "10.5.0.2:50000")
	assert.ErrorIs(t, err, errConnectionLost)
	assert.Equal(t, 2, dials)
}
