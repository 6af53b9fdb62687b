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
	assert.Equal(t, int64(5), g.toRestore(0, g.raisedCount()))
}

// The refresh restores nothing from a read made before an activation's
// recording that ended since, nor during one (review 180): that recording
// raised the record itself, and the refresh's read was only older.
func TestARecordReadBeforeAnActivationsRaiseIsNotRestored(t *testing.T) {
	g := &epochGuard{enforce: true}
	g.setActive(4)
	before := g.raisedCount()
	done := g.raising()
	assert.Zero(t, g.toRestore(0, before), "restored during the activation's own raise")
	done()
	assert.Zero(t, g.toRestore(0, before), "restored from a read older than the activation's raise")
	assert.Equal(t, int64(4), g.toRestore(0, g.raisedCount()), "a record read after it, and low, is restored")
	assert.Zero(t, g.toRestore(4, g.raisedCount()), "a record at the epoch in service is left")
	assert.Zero(t, (&epochGuard{}).toRestore(0, 0), "an unsigned source vouches for no epoch")
}
