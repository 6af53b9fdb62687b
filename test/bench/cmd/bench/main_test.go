package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFlagsReplicas(t *testing.T) {
	// On by default: two replicas in eight shards, over the spread's ten
	// clusters, in two rounds.
	o, err := parseFlags([]string{"-manager", "bm"})
	require.NoError(t, err)
	assert.Equal(t, 2, o.Replicas)
	assert.Equal(t, 8, o.Shards)
	assert.Equal(t, 2, o.ReplicaRounds)
	assert.Equal(t, 10, o.ReplicaClusters)
	assert.False(t, o.ReplicasOnly)
	assert.Equal(t, []int{100, 1000, 5000}, o.Growth)

	o, err = parseFlags([]string{"-manager", "bm", "-machines", "500", "-replicas", "3", "-shards", "12",
		"-replica-rounds", "4", "-replicas-only", "-growth", "", "-replica-args", "--shard-lease-duration 15s  --shard-renew-deadline 10s"})
	require.NoError(t, err)
	assert.Equal(t, 500, o.Machines)
	assert.Equal(t, 3, o.Replicas)
	assert.Equal(t, 12, o.Shards)
	assert.Equal(t, 4, o.ReplicaRounds)
	assert.True(t, o.ReplicasOnly)
	assert.Equal(t, []string{"--shard-lease-duration", "15s", "--shard-renew-deadline", "10s"}, o.ReplicaArgs)
	assert.Empty(t, o.Growth)

	o, err = parseFlags([]string{"-manager", "bm", "-replicas", "0"})
	require.NoError(t, err, "off")
	assert.Zero(t, o.Replicas)

	// The spread's -clusters 0 leaves the replicas' own clusters alone.
	o, err = parseFlags([]string{"-manager", "bm", "-clusters", "0"})
	require.NoError(t, err)
	assert.Equal(t, 10, o.ReplicaClusters)

	for want, args := range map[string][]string{
		"-replicas-only needs -replicas 2":            {"-manager", "bm", "-replicas", "1", "-replicas-only"},
		"it needs -replica-clusters 2 or more, not 1": {"-manager", "bm", "-replica-clusters", "1"},
		"-shards 1: at least one shard per replica":   {"-manager", "bm", "-shards", "1"},
		"-manager is required":                        {"-replicas", "2"},
		"not a machine count":                         {"-manager", "bm", "-growth", "10,x"},
		"unexpected arguments":                        {"-manager", "bm", "extra"},
	} {
		_, err := parseFlags(args)
		assert.ErrorContains(t, err, want, args)
	}
}
