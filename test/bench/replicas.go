package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// Replica is one replica of a run of several (issue 24 §3): its share of
// the TalosClusters, by the shard Leases it held once settled, and its own
// figures over the load.
type Replica struct {
	Identity string
	// Clusters and Machines are what it served: the clusters whose shard
	// its Lease held, and their machines (one request each).
	Clusters, Machines int
	// CPU is its CPU time from the first request to the last approval;
	// Before and After its stats then.
	CPU           time.Duration
	Before, After Stats
	LogPath       string
	// Profile and HeapProfile are its CPU profile over the load and its
	// heap after the last approval.
	Profile, HeapProfile string
}

// CPUPerRequest is the replica's CPU per request of its clusters.
func (r Replica) CPUPerRequest() time.Duration {
	if r.Machines == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Machines)
}

// identityCandidates bounds the search of pickIdentities.
const identityCandidates = 256

// pickIdentities names the replicas of a sharded run so that the machines
// fall as evenly as rendezvous hashing over the clusters' shards allows:
// the clusters' UIDs are the API server's, so which replica serves which
// cluster is known only once they exist, and the bench compares a replica
// with one replica doing everything, which an uneven split would blur.
// clusters are the UIDs with their machine counts. It returns the names
// and each one's machines, the first candidate with the smallest spread.
func pickIdentities(clusters map[types.UID]int, replicas, shards int) ([]string, []int) {
	var best []string
	var bestLoad []int
	for c := range identityCandidates {
		ids := make([]string, replicas)
		for i := range ids {
			ids[i] = fmt.Sprintf("bench-replica-%d-%d", i, c)
		}
		load := replicaLoad(clusters, ids, shards, func(s int) string { return shard.Owner(ids, s) })
		if best == nil || slices.Max(load)-slices.Min(load) < slices.Max(bestLoad)-slices.Min(bestLoad) {
			best, bestLoad = ids, load
		}
		if slices.Max(load)-slices.Min(load) <= 1 {
			break
		}
	}
	return best, bestLoad
}

// replicaLoad is each replica's machines when shard s is held by holder(s).
func replicaLoad(clusters map[types.UID]int, ids []string, shards int, holder func(int) string) []int {
	load := make([]int, len(ids))
	for uid, machines := range clusters {
		if i := slices.Index(ids, holder(shard.Of(uid, shards))); i >= 0 {
			load[i] += machines
		}
	}
	return load
}

// replicaClusters is each replica's clusters when shard s is held by holder(s).
func replicaClusters(clusters map[types.UID]int, ids []string, shards int, holder func(int) string) []int {
	one := map[types.UID]int{}
	for uid := range clusters {
		one[uid] = 1
	}
	return replicaLoad(one, ids, shards, holder)
}

// clusterMachines are the group's clusters by UID, with their machines.
func (f *Fleet) clusterMachines(ctx context.Context, g Group) (map[types.UID]int, error) {
	byKey := map[types.NamespacedName]int{}
	for _, m := range g.Machines {
		byKey[m.Cluster]++
	}
	out := map[types.UID]int{}
	for _, key := range g.Clusters {
		var c ichorv1alpha1.TalosCluster
		if err := f.Env.Client.Get(ctx, key, &c); err != nil {
			return nil, fmt.Errorf("TalosCluster %s: %w", key, err)
		}
		out[c.UID] = byKey[key]
	}
	return out, nil
}

// replicaArgs are the `ichor manager` arguments of replica i of a sharded
// variant: its identity and, but for the first, a webhook port of its own
// (the API server calls the first's; every replica serves one, as in a
// Deployment).
func replicaArgs(base []string, identity string, webhookPort int) []string {
	args := append(slices.Clone(base), "--shard-identity", identity)
	if webhookPort > 0 {
		args = append(args, "--webhook-port", strconv.Itoa(webhookPort))
	}
	return args
}

// shardHolders are the holders the shards' Leases name.
func (f *Fleet) shardHolders(ctx context.Context, shards int) (map[int]string, error) {
	out := map[int]string{}
	for s := range shards {
		lease, err := f.Env.Clientset.CoordinationV1().Leases(harness.ManagerNamespace).Get(ctx, shard.ShardLeaseName(shards, s), metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out[s] = ptr.Deref(lease.Spec.HolderIdentity, "")
	}
	return out, nil
}

// waitShardsSettled waits until every shard's Lease names the replica
// rendezvous hashing gives it among ids: before that, one replica started
// first serves clusters the other is about to take, and the hand-over would
// fall in the load.
func (f *Fleet) waitShardsSettled(ctx context.Context, ids []string, shards int) (map[int]string, error) {
	var holders map[int]string
	err := waitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		h, err := f.shardHolders(ctx, shards)
		if err != nil {
			return false, nil //nolint:nilerr // a Lease not made yet: keep waiting
		}
		holders = h
		for s := range shards {
			if h[s] != shard.Owner(ids, s) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return holders, fmt.Errorf("the shards did not settle on %v within a minute (holders %v): %w", ids, holders, err)
	}
	return holders, nil
}

// runReplicas compares, over K TalosClusters of their own with N machines
// spread over them, `ichor manager` as one replica with R replicas sharing
// the clusters (--shards), both as the chart runs them (--leader-elect), in
// rounds whose order is reversed every other round.
func runReplicas(ctx context.Context, rep *Report, fleet *Fleet, tracker *Tracker, o Options, runOpts RunOptions) error {
	if o.Replicas <= 1 {
		return nil
	}
	say := func(format string, args ...any) { fmt.Fprintf(runOpts.Log, format+"\n", args...) }
	start := time.Now()
	spread, err := fleet.Spread(ctx, o.Machines, o.ReplicaClusters)
	if err != nil {
		return err
	}
	say("== Replicas: %d machines over %d TalosClusters (ready in %s)", o.Machines, o.ReplicaClusters, since(start))
	one, sharded := ReplicaVariants(o.Replicas, o.Shards, o.ReplicaArgs...)
	for round := 1; round <= max(o.ReplicaRounds, 1); round++ {
		say("== Replicas, round %d: one replica, then %d replicas with --shards %d (reversed every other round)", round, o.Replicas, o.Shards)
		order := []Variant{one, sharded}
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, v := range order {
			ro := runOpts
			ro.Round = round
			// Profiles in the first round only: where each process's CPU
			// and heap go, one replica beside each of several.
			ro.Profile = round == 1
			res, err := fleet.Run(ctx, tracker, v, spread, ro)
			if err != nil {
				return err
			}
			rep.Runs = append(rep.Runs, res)
			summarizeReplicaProfiles(ctx, rep, runOpts, res)
		}
	}
	if err := DeleteRequests(ctx, fleet.Env.Clientset); err != nil {
		return err
	}
	return fleet.RemoveSpread(ctx, spread)
}

// ReplicaVariants are the two sides of the replicas' comparison: `ichor
// manager` as shipped as one replica, and as replicas sharing the clusters
// in shards, with the extra arguments (the sharding's timings, say); both
// elect a leader, as the chart runs them.
func ReplicaVariants(replicas, shards int, extra ...string) (one, sharded Variant) {
	one = Variant{Name: "ichor-one-replica", Mode: "cli", Ichor: true, Replicas: 1, ManagerArgs: []string{"--leader-elect"}}
	sharded = Variant{Name: fmt.Sprintf("ichor-%d-replicas", replicas), Mode: "cli", Ichor: true, Replicas: replicas,
		Shards: shards, ManagerArgs: append([]string{"--leader-elect", "--shards", strconv.Itoa(shards)}, extra...)}
	return one, sharded
}

// Validate checks the options of the replicas' comparison.
func (o Options) Validate() error {
	if o.Replicas <= 1 {
		if o.ReplicasOnly {
			return errors.New("-replicas-only needs -replicas 2 or more")
		}
		return nil
	}
	if o.ReplicaClusters < o.Replicas {
		return fmt.Errorf("-replicas %d shares TalosClusters out: it needs -replica-clusters %d or more, not %d", o.Replicas, o.Replicas, o.ReplicaClusters)
	}
	if o.Shards < o.Replicas {
		return fmt.Errorf("-shards %d: at least one shard per replica (-replicas %d)", o.Shards, o.Replicas)
	}
	return nil
}

// shardTransitions is the replicas' counter of shards taken and given up.
const shardTransitions = "ichor_shard_transitions_total"

// The goals of issue 24 §3 for R replicas against one: reported, never
// enforced. "About half" (of R = 2) is read as at most 1.2/R.
const (
	goalReplicaShare      = 1.2
	goalReplicaThroughput = 1.0
)

// replicaRounds are the rounds of the replicas' comparison: in each, the
// run of one replica and the run of several, in the order they ran.
func (r *Report) replicaRounds() map[int][2]Result {
	out := map[int][2]Result{}
	for _, res := range r.Runs {
		if res.Round == 0 || res.Variant.Replicas == 0 {
			continue
		}
		pair := out[res.Round]
		if res.Variant.Replicas == 1 {
			pair[0] = res
		} else {
			pair[1] = res
		}
		out[res.Round] = pair
	}
	return out
}

// replicaTable is the comparison of R replicas with one, round by round,
// a row per process.
func (r *Report) replicaTable(w func(string, ...any)) {
	o := r.Options
	rounds := r.replicaRounds()
	if o.Replicas <= 1 || len(rounds) == 0 {
		return
	}
	w("### Beyond one replica: %d replicas with `--shards %d` against one, N = %d machines over %d TalosClusters (rounds alternate the order)", o.Replicas, o.Shards, o.Machines, o.ReplicaClusters)
	w("")
	w("Both are `ichor manager` as shipped with `--leader-elect`, as the chart runs them; the replicas share the clusters out through the shard Leases, named so that the machines split as evenly as the clusters' shards allow, and start the load once every shard is held by its replica. CPU is each process's from the first request to the last approval, peak RSS its VmHWM since its start; ratios are to the one replica of the same round.")
	w("")
	w("Shard transitions are each replica's `ichor_shard_transitions_total` over the load (shards taken or given up): 0 when the split held; more when a replica, starved of CPU, could not renew its membership within `--shard-renew-deadline` and its shards moved (its log says `membership` `member: false`).")
	w("")
	w("| round | controller | approved | approvals/s (÷ one replica) | p99 create → approved | process | clusters / machines served | CPU over the load (÷ one replica) | CPU per CSR served | peak RSS (÷ one replica) | peak heap | shard transitions during the load |")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, round := range slices.Sorted(maps.Keys(rounds)) {
		one := rounds[round][0]
		for _, res := range r.Runs {
			if res.Round != round || res.Variant.Replicas == 0 {
				continue
			}
			lead := fmt.Sprintf("| %d | %s | %s | %.1f (%.2f) | %s |", round, describeVariant(res.Variant), approvedCell(res),
				res.Outcome.PerSecond(), perSecondRatio(res, one), ms(res.Outcome.Quantile(0.99)))
			if len(res.Replicas) == 0 {
				w("%s one | %d / %d | %s (1.00) | %s | %s (1.00) | %s | %s |", lead, res.Clusters, res.Machines, ms(res.CPU),
					ms(perRequest(res.CPU, res)), mib(res.After.VmHWM), mib(res.After.HeapInusePeak), missing)
				continue
			}
			for i, rp := range res.Replicas {
				if i > 0 {
					lead = "| | | | | |"
				}
				w("%s %s | %d / %d | %s (%.2f) | %s | %s (%.2f) | %s | %.0f |", lead, rp.Identity, rp.Clusters, rp.Machines,
					ms(rp.CPU), ratio(rp.CPU, one.CPU), ms(rp.CPUPerRequest()),
					mib(rp.After.VmHWM), bytesRatio(rp.After.VmHWM, one.After.VmHWM), mib(rp.After.HeapInusePeak),
					Delta(rp.Before, rp.After, shardTransitions))
			}
		}
	}
	w("")
	for _, round := range slices.Sorted(maps.Keys(rounds)) {
		if line := replicaVerdict(round, rounds[round][0], rounds[round][1]); line != "" {
			w("%s", line)
		}
	}
	w("")
}

// replicaVerdict is a round's figures against issue 24's goal: each
// replica's CPU and peak RSS about 1/R of one replica's, throughput not
// lower.
func replicaVerdict(round int, one, many Result) string {
	n := len(many.Replicas)
	if n == 0 || one.Outcome.N == 0 {
		return ""
	}
	limit := goalReplicaShare / float64(n)
	var cpu, rss []float64
	for _, rp := range many.Replicas {
		cpu = append(cpu, ratio(rp.CPU, one.CPU))
		rss = append(rss, bytesRatio(rp.After.VmHWM, one.After.VmHWM))
	}
	verdict := func(got []float64) string {
		if slices.Max(got) <= limit {
			return "met"
		}
		return fmt.Sprintf("**missed** (%.2f > %.2f)", slices.Max(got), limit)
	}
	tp := perSecondRatio(many, one)
	tpVerdict := "met"
	if tp < goalReplicaThroughput {
		tpVerdict = "**missed**"
	}
	return fmt.Sprintf("- Round %d, %d replicas against one: each replica's CPU over the load %.2f–%.2f of one replica's, its peak RSS %.2f–%.2f (goal about 1/%d, at most %.2f: CPU %s, RSS %s)%s; throughput %.2fx (goal not lower: %s); all %d replicas together %.2fx the CPU.",
		round, n, slices.Min(cpu), slices.Max(cpu), slices.Min(rss), slices.Max(rss), n, limit, verdict(cpu), verdict(rss),
		workingSetShare(one, many), tp, tpVerdict, n, ratio(many.CPU, one.CPU))
}

// workingSetShare is each replica's highest RSS net of the binary's pages
// against one replica's, the part of the RSS that sharding can divide:
// every replica maps the whole binary. Empty when a process did not take
// its peak apart.
func workingSetShare(one, many Result) string {
	work := func(m Memory) uint64 { return m.RSS - min(m.File, m.RSS) }
	if work(one.After.AtPeak) == 0 {
		return ""
	}
	var shares []float64
	for _, rp := range many.Replicas {
		if work(rp.After.AtPeak) == 0 {
			return ""
		}
		shares = append(shares, bytesRatio(work(rp.After.AtPeak), work(one.After.AtPeak)))
	}
	return fmt.Sprintf("; net of the binary's pages (%s in one replica), each replica's RSS %.2f–%.2f of one replica's", mib(one.After.AtPeak.File), slices.Min(shares), slices.Max(shares))
}

func perSecondRatio(res, base Result) float64 {
	if base.Outcome.PerSecond() == 0 {
		return 0
	}
	return res.Outcome.PerSecond() / base.Outcome.PerSecond()
}

func bytesRatio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// processKey names a process of a run of the replicas' comparison in the
// report's profiles: the run, and the replica (from 0) of several.
func processKey(res Result, replica int) string {
	key := fmt.Sprintf("%s-round%d", RunName(res.Variant.Name, res.Machines, res.Clusters), res.Round)
	if len(res.Replicas) > 0 {
		key += fmt.Sprintf("-r%d", replica)
	}
	return key
}

// summarizeReplicaProfiles adds the CPU and heap profiles of each process
// of the run to the report.
func summarizeReplicaProfiles(ctx context.Context, rep *Report, o RunOptions, res Result) {
	files := [][2]string{{res.Profile, res.HeapProfile}}
	if len(res.Replicas) > 0 {
		files = nil
		for _, rp := range res.Replicas {
			files = append(files, [2]string{rp.Profile, rp.HeapProfile})
		}
	}
	for i, f := range files {
		if f[0] != "" {
			if ps, err := SummarizeProfile(ctx, o.Manager, f[0]); err != nil {
				fmt.Fprintf(o.Log, "   profile: %v\n", err)
			} else {
				rep.Profiles[processKey(res, i)] = ps
			}
		}
		if f[1] != "" {
			if ps, err := SummarizeHeap(ctx, o.Manager, f[1]); err != nil {
				fmt.Fprintf(o.Log, "   heap profile: %v\n", err)
			} else {
				rep.Heaps[processKey(res, i)] = ps
			}
		}
	}
}

// replicaProfileTable puts, for the first round that has them, one
// replica's CPU per CSR and heap by category beside each replica's of
// several (CPU per CSR it served): what a replica of several still spends
// on the clusters it does not serve.
func (r *Report) replicaProfileTable(w func(string, ...any)) {
	rounds := r.replicaRounds()
	for _, round := range slices.Sorted(maps.Keys(rounds)) {
		one, many := rounds[round][0], rounds[round][1]
		type col struct {
			label    string
			requests int
			cpu, mem ProfileSummary
		}
		var cols []col
		if cpu, ok := r.Profiles[processKey(one, 0)]; ok {
			cols = append(cols, col{"one replica", one.Machines, cpu, r.Heaps[processKey(one, 0)]})
		}
		for i, rp := range many.Replicas {
			if cpu, ok := r.Profiles[processKey(many, i)]; ok {
				cols = append(cols, col{rp.Identity, rp.Machines, cpu, r.Heaps[processKey(many, i)]})
			}
		}
		if len(cols) < 2 {
			continue
		}
		for _, part := range []struct {
			title string
			get   func(col) ProfileSummary
			cell  func(col, float64) string
		}{
			{"CPU profile over the load, per CSR the process served", func(c col) ProfileSummary { return c.cpu },
				func(c col, v float64) string { return ms(time.Duration(v) / time.Duration(max(c.requests, 1))) }},
			{"heap in use after the last approval", func(c col) ProfileSummary { return c.mem },
				func(_ col, v float64) string { return fmt.Sprintf("%.1f MiB", v/mebibyte) }},
		} {
			w("### Where each process's %s goes, one replica beside %d (round %d)", strings.SplitN(part.title, " ", 2)[0], len(many.Replicas), round)
			w("")
			w("%s.", strings.ToUpper(part.title[:1])+part.title[1:])
			w("")
			head, rule := "| what |", "|---|"
			var names []string
			seen := map[string]bool{}
			for _, c := range cols {
				head += " " + c.label + " |"
				rule += "---|"
				for _, cat := range part.get(c).Categories {
					if !seen[cat.Name] {
						seen[cat.Name] = true
						names = append(names, cat.Name)
					}
				}
			}
			w("%s", head)
			w("%s", rule)
			for _, name := range append(names, "all") {
				line := "| " + name + " |"
				for _, c := range cols {
					ps := part.get(c)
					v := ps.Total
					if name != "all" {
						v = 0
						for _, cat := range ps.Categories {
							if cat.Name == name {
								v = cat.Value
							}
						}
					}
					line += " " + part.cell(c, v) + " |"
				}
				w("%s", line)
			}
			w("")
		}
		return
	}
}
