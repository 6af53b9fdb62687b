package shard_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ichor-dev/ichor-policy/internal/shard"
)

const shards = 64

func owners(live []string) map[int]string {
	out := map[int]string{}
	for s := range shards {
		out[s] = shard.Owner(live, s)
	}
	return out
}

// A replica that leaves gives up its own shards and no other moves; one that
// joins takes shards only for itself.
func TestRendezvousMovesOnlyTheShardsOfTheReplicaThatComesOrGoes(t *testing.T) {
	three := owners([]string{"a", "b", "c"})
	two := owners([]string{"a", "c"})
	counts := map[string]int{}
	for s := range shards {
		counts[three[s]]++
		if three[s] != "b" {
			assert.Equal(t, three[s], two[s], "shard %d moved though its holder stayed", s)
		} else {
			assert.NotEqual(t, "b", two[s])
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		assert.Greater(t, counts[id], shards/6, "replica %s has too few of %d shards: %v", id, shards, counts)
	}
	four := owners([]string{"a", "b", "c", "d"})
	for s := range shards {
		if four[s] != three[s] {
			assert.Equal(t, "d", four[s], "shard %d moved to a replica that did not join", s)
		}
	}
	// The order the replicas are listed in does not matter.
	assert.Equal(t, three, owners([]string{"c", "a", "b"}))
	assert.Empty(t, shard.Owner(nil, 0))
}

// Clusters spread over the shards, each always in the same one.
func TestAClusterHasOneShardByItsUID(t *testing.T) {
	per := map[int]int{}
	for range 6400 {
		uid := uuid.NewUUID()
		s := shard.Of(uid, shards)
		require.Equal(t, s, shard.Of(uid, shards))
		require.GreaterOrEqual(t, s, 0)
		require.Less(t, s, shards)
		per[s]++
	}
	for s := range shards {
		assert.Greater(t, per[s], 50, "shard %d: %d of 6400 clusters", s, per[s])
	}
	assert.Equal(t, 0, shard.Of(types.UID("anything"), 1))
}

// The timings must let a replica stop serving before the others can see its
// membership expire.
func TestTimingsThatWouldLetTwoReplicasServeAShardAreRefused(t *testing.T) {
	base := shard.Options{Client: fake.NewClientset(), Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}
	_, err := shard.New(base)
	require.NoError(t, err)
	for name, change := range map[string]func(*shard.Options){
		"lease not above deadline and retry": func(o *shard.Options) { o.LeaseDuration = 2500 * time.Millisecond },
		"no shards":                          func(o *shard.Options) { o.Shards = 0 },
		"a lease of a fraction of a second":  func(o *shard.Options) { o.LeaseDuration = 3500 * time.Millisecond },
		"no namespace":                       func(o *shard.Options) { o.Namespace = "" },
		"no identity":                        func(o *shard.Options) { o.Identity = "" },
	} {
		o := base
		change(&o)
		_, err := shard.New(o)
		assert.Error(t, err, name)
	}
	assert.Regexp(t, `^ichor-policy-member-[0-9a-f]{16}$`, shard.MemberLeaseName("ichor-policy-7d9c-x/y"))
	assert.Equal(t, "ichor-policy-shard-4-7", shard.ShardLeaseName(4, 7))
}
