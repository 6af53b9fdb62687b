// Command ichor is ichor-policy's one binary: the manager (controllers and
// admission webhook) and the operator's tools around the policy.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ichor-dev/ichor-policy/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.RunAs(ctx, os.Args[0], os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
