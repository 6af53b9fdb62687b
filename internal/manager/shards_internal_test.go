package manager

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// A shard count no replica could serve is refused before anything is made
// of it: each shard is a Lease every replica watches (review 256 F5).
func TestAShardCountOutOfRangeIsRefusedAtStart(t *testing.T) {
	for shards, want := range map[int]string{
		-1:                  "--shards -1 is negative",
		shard.MaxShards + 1: "--shards 1025 is above 1024",
		1 << 30:             "is above 1024",
	} {
		err := setUpSharding(nil, nil, Options{Sharding: Sharding{Shards: shards}})
		require.Error(t, err, shards)
		assert.Contains(t, err.Error(), want)
		assert.True(t, usage.Is(err), "not a usage error: %v", err)
	}
}
