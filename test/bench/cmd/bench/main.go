// Command bench is the end-to-end benchmark `make bench` runs: N simulated
// Talos machines whose kubelets all ask for a serving certificate at once,
// decided by the Ichor manager and, in the same run, by a rubber stamp; the
// growth of the cost per request with the number of machines; the
// TalosCredentialRequest admission latency; and the manager's CPU profile,
// heap and RSS. It prints a summary table and, with -doc, writes the figures
// into docs/performance.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ichor-dev/ichor-policy/test/bench"
)

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	o.Out = os.Stdout

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Main(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line into the bench's options.
func parseFlags(args []string) (bench.Options, error) {
	var o bench.Options
	var growth string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.Manager, "manager", "", "the benchmanager binary (go build ./test/bench/cmd/benchmanager)")
	fs.StringVar(&o.Dir, "dir", "", "directory for logs, profiles and results (default: a new temporary directory)")
	fs.IntVar(&o.Machines, "machines", 1000, "N: the simulated machines of the main comparison")
	fs.IntVar(&o.Clusters, "clusters", 10, "K: also run the comparison at N with N other machines spread over K TalosClusters (each its own namespace, secrets bundle and OS CA; all named by --local-clusters), beside the one cluster of the main comparison (0 or 1: not)")
	fs.StringVar(&growth, "growth", "100,1000,5000", "machine counts of the growth series (comma-separated; empty: none)")
	fs.BoolVar(&o.Shipped, "shipped", true, "also run `ichor manager` as shipped (cli.Run: every controller, the webhook, its own client limits) at N")
	fs.IntVar(&o.Workers, "rubberstamp-workers", 4, "concurrent reconciles of the rubber stamp")
	fs.IntVar(&o.Concurrency, "concurrency", 32, "kubelets creating their request at the same moment")
	fs.IntVar(&o.Admissions, "admissions", 1000, "TalosCredentialRequests to admit through the webhook in this process (0: skip admission)")
	fs.IntVar(&o.ShippedAdmissions, "shipped-admissions", 200, "TalosCredentialRequests to admit through `ichor manager` as shipped (with -shipped)")
	fs.DurationVar(&o.RunTimeout, "run-timeout", 6*time.Minute, "bound on one run's wait for decisions; a run that exceeds it is reported as timed out with what was decided")
	fs.StringVar(&o.GoBench, "gobench", "", "output of `go test -bench` to include in the summary")
	fs.StringVar(&o.OPABench, "opabench", "", "output of `opa test --bench --format gobench` to include in the summary")
	fs.StringVar(&o.Doc, "doc", "", "write the results into this Markdown file between its bench markers (docs/performance.md)")
	fs.Func("peer", `another approver to run at N beside the rubber stamp and Ichor as shipped: "NAME BINARY [ARG...]", run with KUBECONFIG set (repeat for more; docs/performance.md)`, func(s string) error {
		p, err := bench.ParsePeer(s)
		if err == nil {
			o.Peers = append(o.Peers, p)
		}
		return err
	})
	fs.IntVar(&o.PeerRounds, "peer-rounds", 2, "rounds of the comparison with -peer, the order reversed every other round")
	fs.IntVar(&o.Replicas, "replicas", 2, "R: also run `ichor manager` as R replicas sharing N machines spread over -replica-clusters TalosClusters of their own (--shards), alternating with one replica over the same clusters, both with --leader-elect as the chart runs them (0 or 1: not)")
	fs.IntVar(&o.ReplicaClusters, "replica-clusters", 10, "the TalosClusters of the comparison of replicas, N machines spread over them")
	fs.IntVar(&o.Shards, "shards", 8, "the replicas' --shards: a few per replica")
	fs.IntVar(&o.ReplicaRounds, "replica-rounds", 2, "rounds of the comparison of replicas, the order reversed every other round")
	fs.Func("replica-args", "more `ichor manager` arguments of the sharded replicas, separated by spaces (the sharding's timings, say: \"--shard-lease-duration 15s --shard-renew-deadline 10s --shard-retry-period 2s\")", func(s string) error {
		o.ReplicaArgs = append(o.ReplicaArgs, strings.Fields(s)...)
		return nil
	})
	fs.BoolVar(&o.ReplicasOnly, "replicas-only", false, "run the comparison of replicas alone (no main comparison, growth, peers or admission)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(growth, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return o, fmt.Errorf("-growth: %q is not a machine count", s)
		}
		o.Growth = append(o.Growth, n)
	}
	if o.Manager == "" {
		return o, errors.New("-manager is required")
	}
	return o, o.Validate()
}
