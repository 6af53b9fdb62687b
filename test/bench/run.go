package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
)

// Variant is a controller the load is run against.
type Variant struct {
	// Name is how the results name it.
	Name string
	// Mode is benchmanager's -mode: cli (`ichor manager`) or rubberstamp.
	Mode string
	// ManagerArgs are added to `ichor manager`'s arguments (mode cli).
	ManagerArgs []string
	// Workers of the rubber stamp.
	Workers int
	// Ichor reports whether the variant is the Ichor manager (whose
	// decisions should all be approvals).
	Ichor bool
	// Command is a peer's program and arguments (mode peer).
	Command []string
	// Replicas of `ichor manager` run side by side (mode cli; 0 or 1: one),
	// sharing the TalosClusters out in Shards (--shards, in ManagerArgs).
	Replicas, Shards int
}

// Args are benchmanager's arguments for the variant. `ichor manager` serves
// the credential webhook where the fleet's webhook configuration points, as
// make demo runs it.
// Every one of clusters is named a judge of the local API server.
func (v Variant) Args(kubeconfig string, f *Fleet, clusters []types.NamespacedName) (flags, cliArgs []string) {
	switch v.Mode {
	case "cli":
		local := make([]string, len(clusters))
		for i, c := range clusters {
			local[i] = c.String()
		}
		args := []string{"manager", "--kubeconfig", kubeconfig,
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
			"--webhook-port", fmt.Sprint(f.Webhook.LocalServingPort), "--webhook-cert-dir", f.Webhook.LocalServingCertDir,
			"--local-clusters", strings.Join(local, ","),
			// The bench's machines answer on this host's loopback, which
			// the manager denies by default.
			"--node-denied-networks="}
		return []string{"-mode", "cli"}, append(args, v.ManagerArgs...)
	default:
		return []string{"-mode", v.Mode, "-kubeconfig", kubeconfig, "-workers", fmt.Sprint(v.Workers)}, nil
	}
}

// RunOptions configure one run.
type RunOptions struct {
	// Manager is the benchmanager binary.
	Manager string
	// Dir receives the controller's logs, decision log and profile.
	Dir string
	// Kubeconfig of the admin user, which the controllers run as.
	Kubeconfig string
	// Concurrency of the kubelets' creates.
	Concurrency int
	// Timeout bounds the wait for the decisions; a run that times out is
	// reported with what was decided.
	Timeout time.Duration
	// Profile takes a CPU profile of the controller during the load.
	Profile bool
	// Log receives progress.
	Log io.Writer
	// Round is the round of the comparison with the peers (0: a main run).
	Round int
}

// Result is one run of the load against one controller.
type Result struct {
	Variant  Variant
	Machines int
	// Clusters is how many TalosClusters the machines were spread over.
	Clusters int
	Outcome  Outcome
	TimedOut bool
	// CPU is the controller's CPU time from the first request to the last
	// approval; ControlPlaneCPU that of kube-apiserver, etcd and
	// the CSR signer together, DriverCPU that of this process (the
	// Talos API servers, the kubelets' creates, the tracker).
	CPU, ControlPlaneCPU, DriverCPU time.Duration
	// Before and After are the controller's stats before the load (warmed
	// up) and after the last approval.
	Before, After Stats
	// Profile is the CPU profile file of the controller during the load,
	// HeapProfile its heap after the last approval; empty if none was taken.
	Profile, HeapProfile string
	// ControlPlaneIdle is the control plane's CPU rate before the load
	// (CPU seconds per second), with the controller started and idle: its
	// leases, its controllers, etcd's housekeeping.
	ControlPlaneIdle float64
	// LogPath and DecisionLogPath are the controller's outputs.
	LogPath, DecisionLogPath string
	// Round is the round of the comparison with the peers the run was part
	// of (from 1); 0 for the main runs.
	Round int
	// APIRequests are the API server's requests from the first request of
	// the load to the last approval, by verb and resource.
	APIRequests APIRequests
	// Replicas are the figures of each replica of a variant of several;
	// then CPU is their sum, and Before and After are the first's.
	Replicas []Replica
}

// ControlPlaneNet is the control plane's CPU over the load less its idle
// rate over the same time.
func (r Result) ControlPlaneNet() time.Duration {
	return max(r.ControlPlaneCPU-time.Duration(r.ControlPlaneIdle*float64(r.Outcome.Elapsed())), 0)
}

// CPUPerRequest is the controller's CPU time per approved request.
func (r Result) CPUPerRequest() time.Duration {
	if len(r.Outcome.Latencies) == 0 {
		return 0
	}
	return r.CPU / time.Duration(len(r.Outcome.Latencies))
}

// identityReadMetric is the histogram of the manager's direct Talos reads of
// a node's identity: a decision whose node has no live watch makes one.
const identityReadMetric = "ichor_talos_identity_read_duration_seconds"

// IdentityReadsPerRequest is the manager's direct Talos reads per request
// decided over the load: 0 when every node's identity came from a watch, 1
// when none did.
func (r Result) IdentityReadsPerRequest() float64 {
	if len(r.Outcome.Latencies) == 0 {
		return 0
	}
	return Delta(r.Before, r.After, identityReadMetric+"_count") / float64(len(r.Outcome.Latencies))
}

// RunName names a run of variant on n machines over k clusters in results,
// profiles and file names.
func RunName(variant string, n, k int) string {
	if k > 1 {
		return fmt.Sprintf("%s-n%d-k%d", variant, n, k)
	}
	return fmt.Sprintf("%s-n%d", variant, n)
}

// Run runs the load of the group's machines against the variant: it starts
// the controller, warms it up with one request per cluster (so its caches
// are synced, its engine and each cluster's Talos reader made), then creates
// a request per machine at once and waits until all are decided. The
// requests are deleted before the next run.
func (f *Fleet) Run(ctx context.Context, tr *Tracker, v Variant, g Group, o RunOptions) (res Result, err error) {
	n := len(g.Machines)
	res = Result{Variant: v, Machines: n, Clusters: len(g.Clusters)}
	say := func(format string, args ...any) { fmt.Fprintf(o.Log, "   "+format+"\n", args...) }
	cs := f.Env.Clientset
	cp, err := FindControlPlane()
	if err != nil {
		return res, err
	}
	if err := cp.Check(); err != nil {
		return res, err
	}
	if err := DeleteRequests(ctx, cs); err != nil {
		return res, err
	}
	tr.Reset()
	reqs, err := f.PrepareRequests(ctx, g.Machines)
	if err != nil {
		return res, err
	}
	warm, err := f.PrepareRequests(ctx, firstOfEachCluster(g))
	if err != nil {
		return res, err
	}

	if err := f.ForgetCertificates(ctx, g); err != nil {
		return res, err
	}

	name := RunName(v.Name, n, len(g.Clusters))
	if v.Mode == "cli" {
		if err := f.InstallWebhook(); err != nil {
			return res, err
		}
	}
	if o.Round > 0 {
		name = fmt.Sprintf("%s-round%d", name, o.Round)
	}
	res.Round = o.Round
	ctls, err := f.startControllers(ctx, v, g, o, name, &res)
	defer func() {
		for _, ctl := range ctls {
			if stopErr := ctl.Stop(); stopErr != nil && err == nil && ctx.Err() == nil {
				err = fmt.Errorf("%s: %w\n%s", ctl.Name, stopErr, tail(ctl.LogPath, 20))
			}
		}
	}()
	if err != nil {
		return res, err
	}
	ctl := ctls[0]
	res.LogPath, res.DecisionLogPath = ctl.LogPath, ctl.DecisionLogPath

	start := time.Now()
	subs, err := Submit(ctx, warm, 1)
	if err != nil {
		return res, err
	}
	warmNames := make([]string, len(subs))
	for i, s := range subs {
		warmNames[i] = s.Name
	}
	warmCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, denied, err := tr.WaitDecided(warmCtx, warmNames)
	cancel()
	if err != nil {
		return res, fmt.Errorf("%s: warm-up request not approved: %w\n%s", name, err, tail(ctl.LogPath, 20))
	}
	if len(denied) > 0 {
		return res, fmt.Errorf("%s: warm-up request denied: %v\n%s", name, denied, tail(ctl.LogPath, 20))
	}
	// The warm-up's machines have their certificates recorded: the others
	// are expected to ask, and their identities are watched before the load
	// (a manager that watches none has no such gauge).
	if err := waitWatches(ctx, ctls, v.Ichor, min(n-len(warmNames), kubeletserving.DefaultWatchMax)); err != nil {
		return res, fmt.Errorf("%s: %w\n%s", name, err, tail(ctl.LogPath, 20))
	}
	say("%s: started and warmed up in %s", name, since(start))

	// The control plane's own background work, measured for a moment
	// before the load, so that a long run's CPU per request can be read net
	// of it.
	idleStart, idleFrom := cp.CPU(), time.Now()
	time.Sleep(2 * time.Second)
	idleEnd := cp.CPU()
	for k, d := range idleEnd {
		res.ControlPlaneIdle += (d - idleStart[k]).Seconds() / time.Since(idleFrom).Seconds()
	}
	before, err := statsOf(ctx, ctls)
	if err != nil {
		return res, err
	}
	res.Before = before[0]
	apiBefore, err := ScrapeAPIRequests(ctx, cs)
	if err != nil {
		return res, err
	}
	cpBefore, driverBefore := cp.CPU(), selfCPU()
	if o.Profile {
		if err := startProfiles(ctx, ctls, o.Dir, &res); err != nil {
			return res, err
		}
	}

	start = time.Now()
	subs, err = Submit(ctx, reqs, o.Concurrency)
	if err != nil {
		return res, err
	}
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.Name
	}
	say("%s: %d requests created in %s", name, n, since(start))
	waitCtx, cancel := context.WithTimeout(ctx, o.Timeout)
	// A control plane stopped from outside would leave the run waiting for
	// the timeout; it ends the run at once instead.
	go func() {
		for waitCtx.Err() == nil {
			if err := cp.Check(); err != nil {
				cancel()
				return
			}
			time.Sleep(2 * time.Second)
		}
	}()
	approved, denied, werr := tr.WaitDecided(waitCtx, names)
	cancel()
	if cerr := cp.Check(); cerr != nil {
		return res, cerr
	}
	res.TimedOut = werr != nil && ctx.Err() == nil
	if werr != nil && !res.TimedOut {
		return res, werr
	}

	after, err := statsOf(ctx, ctls)
	if err != nil {
		return res, err
	}
	res.After = after[0]
	cpAfter, driverAfter := cp.CPU(), selfCPU()
	apiAfter, err := ScrapeAPIRequests(ctx, cs)
	if err != nil {
		return res, err
	}
	res.APIRequests = apiAfter.Since(apiBefore)
	if o.Profile {
		if err := stopProfiles(ctx, ctls, o.Dir, &res); err != nil {
			return res, err
		}
	}
	res.addCPU(before, after)
	for k, d := range cpAfter {
		res.ControlPlaneCPU += d - cpBefore[k]
	}
	res.DriverCPU = driverAfter - driverBefore
	res.Outcome = outcome(subs, approved, denied)
	if res.TimedOut {
		// The window ends at the timeout, not at a last approval that never came.
		res.Outcome.LastApproved = time.Now()
	}
	say("%s: %d approved, %d denied in %s (%.1f/s), median %s, p99 %s; controller CPU %s%s",
		name, len(res.Outcome.Latencies), len(denied), res.Outcome.Elapsed().Round(time.Millisecond), res.Outcome.PerSecond(),
		res.Outcome.Quantile(0.5).Round(time.Millisecond), res.Outcome.Quantile(0.99).Round(time.Millisecond),
		res.CPU.Round(time.Millisecond), map[bool]string{true: " (TIMED OUT)", false: ""}[res.TimedOut])
	if v.Ichor && !res.TimedOut {
		// Outside the measures: the records Ichor makes after the last
		// approval are let in before it stops, so that the machines of
		// the next runs are as a settled fleet leaves them, not joining.
		f.waitRecorded(ctx, g, name, say)
	}
	return res, nil
}

// waitRecorded waits until every machine of the group has a certificate
// recorded, and says how long it took, or how many were left. The next runs
// clear the certificates of their own machines anyway: a record still
// missing leaves another machine of the cluster joining, and perhaps
// watched, within --talos-watch-max.
func (f *Fleet) waitRecorded(ctx context.Context, g Group, name string, say func(string, ...any)) {
	start := time.Now()
	mine := map[types.NamespacedName]bool{}
	for _, m := range g.Machines {
		mine[types.NamespacedName{Namespace: m.Cluster.Namespace, Name: m.Name}] = true
	}
	left := -1
	err := waitFor(ctx, 5*time.Minute, func(ctx context.Context) (bool, error) {
		n := 0
		for _, ns := range namespacesOf(g) {
			var list ichorv1alpha1.TalosMachineList
			if err := f.Env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
				return false, err
			}
			for i := range list.Items {
				m := &list.Items[i]
				if mine[client.ObjectKeyFromObject(m)] && m.Status.KubeletServingCertificate == nil {
					n++
				}
			}
		}
		left = n
		return left == 0, nil
	})
	if err != nil {
		say("%s: %d machines without a certificate recorded %s after the last approval: %v", name, left, since(start), err)
		return
	}
	say("%s: every certificate recorded %s after the last approval", name, since(start))
}

// statsOf asks each process for its Stats.
func statsOf(ctx context.Context, ctls []*Controller) ([]Stats, error) {
	out := make([]Stats, len(ctls))
	for i, c := range ctls {
		var err error
		if out[i], err = c.Stats(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// addCPU sets the run's CPU, the sum of its processes', and each replica's
// figures, from their stats before and after the load.
func (r *Result) addCPU(before, after []Stats) {
	for i := range after {
		r.CPU += after[i].CPU - before[i].CPU
	}
	for i := range r.Replicas {
		r.Replicas[i].Before, r.Replicas[i].After = before[i], after[i]
		r.Replicas[i].CPU = after[i].CPU - before[i].CPU
	}
}

// startProfiles starts each process's CPU profile into dir, named after
// it; the run keeps the first's, each replica its own.
func startProfiles(ctx context.Context, ctls []*Controller, dir string, res *Result) error {
	for i, c := range ctls {
		file := filepath.Join(dir, c.Name+".cpu.pprof")
		if err := c.StartProfile(ctx, file); err != nil {
			return err
		}
		if i == 0 {
			res.Profile = file
		}
		if i < len(res.Replicas) {
			res.Replicas[i].Profile = file
		}
	}
	return nil
}

// stopProfiles stops them and writes each process's heap profile beside.
func stopProfiles(ctx context.Context, ctls []*Controller, dir string, res *Result) error {
	for i, c := range ctls {
		if err := c.StopProfile(ctx); err != nil {
			return err
		}
		file := filepath.Join(dir, c.Name+".heap.pprof")
		if err := c.HeapProfile(ctx, file); err != nil {
			return err
		}
		if i == 0 {
			res.HeapProfile = file
		}
		if i < len(res.Replicas) {
			res.Replicas[i].HeapProfile = file
		}
	}
	return nil
}

// startControllers starts the variant's controller, or its replicas, and
// waits until they are ready (replicas: until their shards have settled,
// each shard held by the replica rendezvous hashing names). The replicas
// are named so that they share the machines as evenly as the clusters'
// shards allow, and res.Replicas says what each serves. It returns what
// it started, to be stopped, even on an error.
func (f *Fleet) startControllers(ctx context.Context, v Variant, g Group, o RunOptions, name string, res *Result) ([]*Controller, error) {
	if v.Mode == "peer" {
		ctl, err := startPeer(v, o.Dir, name, o.Kubeconfig)
		if err != nil {
			return nil, err
		}
		return []*Controller{ctl}, ctl.WaitReady(ctx)
	}
	flags, cliArgs := v.Args(o.Kubeconfig, f, g.Clusters)
	if v.Replicas <= 1 {
		ctl, err := StartController(o.Manager, o.Dir, name, flags, cliArgs)
		if err != nil {
			return nil, err
		}
		return []*Controller{ctl}, ctl.WaitReady(ctx)
	}
	clusters, err := f.clusterMachines(ctx, g)
	if err != nil {
		return nil, err
	}
	ids, _ := pickIdentities(clusters, v.Replicas, v.Shards)
	var ctls []*Controller
	for i, id := range ids {
		port := 0
		if i > 0 {
			if port, err = stablePort(); err != nil {
				return ctls, err
			}
		}
		ctl, err := StartController(o.Manager, o.Dir, fmt.Sprintf("%s-r%d", name, i), flags, replicaArgs(cliArgs, id, port))
		if err != nil {
			return ctls, err
		}
		ctls = append(ctls, ctl)
	}
	for _, ctl := range ctls {
		if err := ctl.WaitReady(ctx); err != nil {
			return ctls, err
		}
	}
	holders, err := f.waitShardsSettled(ctx, ids, v.Shards)
	if err != nil {
		return ctls, err
	}
	held := func(s int) string { return holders[s] }
	load, count := replicaLoad(clusters, ids, v.Shards, held), replicaClusters(clusters, ids, v.Shards, held)
	for i, id := range ids {
		res.Replicas = append(res.Replicas, Replica{Identity: id, Clusters: count[i], Machines: load[i], LogPath: ctls[i].LogPath})
	}
	return ctls, nil
}

// firstOfEachCluster is the group's first machine of each of its clusters.
func firstOfEachCluster(g Group) []*Machine {
	seen := map[types.NamespacedName]bool{}
	var out []*Machine
	for _, m := range g.Machines {
		if !seen[m.Cluster] {
			seen[m.Cluster] = true
			out = append(out, m)
		}
	}
	return out
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// WriteKubeconfig writes the admin kubeconfig the controllers run with.
func (f *Fleet) WriteKubeconfig(dir string) (string, error) {
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, f.Env.AdminKubeconfig, 0o600)
}

// waitFor polls cond every interval until it holds or the timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, cond)
}

// watchesLive is the manager's gauge of live identity watches.
const watchesLive = "ichor_talos_identity_watches_live"

// waitWatches waits until the controllers' live identity watches, summed,
// are at least want (at most --talos-watch-max are made), when they report
// any; Ichor must.
func waitWatches(ctx context.Context, ctls []*Controller, ichor bool, want int) error {
	live := 0.0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		live = 0
		for _, c := range ctls {
			st, err := c.Stats(ctx)
			if err != nil {
				return false, err
			}
			v, ok := st.Metrics[watchesLive]
			if !ok && ichor {
				return false, fmt.Errorf("%s reports no %s", c.Name, watchesLive)
			}
			if !ok {
				return true, nil
			}
			live += v
		}
		return live >= float64(want), nil
	})
	if err != nil {
		return fmt.Errorf("identity watches live: %.0f of %d: %w", live, want, err)
	}
	return nil
}

func namespacesOf(g Group) []string {
	var out []string
	for _, c := range g.Clusters {
		if !slices.Contains(out, c.Namespace) {
			out = append(out, c.Namespace)
		}
	}
	return out
}
