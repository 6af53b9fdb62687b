// Package cli holds the commands of the ichor binary. Each command reads its
// input, does its work through the project's packages and prints the result;
// none decides anything itself.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// Exit codes of every command.
const (
	ExitOK    = 0
	ExitError = 1
	// ExitUsage is a wrong flag or argument: nothing was done.
	ExitUsage = 2
)

// exitStatuses is what every command's exit status means, in the root's
// help; a command that uses 3 says what for in its own.
const exitStatuses = `Exit status of every command:
  0  done
  1  failed: an input that could not be read or held nothing to act on, an
     API server that cannot be reached or refused the request, a request that
     could not be decided
  2  a wrong command, flag or argument, or a named input that is not there or
     not of the kind the command reads: nothing was done
  3  done, and what was found needs a person: decisions replay --fail-on
     matched a change, audit kubelet-serving found a drifted certificate
  4  audit kubelet-serving: none drifted, but one could not be judged
  130, 143  interrupted (SIGINT, SIGTERM) and not stopped within 2 seconds
     (the manager is given all the time it takes); what was done stands.
     A second signal ends the command at once`

// Run executes the command line args and returns the process exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return RunAs(ctx, "ichor", args, stdin, stdout, stderr)
}

// kubectlPlugin is the name kubectl looks for on the PATH to run
// `kubectl ichor` (kubectl's plugin convention, and the bin of the krew
// manifest deploy/krew/ichor.yaml).
const kubectlPlugin = "kubectl-ichor"

// RunAs is Run for the binary invoked as argv0 (os.Args[0]): as
// kubectl-ichor, kubectl's plugin, its help names the commands as the person
// typed them, `kubectl ichor ...`.
func RunAs(ctx context.Context, argv0 string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	s := newStreams(stdin, stdout, stderr)
	defer s.flush()
	root := newRootWith(s)
	root.Annotations = map[string]string{argv0Annotation: argv0}
	if strings.TrimSuffix(filepath.Base(argv0), ".exe") == kubectlPlugin {
		root.Annotations[cobra.CommandDisplayNameAnnotation] = "kubectl ichor"
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	// An error quotes what it failed on: a file's content, a server's
	// answer, a request's condition; it is escaped as any other output.
	fmt.Fprintf(s.err, "ichor: %s\n", termsafe.ErrorText(err))
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

// streams are a command's standard input, output and error. Everything a
// command prints goes to out and err, which escape every character a terminal
// would act on rather than show (termsafe): the CLI prints strings that
// requesters wrote, and decision logs that anyone could have written, and
// kubectl does the same since CVE-2021-25743. A JSON document stays the same
// document through them, so the manager's decision log and logs (JSON, read
// with kubectl logs on a terminal as often as by a program) go through them
// too. rawOut is the process's own standard output, for the one output that
// is neither for a terminal nor JSON: the Talos machine-configuration patches
// render prints, which are applied as they are.
type streams struct {
	in       io.Reader
	out, err io.Writer
	rawOut   io.Writer
	escaped  []*termsafe.Writer
}

func newStreams(stdin io.Reader, stdout, stderr io.Writer) streams {
	out, errOut := termsafe.NewWriter(stdout), termsafe.NewWriter(stderr)
	return streams{in: stdin, out: out, err: errOut, rawOut: stdout, escaped: []*termsafe.Writer{out, errOut}}
}

// flush writes what the escaping writers hold: the start of a character
// that the last write cut.
func (s streams) flush() {
	for _, w := range s.escaped {
		_ = w.Flush()
	}
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	return newRootWith(newStreams(stdin, stdout, stderr))
}

func newRootWith(s streams) *cobra.Command {
	root := &cobra.Command{
		Use:   "ichor",
		Short: "ichor-policy: the certificate and credential rules of Ichor, in Rego",
		Long: `ichor-policy: the certificate and credential rules of Ichor, in Rego.

` + exitStatuses,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
	// Cobra's own flag errors are usage errors too.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage.Wrap(err) })
	// An API server's warnings (a deprecated API, a field it dropped) are
	// printed as kubectl prints them: "Warning: ..." on standard error, once
	// each, escaped like the rest, not as klog's text lines beside it. The
	// manager logs them as entries of its log (klog's default handler, which
	// its logger takes).
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		if cmd.Name() == managerCommand {
			rest.SetDefaultWarningHandler(rest.WarningLogger{})
			return
		}
		rest.SetDefaultWarningHandler(rest.NewWarningWriter(s.err, rest.WarningWriterOptions{Deduplicate: true}))
	}
	root.AddCommand(newManualDecisionCommand(s, true), newManualDecisionCommand(s, false), newPolicyCommand(s), newBundleCommand(s), newManagerCommand(s), newRenderCommand(s), newDecisionsCommand(s), newClusterCommand(s), newVersionCommand(s), newAuditCommand(s), newProbeCommand(s))
	// Cobra adds its completion command when it executes; added now, it is
	// held to the same rules as the others.
	root.InitDefaultCompletionCmd()
	usageArgs(root)
	completeFlagValues(root)
	return root
}

// usageArgs makes a wrong command line a usage error (exit 2) in c and every
// command under it: its argument validator's errors, and an unknown
// subcommand, which cobra reports as a plain error at the root and answers
// with help and status 0 below it.
func usageArgs(c *cobra.Command) {
	if c.HasSubCommands() && !c.Runnable() {
		c.Args = unknownCommand
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if validate := c.Args; validate != nil {
		c.Args = func(cmd *cobra.Command, args []string) error { return usage.Wrap(validate(cmd, args)) }
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}

// unknownCommand refuses any argument of a command that only groups others:
// it can only be a subcommand that does not exist.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default, which SuggestionsFor does not apply
	}
	if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(suggestions, " or "))
	}
	return errors.New(msg)
}
