// Package cli holds the commands of the ichor binary. Each command reads its
// input, does its work through the project's packages and prints the result;
// none decides anything itself.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// Exit codes of every command.
const (
	ExitOK    = 0
	ExitError = 1
	// ExitUsage is a wrong flag or argument: nothing was done.
	ExitUsage = 2
)

// Run executes the command line args and returns the process exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "ichor: %v\n", err)
	return exitCode(err)
}

// exitCode is the exit status of a command's result.
func exitCode(err error) int {
	// A command may ask for its own status, as replay's --fail-on does.
	var ce interface{ ExitCode() int }
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ce):
		return ce.ExitCode()
	case usage.Is(err):
		return ExitUsage
	}
	return ExitError
}

type streams struct {
	in       io.Reader
	out, err io.Writer
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	s := streams{in: stdin, out: stdout, err: stderr}
	root := &cobra.Command{
		Use:           "ichor",
		Short:         "ichor-policy: the certificate and credential rules of Ichor, in Rego",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Cobra's own flag errors are usage errors too.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage.Wrap(err) })
	root.AddCommand(newPolicyCommand(s), newBundleCommand(s), newManagerCommand(s), newRenderCommand(s), newDecisionsCommand(s), newClusterCommand(s))
	root.AddCommand(newAuditCommand(s))
	return root
}
