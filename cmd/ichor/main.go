// Command ichor is ichor-policy's one binary: the manager (controllers and
// admission webhook) and the operator's tools around the policy.
package main

import (
	"os"

	"github.com/ichor-dev/ichor-policy/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[0], os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
