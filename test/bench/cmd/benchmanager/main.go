// Command benchmanager is a controller process of the end-to-end benchmark,
// started by cmd/bench: `ichor manager`, through the same cli.Run as
// bin/ichor, or the rubber stamp. Beside the controller it serves its own
// heap, RSS, CPU time, metrics and profiles to the driver (-stats), which the
// manager does not serve itself.
//
//	benchmanager -stats ADDR -mode cli -- manager --kubeconfig K ...
//	benchmanager -stats ADDR -mode rubberstamp -kubeconfig K -workers 4
//
// The driver hands it a socket already listening (-stats-fd) rather than an
// address, so that no other process can take the port in between.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/test/bench"
)

func main() {
	// A flag set of its own: controller-runtime registers --kubeconfig on the
	// default one.
	fs := flag.NewFlagSet("benchmanager", flag.ExitOnError)
	var (
		stats   = fs.String("stats", "127.0.0.1:0", "address of the stats and profile endpoint (without -stats-fd)")
		statsFD = fs.Int("stats-fd", 0, "descriptor of a socket listening for the stats and profile endpoint, handed over by the driver (0: listen on -stats)")
		mode    = fs.String("mode", "cli", "cli (ichor's own command line, the arguments after --) or rubberstamp")
		o       bench.ControllerOptions
	)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig (rubberstamp)")
	fs.IntVar(&o.Workers, "workers", 4, "concurrent reconciles (rubberstamp)")
	_ = fs.Parse(os.Args[1:])
	o.Log = os.Stderr

	bench.EnableClientMetrics()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := bench.StatsListener(*statsFD, *stats)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmanager: stats endpoint:", err)
		os.Exit(1)
	}
	bench.ServeStats(ctx, l)
	switch *mode {
	case "cli":
		if code := cli.Run(ctx, fs.Args(), os.Stdin, os.Stdout, os.Stderr); code != cli.ExitOK {
			os.Exit(code)
		}
	case "rubberstamp":
		err = bench.RunRubberStamp(ctx, o)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmanager:", err)
		os.Exit(1)
	}
}
