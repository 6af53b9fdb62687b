package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ichor-dev/ichor-policy/internal/usage"
	"github.com/ichor-dev/ichor-policy/internal/version"
)

func newVersionCommand(s streams) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o text|json]",
		Short: "Print the version of this binary, and the Go and OPA it was built with",
		Long: `Print the version of this binary: the version stamped by the release build (or
the module's, or "devel"), the VCS revision and time when the build recorded
them, and the versions of Go and of the OPA library that evaluates the rules.
The same values are the labels of the manager's ichor_build_info metric.

With -o json, one JSON object.`,
		Args: cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			info := version.Get()
			switch output {
			case "text":
				return writeVersionText(s.out, info)
			case "json":
				return json.NewEncoder(s.out).Encode(info)
			}
			return usage.Errorf("-o %q: the output is text or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output: text, or json")
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
