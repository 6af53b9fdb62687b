package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Options configure Main.
type Options struct {
	Manager  string
	Dir      string
	Machines int
	// Clusters is K: the comparison at Machines is run again with as many
	// other machines spread over K TalosClusters (none if K ≤ 1).
	Clusters    int
	Growth      []int
	Shipped     bool
	Workers     int
	Concurrency int
	Admissions  int
	// ShippedAdmissions go through `ichor manager` as shipped (with Shipped).
	ShippedAdmissions int
	RunTimeout        time.Duration
	GoBench           string
	OPABench          string
	Doc               string
	Out               io.Writer
	// Peers are other approvers run at Machines in PeerRounds rounds,
	// alternating with the rubber stamp and Ichor as shipped.
	Peers      []Peer
	PeerRounds int
	// Replicas is R: `ichor manager` is also run as R replicas sharing
	// ReplicaClusters TalosClusters with Machines machines spread over them
	// in Shards shards, in ReplicaRounds rounds alternating with one
	// replica over the same clusters (none if R ≤ 1). ReplicasOnly runs
	// that alone.
	Replicas, ReplicaClusters, Shards, ReplicaRounds int
	ReplicasOnly                                     bool
	// ReplicaArgs are added to the sharded replicas' `ichor manager`
	// arguments.
	ReplicaArgs []string
}

// Report is everything one `make bench` measured.
type Report struct {
	Machine   MachineInfo
	Options   Options
	Started   time.Time
	Duration  time.Duration
	Decisions []BenchLine
	Runs      []Result
	// Profiles and Heaps are the CPU profiles and the heap profiles of the
	// Ichor runs, by VARIANT-nN.
	Profiles, Heaps map[string]ProfileSummary
	Admission       *AdmissionResult
	// AdmissionSkipped says why there is no admission figure.
	AdmissionSkipped string
}

// Main runs the whole benchmark and prints the summary.
func Main(ctx context.Context, o Options) (err error) {
	if err := o.Validate(); err != nil {
		return err
	}
	slices.Sort(o.Growth)
	out := o.Out
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	rep := &Report{Machine: Describe(), Options: o, Started: time.Now(), Profiles: map[string]ProfileSummary{}, Heaps: map[string]ProfileSummary{}}
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	// A directory of its own per run, so nothing of an earlier run is mixed
	// in; the last few are kept, to compare.
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}
	pruneRuns(o.Dir, keepRuns)
	if o.Dir, err = os.MkdirTemp(o.Dir, runDirPrefix+rep.Started.UTC().Format("20060102-150405")+"-"); err != nil {
		return err
	}
	if o.Manager, err = filepath.Abs(o.Manager); err != nil {
		return err
	}
	for _, path := range []string{o.GoBench, o.OPABench} {
		if path == "" {
			continue
		}
		lines, err := ParseBenchFile(path)
		if err != nil {
			return err
		}
		rep.Decisions = append(rep.Decisions, lines...)
	}

	say("== End to end: control plane (kube-apiserver, etcd, the CSR signer) in %s", o.Dir)
	start := time.Now()
	fleet, err := StartFleet(ctx, filepath.Join(o.Dir, "control-plane"))
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := fleet.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	say("   ready in %s", since(start))
	kubeconfig, err := fleet.WriteKubeconfig(o.Dir)
	if err != nil {
		return err
	}
	tracker, err := NewTracker(ctx, fleet.Env.Clientset)
	if err != nil {
		return err
	}
	defer tracker.Stop()

	counts := slices.Sorted(slices.Values(append(slices.Clone(o.Growth), o.Machines)))
	counts = slices.Compact(counts)
	runOpts := RunOptions{Manager: o.Manager, Dir: o.Dir, Kubeconfig: kubeconfig, Concurrency: o.Concurrency, Timeout: o.RunTimeout, Log: out}
	rubber := Variant{Name: "rubberstamp", Mode: "rubberstamp", Workers: o.Workers}
	// `ichor manager` with client-side throttling off: what the manager
	// and the API server can do whatever the client's limits; and with its
	// defaults, as shipped.
	ichor := Variant{Name: "ichor", Mode: "cli", ManagerArgs: []string{"--kube-api-qps", "-1"}, Ichor: true}
	shipped := Variant{Name: "ichor-shipped", Mode: "cli", Ichor: true}
	if o.ReplicasOnly {
		counts = nil
	}
	// Admission first, on a control plane that no run has filled yet: at
	// the end of a whole run the API server and etcd hold every earlier
	// run's thousands of objects, and the same admissions took two to three
	// times as long there (docs/performance.md).
	if o.Admissions > 0 && !o.ReplicasOnly {
		say("== Admission: %d TalosCredentialRequests through the webhook", o.Admissions)
		res, err := RunAdmission(ctx, fleet, o.Admissions, out)
		if err != nil {
			return err
		}
		if o.Shipped && o.ShippedAdmissions > 0 {
			if err := RunAdmissionShipped(ctx, fleet, o.ShippedAdmissions, runOpts, &res); err != nil {
				return err
			}
		}
		rep.Admission = &res
		// The runs after it see the fleet's objects only.
		if err := deleteCredentialRequests(ctx, fleet); err != nil {
			return err
		}
	} else if o.ReplicasOnly {
		rep.AdmissionSkipped = "not run (-replicas-only)"
	} else {
		rep.AdmissionSkipped = "not run (-admissions 0)"
	}
	for _, n := range counts {
		start := time.Now()
		if err := fleet.Grow(ctx, n); err != nil {
			return err
		}
		say("== %d machines (Talos API servers and TalosMachines ready in %s)", n, since(start))
		variants := []Variant{rubber, ichor}
		if n == o.Machines && o.Shipped {
			variants = append(variants, shipped)
		}
		g, err := fleet.Main(n)
		if err != nil {
			return err
		}
		if err := runVariants(ctx, rep, fleet, tracker, g, variants, runOpts); err != nil {
			return err
		}
		if n != o.Machines || o.Clusters <= 1 {
			continue
		}
		// The same comparison with the machines spread over K clusters: N
		// machines of their own, made now and removed after, so that the
		// runs before and after see the fleet's objects only.
		start = time.Now()
		spread, err := fleet.Spread(ctx, n, o.Clusters)
		if err != nil {
			return err
		}
		say("== %d machines over %d TalosClusters (Talos API servers, TalosMachines, clusters and secrets bundles ready in %s)", n, o.Clusters, since(start))
		if err := runVariants(ctx, rep, fleet, tracker, spread, variants, runOpts); err != nil {
			return err
		}
		if err := DeleteRequests(ctx, fleet.Env.Clientset); err != nil {
			return err
		}
		if err := fleet.RemoveSpread(ctx, spread); err != nil {
			return err
		}
	}
	if !o.ReplicasOnly {
		if err := runPeers(ctx, rep, fleet, tracker, o, []Variant{rubber, shipped}, runOpts); err != nil {
			return err
		}
	}
	if err := runReplicas(ctx, rep, fleet, tracker, o, runOpts); err != nil {
		return err
	}
	if err := DeleteRequests(ctx, fleet.Env.Clientset); err != nil {
		return err
	}

	rep.Duration = time.Since(rep.Started)

	text := rep.Markdown()
	if err := os.WriteFile(filepath.Join(o.Dir, "results.md"), []byte(text), 0o600); err != nil {
		return err
	}
	say("")
	say("%s", rep.Summary())
	say("results: %s", filepath.Join(o.Dir, "results.md"))
	if o.Doc != "" {
		if err := UpdateDoc(o.Doc, text); err != nil {
			return err
		}
		say("written into %s", o.Doc)
	}
	return nil
}

// runVariants runs the load of the group against each variant in turn and
// adds the results, profiles and heap profiles to the report.
func runVariants(ctx context.Context, rep *Report, fleet *Fleet, tracker *Tracker, g Group, variants []Variant, runOpts RunOptions) error {
	say := func(format string, args ...any) { fmt.Fprintf(runOpts.Log, format+"\n", args...) }
	for _, v := range variants {
		ro := runOpts
		ro.Profile = v.Ichor
		res, err := fleet.Run(ctx, tracker, v, g, ro)
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, res)
		key := RunName(v.Name, res.Machines, res.Clusters)
		if res.Profile != "" {
			ps, err := SummarizeProfile(ctx, runOpts.Manager, res.Profile)
			if err != nil {
				say("   profile: %v", err)
			} else {
				rep.Profiles[key] = ps
			}
		}
		if res.HeapProfile != "" {
			ps, err := SummarizeHeap(ctx, runOpts.Manager, res.HeapProfile)
			if err != nil {
				say("   heap profile: %v", err)
			} else {
				rep.Heaps[key] = ps
			}
		}
	}
	return nil
}

// runPeers runs the comparison with the peers at N: in each round the rubber
// stamp, Ichor as shipped and every peer on the same machines, in an order
// reversed every other round so that neither the machine's load nor the
// control plane's growth favours one.
func runPeers(ctx context.Context, rep *Report, fleet *Fleet, tracker *Tracker, o Options, ours []Variant, runOpts RunOptions) error {
	if len(o.Peers) == 0 {
		return nil
	}
	g, err := fleet.Main(o.Machines)
	if err != nil {
		return err
	}
	variants := slices.Clone(ours)
	for _, p := range o.Peers {
		variants = append(variants, Variant{Name: p.Name, Mode: "peer", Command: p.Command})
	}
	for round := 1; round <= max(o.PeerRounds, 1); round++ {
		fmt.Fprintf(runOpts.Log, "== Peers, round %d: %d machines\n", round, o.Machines)
		order := slices.Clone(variants)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, v := range order {
			ro := runOpts
			ro.Round = round
			res, err := fleet.Run(ctx, tracker, v, g, ro)
			if err != nil {
				return err
			}
			rep.Runs = append(rep.Runs, res)
		}
	}
	return nil
}

// keepRuns is how many earlier run directories are kept beside a new one.
const keepRuns = 4

// runDirPrefix starts the name of every run directory.
const runDirPrefix = "ichor-bench-"

// pruneRuns removes all but the newest keep run directories in dir (their
// names start with the time of the run).
func pruneRuns(dir string, keep int) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var runs []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), runDirPrefix) {
			runs = append(runs, e.Name())
		}
	}
	slices.Sort(runs)
	for _, name := range runs[:max(len(runs)-keep, 0)] {
		_ = os.RemoveAll(filepath.Join(dir, name))
	}
}
