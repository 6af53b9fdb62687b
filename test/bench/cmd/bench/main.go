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
	var o bench.Options
	var growth string
	flag.StringVar(&o.Manager, "manager", "", "the benchmanager binary (go build ./test/bench/cmd/benchmanager)")
	flag.StringVar(&o.Dir, "dir", "", "directory for logs, profiles and results (default: a new temporary directory)")
	flag.IntVar(&o.Machines, "machines", 1000, "N: the simulated machines of the main comparison")
	flag.IntVar(&o.Clusters, "clusters", 10, "K: also run the comparison at N with N other machines spread over K TalosClusters (each its own namespace, secrets bundle and OS CA; all named by --local-clusters), beside the one cluster of the main comparison (0 or 1: not)")
	flag.StringVar(&growth, "growth", "100,1000,5000", "machine counts of the growth series (comma-separated; empty: none)")
	flag.BoolVar(&o.Shipped, "shipped", true, "also run `ichor manager` as shipped (cli.Run: every controller, the webhook, its own client limits) at N")
	flag.IntVar(&o.Workers, "rubberstamp-workers", 4, "concurrent reconciles of the rubber stamp")
	flag.IntVar(&o.Concurrency, "concurrency", 32, "kubelets creating their request at the same moment")
	flag.IntVar(&o.Admissions, "admissions", 1000, "TalosCredentialRequests to admit through the webhook in this process (0: skip admission)")
	flag.IntVar(&o.ShippedAdmissions, "shipped-admissions", 200, "TalosCredentialRequests to admit through `ichor manager` as shipped (with -shipped)")
	flag.DurationVar(&o.RunTimeout, "run-timeout", 6*time.Minute, "bound on one run's wait for decisions; a run that exceeds it is reported as timed out with what was decided")
	flag.StringVar(&o.GoBench, "gobench", "", "output of `go test -bench` to include in the summary")
	flag.StringVar(&o.OPABench, "opabench", "", "output of `opa test --bench --format gobench` to include in the summary")
	flag.StringVar(&o.Doc, "doc", "", "write the results into this Markdown file between its bench markers (docs/performance.md)")
	flag.Func("peer", `another approver to run at N beside the rubber stamp and Ichor as shipped: "NAME BINARY [ARG...]", run with KUBECONFIG set (repeat for more; docs/performance.md)`, func(s string) error {
		p, err := bench.ParsePeer(s)
		if err == nil {
			o.Peers = append(o.Peers, p)
		}
		return err
	})
	flag.IntVar(&o.PeerRounds, "peer-rounds", 2, "rounds of the comparison with -peer, the order reversed every other round")
	flag.Parse()
	for _, s := range strings.Split(growth, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -growth: %q is not a machine count\n", s)
			os.Exit(2)
		}
		o.Growth = append(o.Growth, n)
	}
	if o.Manager == "" {
		fmt.Fprintln(os.Stderr, "bench: -manager is required")
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
