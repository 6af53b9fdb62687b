package bench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/ichor-policy/internal/shard"
)

// tenClusters are ten clusters of 100 machines each, with UIDs of the
// API server's shape.
func tenClusters() map[types.UID]int {
	out := map[types.UID]int{}
	for i := range 10 {
		out[types.UID(fmt.Sprintf("5f0c6d1e-%04d-4a2b-9c3d-8e7f6a5b4c3d", i))] = 100
	}
	return out
}

// The replicas are named so that the machines split as evenly as the
// clusters' shards allow, and what each is said to serve is what the
// shards give it.
func TestPickIdentitiesSplitsTheMachinesEvenly(t *testing.T) {
	clusters := tenClusters()
	ids, load := pickIdentities(clusters, 2, 8)
	require.Len(t, ids, 2)
	assert.NotEqual(t, ids[0], ids[1])
	assert.Equal(t, 1000, load[0]+load[1])
	assert.LessOrEqual(t, slices.Max(load)-slices.Min(load), 200, "%v", load)

	// The load is what rendezvous hashing over those names gives.
	owner := func(s int) string { return shard.Owner(ids, s) }
	assert.Equal(t, load, replicaLoad(clusters, ids, 8, owner))
	count := replicaClusters(clusters, ids, 8, owner)
	assert.Equal(t, 10, count[0]+count[1])
	assert.Equal(t, []int{load[0] / 100, load[1] / 100}, count)

	// Deterministic: the same clusters, the same names.
	again, _ := pickIdentities(clusters, 2, 8)
	assert.Equal(t, ids, again)

	// A shard held by someone else counts for nobody.
	assert.Equal(t, []int{0, 0}, replicaLoad(clusters, ids, 8, func(int) string { return "gone" }))
}

func TestReplicaArgs(t *testing.T) {
	base := []string{"manager", "--webhook-port", "9443", "--leader-elect", "--shards", "8"}
	assert.Equal(t, append(slices.Clone(base), "--shard-identity", "r0"), replicaArgs(base, "r0", 0))
	// The last --webhook-port wins: the second replica serves its own.
	assert.Equal(t, append(slices.Clone(base), "--shard-identity", "r1", "--webhook-port", "9555"), replicaArgs(base, "r1", 9555))
	assert.Len(t, base, 6, "the base is not changed")
}

func TestReplicaVariants(t *testing.T) {
	one, sharded := ReplicaVariants(2, 8)
	assert.Equal(t, "`ichor manager --leader-elect`", describeVariant(one))
	assert.Equal(t, "2 × `ichor manager --leader-elect --shards 8`", describeVariant(sharded))
	assert.Equal(t, 1, one.Replicas)
	assert.Equal(t, 8, sharded.Shards)
	_, timed := ReplicaVariants(2, 8, "--shard-lease-duration", "15s")
	assert.Equal(t, "2 × `ichor manager --leader-elect --shards 8 --shard-lease-duration 15s`", describeVariant(timed))
}

func TestOptionsValidate(t *testing.T) {
	assert.NoError(t, Options{}.Validate(), "no replicas")
	assert.NoError(t, Options{Replicas: 2, Shards: 8, ReplicaClusters: 10}.Validate())
	assert.ErrorContains(t, Options{Replicas: 3, Shards: 8, ReplicaClusters: 2, Clusters: 10}.Validate(), "-replica-clusters 3 or more")
	assert.ErrorContains(t, Options{Replicas: 2, Shards: 1, ReplicaClusters: 10}.Validate(), "at least one shard per replica")
	assert.ErrorContains(t, Options{ReplicasOnly: true}.Validate(), "-replicas-only needs")
}

// replicaRun is a run of 2 replicas, each with its share, CPU and peak
// RSS.
func replicaRun(v Variant, n, k int, perSecond float64, cpu []time.Duration, rss []uint64, machines []int) Result {
	res := fakeRun(v, n, k, perSecond, 2*time.Second, 0)
	res.Round = 1
	for i := range cpu {
		res.Replicas = append(res.Replicas, Replica{Identity: fmt.Sprintf("r%d", i), Clusters: machines[i] / (n / k), Machines: machines[i],
			CPU: cpu[i], Before: Stats{Metrics: map[string]float64{shardTransitions: 4}},
			After: Stats{VmHWM: rss[i], HeapInusePeak: 10 << 20, Metrics: map[string]float64{shardTransitions: float64(4 + 3*i)}}})
		res.CPU += cpu[i]
	}
	res.After = res.Replicas[0].After
	return res
}

func TestReplicaReport(t *testing.T) {
	one, sharded := ReplicaVariants(2, 8)
	const n, k = 1000, 10
	base := fakeRun(one, n, k, 100, 3*time.Second, 4*time.Millisecond)
	base.Round = 1
	base.After = Stats{VmHWM: 200 << 20, HeapInusePeak: 40 << 20}
	for _, tc := range []struct {
		name      string
		perSecond float64
		cpu       []time.Duration
		rss       []uint64
		verdict   string
	}{
		{"halves", 110, []time.Duration{2 * time.Second, 2200 * time.Millisecond}, []uint64{110 << 20, 100 << 20},
			"(goal about 1/2, at most 0.60: CPU met, RSS met); throughput 1.10x (goal not lower: met); all 2 replicas together 1.05x the CPU."},
		{"no saving", 90, []time.Duration{3 * time.Second, 3 * time.Second}, []uint64{190 << 20, 180 << 20},
			"(goal about 1/2, at most 0.60: CPU **missed** (0.75 > 0.60), RSS **missed** (0.95 > 0.60)); throughput 0.90x (goal not lower: **missed**)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			many := replicaRun(sharded, n, k, tc.perSecond, tc.cpu, tc.rss, []int{500, 500})
			rep := &Report{Options: Options{Machines: n, ReplicaClusters: k, Replicas: 2, Shards: 8, ReplicaRounds: 1}, Runs: []Result{base, many}}
			md := rep.Markdown()
			require.Contains(t, md, "### Beyond one replica: 2 replicas with `--shards 8` against one, N = 1000 machines over 10 TalosClusters")
			assert.Equal(t, "| 1 | `ichor manager --leader-elect` | 1000/1000 | 100.0 (1.00) | 2970 ms | one | 10 / 1000 | 4000 ms (1.00) | 4.00 ms | 200 MiB (1.00) | 40 MiB | – |",
				lineWith(md, "| 1 | `ichor manager --leader-elect` |"))
			first := lineWith(md, "| 1 | 2 × `ichor manager --leader-elect --shards 8` |")
			assert.Contains(t, first, fmt.Sprintf("| r0 | 5 / 500 | %s (%.2f) |", ms(tc.cpu[0]), float64(tc.cpu[0])/float64(4*time.Second)))
			second := lineWith(md, "| | | | | | r1 |")
			assert.Contains(t, second, fmt.Sprintf("| r1 | 5 / 500 | %s (%.2f) | %s |", ms(tc.cpu[1]), float64(tc.cpu[1])/float64(4*time.Second), ms(tc.cpu[1]/500)))
			// The shards that moved during the load: none on r0, three on r1.
			assert.True(t, strings.HasSuffix(first, " | 0 |"), first)
			assert.True(t, strings.HasSuffix(second, " | 3 |"), second)
			verdict := lineWith(md, "- Round 1, 2 replicas against one:")
			assert.Contains(t, verdict, tc.verdict)
			// The replicas' runs are not peers'.
			assert.NotContains(t, md, "### Beside other approvers")
		})
	}
	// Where the processes took their peaks apart, the share net of the
	// binary's pages too: 70 MiB of a 200 MiB peak, 70 of 135 and of 120.
	withPeaks := base
	withPeaks.After.AtPeak = Memory{RSS: 200 << 20, File: 70 << 20}
	halved := replicaRun(sharded, n, k, 110, []time.Duration{2 * time.Second, 2 * time.Second}, []uint64{135 << 20, 120 << 20}, []int{500, 500})
	halved.Replicas[0].After.AtPeak = Memory{RSS: 135 << 20, File: 70 << 20}
	halved.Replicas[1].After.AtPeak = Memory{RSS: 120 << 20, File: 70 << 20}
	verdict := replicaVerdict(1, withPeaks, halved)
	assert.Contains(t, verdict, "RSS **missed** (0.68 > 0.60)); net of the binary's pages (70 MiB in one replica), each replica's RSS 0.38–0.50 of one replica's; throughput")
	halved.Replicas[1].After.AtPeak = Memory{}
	assert.NotContains(t, replicaVerdict(1, withPeaks, halved), "net of the binary", "a replica without its peak taken apart")

	// The profiles side by side, per CSR each process served.
	many := replicaRun(sharded, n, k, 110, []time.Duration{2 * time.Second, 2 * time.Second}, []uint64{110 << 20, 100 << 20}, []int{400, 600})
	cat := func(name string, v float64) ProfileSummary {
		return ProfileSummary{Total: v, Categories: []Category{{Name: name, Value: v}}}
	}
	rep := &Report{Options: Options{Machines: n, ReplicaClusters: k, Replicas: 2, Shards: 8}, Runs: []Result{base, many},
		Profiles: map[string]ProfileSummary{
			"ichor-one-replica-n1000-k10-round1":   cat("informer cache", 4e9),
			"ichor-2-replicas-n1000-k10-round1-r0": cat("informer cache", 2e9),
			"ichor-2-replicas-n1000-k10-round1-r1": cat("informer cache", 3e9),
		},
		Heaps: map[string]ProfileSummary{
			"ichor-one-replica-n1000-k10-round1":   cat("policy engine", 20<<20),
			"ichor-2-replicas-n1000-k10-round1-r0": cat("policy engine", 19<<20),
		},
	}
	md := rep.Markdown()
	require.Contains(t, md, "### Where each process's CPU goes, one replica beside 2 (round 1)")
	assert.Equal(t, "| what | one replica | r0 | r1 |", lineWith(md, "| what | one replica |"))
	assert.Equal(t, "| informer cache | 4.00 ms | 5.00 ms | 5.00 ms |", lineWith(md, "| informer cache |"))
	require.Contains(t, md, "### Where each process's heap goes, one replica beside 2 (round 1)")
	assert.Equal(t, "| policy engine | 20.0 MiB | 19.0 MiB | 0.0 MiB |", lineWith(md, "| policy engine |"))

	// Without the comparison, no section.
	rep = &Report{Options: Options{Machines: n, Clusters: k}}
	assert.False(t, strings.Contains(rep.Markdown(), "Beyond one replica"))
}
