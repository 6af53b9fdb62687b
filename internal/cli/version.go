package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ichor-dev/ichor-policy/internal/version"
)

func newVersionCommand(s streams) *cobra.Command {
	output := newTextPrintFlags(false)
	cmd := &cobra.Command{
		Use:   "version [-o text|json|yaml|jsonpath=TEMPLATE]",
		Short: "Print the version of this binary, and the Go and OPA it was built with",
		Long: `Print the version of this binary: the version stamped by the release build (or
the module's, or "devel"), the VCS revision and time when the build recorded
them, and the versions of Go and of the OPA library that evaluates the rules.
The same values are the labels of the manager's ichor_build_info metric.

-o json, yaml and jsonpath=TEMPLATE print a Version object
(cli.ichor.dev/v1alpha1) with the same fields.`,
		Args: cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			if err := output.complete(); err != nil {
				return err
			}
			info := version.Get()
			if !output.isHuman() {
				d, err := document("Version", "", "", info)
				if err != nil {
					return err
				}
				return output.print(s.out, d)
			}
			return writeVersionText(s.out, info)
		},
	}
	output.register(cmd)
	return cmd
}

func writeVersionText(w io.Writer, info version.Info) error {
	revision := info.Revision
	if revision != "" && info.Modified {
		revision += " (modified)"
	}
	rows := [][2]string{
		{"ichor", info.Version}, {"revision", revision}, {"time", info.Time},
		{"go", info.GoVersion}, {"opa", info.OPA},
	}
	for _, r := range rows {
		if r[1] == "" {
			continue
		}
		if _, err := fmt.Fprintf(w, "%-9s %s\n", r[0]+":", r[1]); err != nil {
			return err
		}
	}
	return nil
}
