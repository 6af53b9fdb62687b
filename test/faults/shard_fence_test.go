package faults_test

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// verdicts are the decision-log entries of a request in a replica's log
// (not its applied records), with their times.
func verdicts(t *testing.T, m *harness.ManagerProcess, name string) []decisionlog.Entry {
	t.Helper()
	var out []decisionlog.Entry
	for _, e := range entries(t, m) {
		if e.Path != decisionlog.PathApplied && e.Object() == "csr/"+name {
			out = append(out, e)
		}
	}
	return out
}

// reads is how many Talos API calls a node has had.
func reads(n *harness.TalosNode) int {
	return n.Calls(talosapi.MethodStateGet) + n.Calls(talosapi.MethodStateList)
}

// A replica paused (SIGSTOP: a GC pause, a throttled or frozen container)
// with its decisions in flight, for longer than the lease: another replica
// takes its shards and decides their requests; when the paused one resumes
// (SIGCONT), its decisions in flight decide and write nothing, since it
// lost the shards. Only the new holder's verdicts are in the logs.
// (Before: the resumed replica went on, reached a verdict on each request
// from its old Talos read, logged it and wrote it, losing to the new
// holder's write only by the request's resourceVersion.)
func TestShardAPausedReplicaDecidesNothingOnceItsShardsAreTaken(t *testing.T) {
	s := newShardFleet(t, 63)
	live := []string{"pa", "pb"}
	for _, id := range live {
		// A Talos read outlives the pause: what stops the paused replica's
		// decisions must be the fence, not a timeout. The nodes are read at
		// decision time, not watched: a held read is how the test holds a
		// decision in flight.
		s.startWith(id, shardCount, "--talos-timeout=90s", "--talos-watch=false")
	}
	s.waitSettled(live, 90*time.Second)
	victim, taker := live[0], live[1]
	served := s.servedBy()
	theirs := map[string]bool{}
	var slow []*harness.TalosNode
	before := map[*harness.TalosNode]int{}
	for i, c := range s.clusters {
		if served[c] == victim {
			theirs[c] = true
			n := s.nodes[i]
			slow = append(slow, n)
			before[n] = reads(n)
			n.SetDelay(4 * time.Second)
		}
	}
	require.NotEmpty(t, theirs)
	names, clusterOf := s.submitAll(theirs)
	// Every one of the victim's decisions is in flight: its Talos read has
	// reached the node, which holds the answer.
	require.Eventually(t, func() bool {
		for _, n := range slow {
			if reads(n) == before[n] {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "the victim's decisions did not reach the nodes")
	require.NoError(t, s.replicas[victim].Signal(syscall.SIGSTOP))
	paused := time.Now()
	t.Cleanup(func() { _ = s.replicas[victim].Signal(syscall.SIGCONT) })
	require.Empty(t, decisions(s.ctx, t, names), "decided before the pause: the test proves nothing")
	for _, n := range slow {
		n.SetDelay(0)
	}
	// The taker judges the paused replica gone, takes its shards and
	// decides their requests.
	require.Eventually(t, func() bool {
		now := s.servedBy()
		for c := range theirs {
			if now[c] != taker {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "the paused replica's clusters were not taken over")
	t.Logf("%d clusters of the paused replica served by %s %s after SIGSTOP", len(theirs), taker, time.Since(paused).Round(10*time.Millisecond))
	waitDecided(s.ctx, t, names, 60*time.Second)
	exactlyOnceApproved(s.ctx, t, names)
	for _, name := range names {
		require.NotEmpty(t, verdicts(t, s.replicas[taker], name), "%s was not decided by the taker", name)
	}

	// The paused replica resumes, its reads answered long ago.
	require.NoError(t, s.replicas[victim].Signal(syscall.SIGCONT))
	resumed := time.Now()
	t.Logf("resumed %s after %s", victim, resumed.Sub(paused).Round(10*time.Millisecond))
	// It has run again: it gave its shards up, renewed its membership, and
	// took back, through their Leases, the shards meant for it.
	s.waitSettled(live, 60*time.Second)
	victimLog := readLog(t, s.replicas[victim])
	assert.Contains(t, victimLog, `"shard given up"`)
	// Its watch saw the taker unrenewed for the whole pause; once resumed
	// it took none of the taker's shards from it, since the API server
	// showed it renewed. (Before the pause, on a loaded machine, a replica
	// starved of CPU past the lease may lose shards legitimately.)
	for _, line := range strings.Split(victimLog, "\n") {
		var l struct {
			TS       float64 `json:"ts"`
			Msg      string  `json:"msg"`
			Previous string  `json:"previous_holder"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.TS < float64(resumed.UnixNano())/1e9 {
			continue
		}
		assert.False(t, l.Msg == "shard taken" && l.Previous == taker, "the resumed replica took a shard from the live taker: %s", line)
	}

	owner := map[string]string{}
	for c := range theirs {
		owner[c] = taker
	}
	s.decidedOnlyBy(names, clusterOf, owner)
	for _, name := range names {
		for _, e := range verdicts(t, s.replicas[victim], name) {
			t.Errorf("%s: verdict %s (%s) reached by the paused replica at %s, %s after it resumed", name, e.Action(), e.DecisionID,
				e.Timestamp.Format(time.RFC3339Nano), e.Timestamp.Sub(resumed).Round(time.Millisecond))
		}
	}
	s.appliedExactlyOnce(names)
}

// Replicas given different shard counts (a rollout that changes --shards
// goes one Pod at a time): while both are live neither serves anything, and
// each says so; once the odd one stops, the other serves every cluster
// alone. No request is decided by the replica of the other count.
// (Before: each served the clusters of its own count's shards, so some were
// served by both and others by none.)
func TestShardReplicasGivenDifferentShardCountsNeverServeOneClusterTwice(t *testing.T) {
	s := newShardFleet(t, 64)
	s.start("ma")
	s.waitSettled([]string{"ma"}, 90*time.Second)
	s.startWith("mb", shardCount+5)
	// Either mb says the counts differ or (before) it takes the shards of
	// its count that rendezvous hashing gives it, whose clusters ma serves
	// through the shards of its own.
	const mismatch = "live replicas announce another shard count"
	require.Eventually(t, func() bool {
		l := readLog(t, s.replicas["mb"])
		return strings.Contains(l, mismatch) || strings.Contains(l, `"shard taken"`)
	}, 30*time.Second, 50*time.Millisecond, "mb neither took a shard nor said the counts differ")
	require.NotContains(t, readLog(t, s.replicas["mb"]), `"shard taken"`, "the replica of the other count took a shard")
	require.Eventually(t, func() bool { return strings.Contains(readLog(t, s.replicas["ma"]), mismatch) }, 30*time.Second, 50*time.Millisecond,
		"ma does not say the counts differ")
	require.Eventually(t, func() bool { return hasEvent(t, "ma", "ShardCountMismatch") }, 30*time.Second, 100*time.Millisecond,
		"no Event on ma's Pod says the counts differ")
	// Nothing is served: ma gave its shards up, and mb took none.
	names, clusterOf := s.submitAll(nil)
	// mb stops; ma serves every cluster again.
	require.NoError(t, s.replicas["mb"].Signal(syscall.SIGTERM))
	s.waitSettled([]string{"ma"}, 60*time.Second)
	waitDecided(s.ctx, t, names, 60*time.Second)
	exactlyOnceApproved(s.ctx, t, names)
	only := map[string]string{}
	for _, c := range s.clusters {
		only[c] = "ma"
	}
	s.decidedOnlyBy(names, clusterOf, only)
	s.appliedExactlyOnce(names)
	assert.True(t, hasEvent(t, "ma", "ShardCountAgreed"), "no Event on ma's Pod says the counts agree again")
	assert.NotContains(t, readLog(t, s.replicas["mb"]), `"shard taken"`, "the replica of the other count took a shard")
}

// hasEvent reports whether an Event of that reason regards the Pod.
func hasEvent(t *testing.T, pod, reason string) bool {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(harness.ManagerNamespace)))
	return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool { return e.Regarding.Name == pod && e.Reason == reason })
}
