package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// Output formats: -o means one thing in every command, an output format, as
// in kubectl. Files and directories have their own flags (--out,
// --output-dir).
const (
	outputTable    = "table"
	outputText     = "text"
	outputWide     = "wide"
	outputJSON     = "json"
	outputYAML     = "yaml"
	outputName     = "name"
	outputJSONPath = "jsonpath"
)

// outputFlag is a command's -o. Human is the default, for a person: table
// where the output is rows, text where it is one thing; the others are the
// formats the command has besides json, yaml and jsonpath=TEMPLATE, which
// every command has.
type outputFlag struct {
	value  string
	human  string
	others []string
	// format and template are what value says, once parsed.
	format, template string
}

func newOutputFlag(human string, others ...string) *outputFlag {
	return &outputFlag{value: human, human: human, others: others}
}

func (o *outputFlag) formats() []string {
	return slices.Compact(append(append([]string{o.human}, o.others...), outputJSON, outputYAML, outputJSONPath+"=TEMPLATE"))
}

func (o *outputFlag) register(cmd *cobra.Command, jsonIs string) {
	cmd.Flags().StringVarP(&o.value, "output", "o", o.human, "output format: "+strings.Join(o.formats(), ", ")+"; json is "+jsonIs+", yaml and jsonpath see the same document")
	completions := slices.Compact(append(append([]string{o.human}, o.others...), outputJSON, outputYAML, outputJSONPath+"="))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return completions, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	})
}

// parse validates -o: a file name where a format belongs (the old meaning of
// -o in some commands) is refused with the flag that writes files.
func (o *outputFlag) parse(fileFlag string) error {
	format, template, hasTemplate := strings.Cut(o.value, "=")
	switch {
	case format == outputJSONPath && hasTemplate && template != "":
		o.format, o.template = format, template
		return nil
	case !hasTemplate && (format == o.human || format == outputJSON || format == outputYAML || slices.Contains(o.others, format)):
		o.format = format
		return nil
	}
	msg := fmt.Sprintf("-o %q: -o is the output format (%s)", o.value, strings.Join(o.formats(), ", "))
	if fileFlag != "" {
		msg += "; a file to write is " + fileFlag
	}
	return usage.Errorf("%s", msg)
}

// structured reports whether -o asks for json, yaml or jsonpath.
func (o *outputFlag) structured() bool {
	return o.format == outputJSON || o.format == outputYAML || o.format == outputJSONPath
}

// print writes the command's JSON output (writeJSON) as -o asks: as it is
// for json, else as YAML or through the JSONPath template, cli-runtime's
// printer as kubectl's -o jsonpath. A command whose JSON is one object a
// line (lines) is seen by yaml and jsonpath as {"items": [...]}, as kubectl
// shows a list.
func (o *outputFlag) print(w io.Writer, lines bool, writeJSON func(io.Writer) error) error {
	if o.format == outputJSON {
		return writeJSON(w)
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf); err != nil {
		return err
	}
	var doc any
	if lines {
		items := []any{}
		sc := bufio.NewScanner(&buf)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var item any
			if err := json.Unmarshal(sc.Bytes(), &item); err != nil {
				return fmt.Errorf("output: %w", err)
			}
			items = append(items, item)
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("output: %w", err)
		}
		doc = map[string]any{"items": items}
	} else if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	if items, ok := doc.([]any); ok {
		// An array, such as the audit's rows, is a list too.
		doc = map[string]any{"items": items}
	}
	if o.format == outputYAML {
		b, err := yaml.Marshal(doc)
		if err != nil {
			return fmt.Errorf("output: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("output: jsonpath needs an object, and the output is %T", doc)
	}
	// The template is the person's, and what it prints is the output's
	// strings: the streams escape them as any other output.
	p, err := printers.NewJSONPathPrinter(o.template)
	if err != nil {
		return usage.Errorf("-o jsonpath=%s: %v", o.template, err)
	}
	if err := p.PrintObj(&unstructured.Unstructured{Object: obj}, w); err != nil {
		return usage.Errorf("-o jsonpath=%s: %v", o.template, err)
	}
	return nil
}

// addRetiredOutput keeps -o on a command where it named a file, hidden,
// so that the old command line is refused with the flag to use (retired).
func addRetiredOutput(f *pflag.FlagSet) {
	var v string
	f.StringVarP(&v, "output", "o", "", "")
	_ = f.MarkHidden("output")
}

// retired refuses -o on a command that prints no document.
func retired(cmd *cobra.Command, fileFlag string) error {
	if !cmd.Flags().Changed("output") {
		return nil
	}
	v, _ := cmd.Flags().GetString("output")
	return usage.Errorf("-o %q: -o is an output format in ichor, as in kubectl, and this command prints no document; the file to write is %s", v, fileFlag)
}
