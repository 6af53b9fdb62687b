// Command demo runs the ichor-policy story on an embedded control plane; see
// package demo. `make demo` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/ichor-dev/ichor-policy/test/demo"
)

func main() {
	ichor := flag.String("ichor", "bin/ichor", "the ichor binary to run as the manager")
	workDir := flag.String("workdir", "", "where to keep the kubeconfig, the decision log and the logs (default: a new temporary directory)")
	nonInteractive := flag.Bool("non-interactive", false, "tell the story and exit, instead of running until Ctrl-C")
	timeout := flag.Duration("timeout", 5*time.Minute, "bound on the story")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir := *workDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "ichor-demo-"); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
	// The simulated kubelets log through klog, as the real ones do; their
	// retries would drown the story, so they go to a file beside the others.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	klogFile, err := os.Create(filepath.Join(dir, "kubelets.log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	defer klogFile.Close()
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(klogFile, nil)))

	bin, err := filepath.Abs(*ichor)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if _, err := demo.Run(ctx, demo.Options{
		Out: os.Stdout, Ichor: bin, WorkDir: dir, Interactive: !*nonInteractive, Timeout: *timeout,
	}); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
