package engine

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The epoch in service never goes down (review 180): a start's read of the
// store after an activation's would otherwise have let check accept, and the
// refresh write back, an epoch below the bundle in service.
func TestTheActiveEpochNeverGoesDown(t *testing.T) {
	g := &epochGuard{enforce: true}
	g.setActive(5)
	g.setActive(3)
	active, _ := g.toRestore(0, g.raisedCount())
	assert.Equal(t, int64(5), active)
}

// The refresh restores nothing from a read made before an activation's
// recording that ended since, nor during one (review 180): that recording
// raised the record itself, and the refresh's read was only older.
func TestARecordReadBeforeAnActivationsRaiseIsNotRestored(t *testing.T) {
	g := &epochGuard{enforce: true}
	g.setActive(4)
	before := g.raisedCount()
	done := g.raising()
	active, deferred := g.toRestore(0, before)
	assert.Zero(t, active, "restored during the activation's own raise")
	assert.True(t, deferred, "a read during a raise said the record is as read (review 188)")
	done()
	active, deferred = g.toRestore(0, before)
	assert.Zero(t, active, "restored from a read older than the activation's raise")
	assert.True(t, deferred, "a read before a raise said the record is as read (review 188)")
	active, deferred = g.toRestore(0, g.raisedCount())
	assert.Equal(t, int64(4), active, "a record read after it, and low, is restored")
	assert.False(t, deferred)
	active, deferred = g.toRestore(4, g.raisedCount())
	assert.Zero(t, active, "a record at the epoch in service is left")
	assert.False(t, deferred, "a record at the epoch in service was deferred")
	active, deferred = (&epochGuard{}).toRestore(0, 0)
	assert.Zero(t, active, "an unsigned source vouches for no epoch")
	assert.False(t, deferred)
}

// A poll's read says the record is fine only if no activation's raise began
// since the read: a raise that failed, and said so, is not followed by the
// older read's word (review 190).
func TestARecordReadBeforeARaiseDoesNotClearTheFailingGauge(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	e := &Engine{guard: &epochGuard{enforce: true}, metrics: m}
	before := e.guard.raisedCount()
	done := e.guard.raising()
	m.epochRecord(true) // the activation's raise failed
	e.recordFine(before)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.EpochRecordFailing()), "cleared during the raise")
	done()
	e.recordFine(before)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.EpochRecordFailing()), "cleared by a read older than the raise")
	e.recordFine(e.guard.raisedCount())
	assert.Zero(t, testutil.ToFloat64(m.EpochRecordFailing()), "a read after the raise, and fine, does not clear it")
}
