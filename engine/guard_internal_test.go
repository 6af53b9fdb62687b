package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
	assert.False(t, deferred, "a record at the epoch in service is deferred")
	active, deferred = (&epochGuard{}).toRestore(0, 0)
	assert.Zero(t, active, "an unsigned source vouches for no epoch")
	assert.False(t, deferred)
}
