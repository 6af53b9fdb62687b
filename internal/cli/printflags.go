package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// The human forms of -o: a table of rows (and its wide form, with the
// columns of priority 1), or the text of a command that prints one thing.
const (
	outputTable = "table"
	outputWide  = "wide"
	outputText  = "text"
)

// cliAPIVersion is the apiVersion of the documents the commands print: no API
// server serves them, and the group says so. A command that prints several
// prints a v1 List of them, as kubectl does.
const cliAPIVersion = "cli.ichor.dev/v1alpha1"

// printFlags is a command's -o: one output format, as kubectl's -o, in every
// command that prints objects or rows. The machine formats are cli-runtime's
// printers, chosen by its print flags (json, yaml, kyaml, name, jsonpath=,
// jsonpath-file=, jsonpath-as-json=); the human form is cli-runtime's table
// printer over a metav1.Table (table, wide), or a command's own text where it
// prints one thing (version, decisions show). An unknown format is refused
// with kubectl's words, as a usage error. Files and directories are never -o:
// they have flags of their own (--out, --output-dir).
type printFlags struct {
	format   string
	human    []string
	jsonYAML *genericclioptions.JSONYamlPrintFlags
	// name is nil for a command whose document has no name.
	name     *genericclioptions.NamePrintFlags
	jsonPath *genericclioptions.JSONPathPrintFlags
	// printer is the machine format's printer, once complete chose it.
	printer printers.ResourcePrinter
}

// newTablePrintFlags is -o of a command that prints rows: table by default,
// and wide; named when each row is an object with a name (-o name).
func newTablePrintFlags(named bool) *printFlags {
	return newPrintFlags([]string{outputTable, outputWide}, named)
}

// newTextPrintFlags is -o of a command that prints one thing, as text by
// default.
func newTextPrintFlags(named bool) *printFlags {
	return newPrintFlags([]string{outputText}, named)
}

func newPrintFlags(human []string, named bool) *printFlags {
	p := &printFlags{
		format:   human[0],
		human:    human,
		jsonYAML: genericclioptions.NewJSONYamlPrintFlags(),
		jsonPath: &genericclioptions.JSONPathPrintFlags{},
	}
	if named {
		p.name = genericclioptions.NewNamePrintFlags("")
	}
	return p
}

// allowedFormats are the formats -o takes, as kubectl lists them.
func (p *printFlags) allowedFormats() []string {
	formats := slices.Concat(p.human, p.jsonYAML.AllowedFormats(), p.name.AllowedFormats(), p.jsonPath.AllowedFormats())
	slices.Sort(formats)
	return formats
}

// register adds -o to cmd, and the completion of its values.
func (p *printFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&p.format, "output", "o", p.format,
		fmt.Sprintf("output format, one of: %s (jsonpath=TEMPLATE, jsonpath-file=FILE)", strings.Join(p.allowedFormats(), ", ")))
	var values []cobra.Completion
	for _, f := range p.allowedFormats() {
		if strings.HasPrefix(f, "jsonpath") {
			f += "="
		}
		values = append(values, f)
	}
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	})
}

// complete validates -o and chooses its printer: a format it does not know
// is a usage error with kubectl's message, as is a JSONPath template that
// does not parse or a template file that cannot be read.
func (p *printFlags) complete() error {
	if p.isHuman() {
		return nil
	}
	var err error
	p.printer, err = p.jsonYAML.ToPrinter(p.format)
	// cli-runtime takes the format in any case (-o YAML): so must the
	// choice of the printer, or -o YAML escaped what -o yaml quotes
	// (review 202 F4).
	switch {
	case err == nil && strings.EqualFold(p.format, "yaml"):
		p.printer = &yamlPrinter{}
	case err == nil && !strings.EqualFold(p.format, "json"):
		p.printer = yamlReadable{p.printer}
	}
	if genericclioptions.IsNoCompatiblePrinterError(err) && p.name != nil && p.format != "" {
		p.printer, err = p.name.ToPrinter(p.format)
		p.printer = escapedNames{p.printer}
	}
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		p.printer, err = p.jsonPath.ToPrinter(p.format)
		if !strings.HasPrefix(p.format, "jsonpath-as-json") {
			p.printer = escapedText{p.printer}
		}
	}
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		err = genericclioptions.NoCompatiblePrinterError{OutputFormat: &p.format, AllowedFormats: p.allowedFormats()}
	}
	return usage.Wrap(err)
}

// yamlReadable prints an object through a YAML printer (kyaml) from
// its JSON, in which every character a YAML reader refuses is written as a
// JSON escape: DEL and the C1 controls (U+0080 to U+009F), and U+FFFE and
// U+FFFF, which JSON keeps as they are. cli-runtime's YAML printers read the
// object's JSON as YAML, so a requester's string holding one (a CSR named
// with a C1 CSI) made the whole output fail, every other entry of a
// decision log with it. The YAML printed holds the same strings, which the
// YAML writer escapes, and what the streams would escape already escaped as
// YAML reads it (escapeForStreams).
type yamlReadable struct{ printers.ResourcePrinter }

func (p yamlReadable) PrintObj(obj runtime.Object, w io.Writer) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := p.ResourcePrinter.PrintObj(&runtime.Unknown{Raw: yamlReadableJSON(data)}, &out); err != nil {
		return err
	}
	_, err = w.Write(escapeForStreams(out.Bytes()))
	return err
}

// escapeForStreams writes, in KYAML, each character the streams escape
// (termsafe) as a YAML escape, and double-quotes each plain key holding one,
// so that the streams find nothing left to escape. KYAML writes such a
// character as it is wherever Go calls it printable, and the streams' JSON
// escape is not always YAML's: a variation selector beyond U+FFFF became a
// surrogate pair, \udb40\udd00, which every YAML reader refuses, and the
// whole output with it (review 221 F1); and KYAML leaves a key of letters
// plain, where a Hangul filler (U+3164, a letter drawn as nothing) became six
// characters of another key (review 202 F4). Outside double quotes KYAML
// writes only its punctuation, numbers, booleans, null and plain keys, and a
// plain key holds no quote or backslash, so quoting one changes nothing
// else. It mends KYAML's mark of a folded line that starts with escaped
// whitespace on the way (mendWhitespaceMarkers).
func escapeForStreams(kyaml []byte) []byte {
	s := string(kyaml)
	// Without a character to escape or a doubled backslash (a marker to
	// mend, mendWhitespaceMarkers), there is nothing to do.
	if strings.IndexFunc(s, termsafe.Escaped) < 0 && !strings.Contains(s, `\\`) {
		return kyaml
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for len(s) > 0 {
		switch r, size := utf8.DecodeRuneInString(s); {
		case r == '"':
			end := quotedEnd(s)
			writeYAMLEscaped(&b, mendWhitespaceMarkers(s[:end]))
			s = s[end:]
		case plainKeyRune(r):
			end := strings.IndexFunc(s, func(r rune) bool { return !plainKeyRune(r) })
			if end < 0 {
				end = len(s)
			}
			if key := s[:end]; strings.IndexFunc(key, termsafe.Escaped) >= 0 {
				b.WriteByte('"')
				writeYAMLEscaped(&b, key)
				b.WriteByte('"')
			} else {
				b.WriteString(key)
			}
			s = s[end:]
		default:
			b.WriteString(s[:size])
			s = s[size:]
		}
	}
	return []byte(b.String())
}

// writeYAMLEscaped writes s with each character the streams escape as a
// YAML double-quoted string's escape of it: \uXXXX, or \UXXXXXXXX beyond
// U+FFFF.
func writeYAMLEscaped(b *strings.Builder, s string) {
	for len(s) > 0 {
		i := strings.IndexFunc(s, termsafe.Escaped)
		if i < 0 {
			b.WriteString(s)
			return
		}
		b.WriteString(s[:i])
		r, size := utf8.DecodeRuneInString(s[i:])
		if r > 0xffff {
			fmt.Fprintf(b, `\U%08x`, r)
		} else {
			fmt.Fprintf(b, `\u%04x`, r)
		}
		s = s[i+size:]
	}
}

// mendWhitespaceMarkers mends what KYAML (sigs.k8s.io/yaml v1.6.0) writes
// for a line of a folded string that starts with whitespace: a backslash
// marking it, then the whitespace, but the whitespace's own escape when it
// has one (\r, \v, U+00A0, U+3000...), so that the line began with two
// backslashes, which a YAML reader takes for one backslash (review 222 F1).
// KYAML indents each line by an even number of spaces and marks every other
// line with a space, so a doubled backslash right after even indentation is
// that marker: it becomes the space marker, and the escape reads back as the
// whitespace.
func mendWhitespaceMarkers(quoted string) string {
	if !strings.Contains(quoted, "\n") {
		return quoted
	}
	lines := strings.Split(quoted, "\n")
	for i, line := range lines[1:] {
		rest := strings.TrimLeft(line, " ")
		if indent := len(line) - len(rest); indent%2 == 0 && strings.HasPrefix(rest, `\\`) {
			lines[i+1] = line[:indent] + " " + rest[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// plainKeyRune says whether r may be in a key KYAML writes plain.
func plainKeyRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_' || r == '-' || r == '.' || r == '/'
}

// quotedEnd is the length of the double-quoted string s starts with, its
// closing quote included (all of s if it is not closed).
func quotedEnd(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(s)
}

// yamlPrinter prints -o yaml as cli-runtime's YAML printer does (the
// object's JSON as YAML, keys sorted, "---" between documents; its keys were
// in yaml.v2's order, a9 before a10, these are in encoding/json's), but writes
// double-quoted every string that holds a character the streams escape
// (termsafe: a bidi override, a zero-width space, a private-use character).
// The streams write such a character as a JSON escape, \u202e, which YAML
// reads as the character in a double-quoted string only: in the plain,
// single-quoted or block string cli-runtime's printer chose, the document
// read back held the six characters of the escape instead (review 22). A
// string the YAML writer has to escape itself (a C0 or C1 control) it
// double-quotes anyway.
type yamlPrinter struct{ printed int }

func (p *yamlPrinter) PrintObj(obj runtime.Object, w io.Writer) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Load(yamlReadableJSON(data), &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	out, err := yaml.Dump(&doc, yaml.WithV2Defaults(), yaml.WithCompactSeqIndent(true))
	if err != nil {
		return err
	}
	if p.printed++; p.printed > 1 {
		out = append([]byte("---\n"), out...)
	}
	_, err = w.Write(out)
	return err
}

// blockStyle makes a node read from JSON (flow mappings and sequences,
// double-quoted strings) the block YAML kubectl prints: mappings with their
// keys sorted, and each string in the writer's own choice of style unless it
// holds a character the streams escape.
func blockStyle(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		n.Style = 0
		if n.Tag != "!!str" {
			return
		}
		n.Style = stringStyle(n.Value)
		return
	}
	n.Style = 0
	if n.Kind == yaml.MappingNode {
		pairs := make([][2]*yaml.Node, 0, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			pairs = append(pairs, [2]*yaml.Node{n.Content[i], n.Content[i+1]})
		}
		slices.SortStableFunc(pairs, func(a, b [2]*yaml.Node) int { return strings.Compare(a[0].Value, b[0].Value) })
		n.Content = n.Content[:0]
		for _, kv := range pairs {
			n.Content = append(n.Content, kv[0], kv[1])
		}
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// stringStyle is the style a string is written in: the one the YAML writer
// gives it as a Go value (quoted where a YAML 1.1 reader, sigs.k8s.io/yaml's,
// would take it for something else, as "n" or "on"; a block when it has
// several lines), but double-quoted when it holds a character the streams
// escape, or starts with a line break: go.yaml.in/yaml/v4 v4.0.0-rc.6 writes
// such a block without the indentation indicator it needs, and it read back
// without its leading spaces, or not at all (review 23).
func stringStyle(s string) yaml.Style {
	if termsafe.Escape(s) != s || strings.HasPrefix(s, "\n") {
		return yaml.DoubleQuotedStyle
	}
	if !mayHaveStyle(s) {
		// Plain, which the writer quotes if it would read as another type.
		return 0
	}
	var as yaml.Node
	if err := as.Encode(s); err != nil {
		return yaml.DoubleQuotedStyle
	}
	return as.Style
}

// mayHaveStyle reports whether the YAML writer may give s a style of its own:
// a string of several lines, and those a YAML 1.1 reader takes for a boolean
// (y, yes, n, no, on, off, in any case), a sexagesimal number (a sign or a
// digit first, and a colon) or the merge key. Asking the writer builds one per
// string, which made the whole output of a list of thousands of decisions
// several times slower; most strings are none of these.
func mayHaveStyle(s string) bool {
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "on", "off", "<<":
		return true
	}
	return strings.Contains(s, "\n") || (strings.Contains(s, ":") && strings.ContainsAny(s[:1], "+-0123456789"))
}

// yamlReadableJSON is the JSON document data with the characters a YAML
// reader refuses escaped. They can only be in its strings: outside them,
// JSON holds ASCII.
func yamlReadableJSON(data []byte) []byte {
	out := make([]byte, 0, len(data))
	for _, r := range string(data) {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0xfffe || r == 0xffff {
			out = fmt.Appendf(out, `\u%04x`, r)
			continue
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// isHuman reports whether -o asks for the command's human form.
func (p *printFlags) isHuman() bool { return slices.Contains(p.human, p.format) }

// print writes obj, a document or a List of them, in the machine format -o
// names.
func (p *printFlags) print(w io.Writer, obj runtime.Object) error {
	if err := p.printer.PrintObj(obj, w); err != nil {
		return fmt.Errorf("-o %s: %w", p.format, err)
	}
	return nil
}

// tablePrinter is the printer of the table and wide forms. One printer
// prints the header once for all the tables given to it with the same
// columns, so that rows printed as they come (decisions list --follow) are
// one table.
func (p *printFlags) tablePrinter() printers.ResourcePrinter {
	return printers.NewTablePrinter(printers.PrintOptions{Wide: p.format == outputWide})
}

// printTable writes t in the table or wide form.
func (p *printFlags) printTable(w io.Writer, t *metav1.Table) error {
	return p.tablePrinter().PrintObj(t, w)
}

// newTable is a table with columns, then the wide columns, which only -o
// wide shows. The printer writes the names in upper case.
func newTable(columns []string, wide ...string) *metav1.Table {
	t := &metav1.Table{}
	for _, c := range columns {
		t.ColumnDefinitions = append(t.ColumnDefinitions, metav1.TableColumnDefinition{Name: c, Type: "string"})
	}
	for _, c := range wide {
		t.ColumnDefinitions = append(t.ColumnDefinitions, metav1.TableColumnDefinition{Name: c, Type: "string", Priority: 1})
	}
	return t
}

// addRow adds a row of cells to t, one for each column. Every cell is
// escaped and kept to its line (termsafe.EscapeLine), an empty one written
// "-": the values are what requesters and log writers wrote, and a newline or
// a tab in one must neither add a row nor move a column (cli-runtime's table
// printer would cut the cell at a newline, and hide the rest).
func addRow(t *metav1.Table, cells ...string) {
	row := metav1.TableRow{Cells: make([]any, len(cells))}
	for i, c := range cells {
		row.Cells[i] = cell(c)
	}
	t.Rows = append(t.Rows, row)
}

// cell is s as a table cell: escaped, kept to its line, "-" when empty.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return termsafe.EscapeLine(s)
}

// line is s kept to the line it is printed in, in a command's text (the
// streams escape what a terminal would act on, but cannot tell a newline a
// value carries from one that lays the text out).
func line(s string) string { return termsafe.EscapeLine(s) }

// document is v, a command's output, as the printers print it: an object of
// kind in cliAPIVersion whose fields are v's JSON, named name (when it has
// one) in namespace (when it has one).
func document(kind, namespace, name string, v any) (*unstructured.Unstructured, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	u := &unstructured.Unstructured{}
	// apimachinery's decoder keeps integers int64, as Unstructured needs.
	if err := utiljson.Unmarshal(b, &u.Object); err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	u.SetAPIVersion(cliAPIVersion)
	u.SetKind(kind)
	if name != "" {
		u.SetName(name)
	}
	if namespace != "" {
		u.SetNamespace(namespace)
	}
	return u, nil
}

// documentList is items as one v1 List, as kubectl prints several objects.
func documentList(items []unstructured.Unstructured) *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{Items: items}
	if l.Items == nil {
		l.Items = []unstructured.Unstructured{}
	}
	l.SetAPIVersion("v1")
	l.SetKind("List")
	return l
}

// escapedNames is cli-runtime's name printer given names escaped and kept to
// their line: a name with a newline would otherwise print as two names.
type escapedNames struct{ printers.ResourcePrinter }

func (p escapedNames) PrintObj(obj runtime.Object, w io.Writer) error {
	if l, ok := obj.(*unstructured.UnstructuredList); ok {
		for i := range l.Items {
			if err := p.PrintObj(&l.Items[i], w); err != nil {
				return err
			}
		}
		return nil
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		named := &unstructured.Unstructured{}
		named.SetGroupVersionKind(u.GroupVersionKind())
		named.SetName(termsafe.EscapeLine(u.GetName()))
		obj = named
	}
	return p.ResourcePrinter.PrintObj(obj, w)
}

// escapedText is cli-runtime's JSONPath printer given every string of the
// document (and every key) escaped and kept to its line: a template prints
// the values it reaches as text, so a CSR name or a decision id with a
// newline would otherwise print as two, which a script reading a line each
// would act on. jsonpath-as-json needs none of it: its JSON escapes them.
type escapedText struct{ printers.ResourcePrinter }

func (p escapedText) PrintObj(obj runtime.Object, w io.Writer) error {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		obj = &unstructured.Unstructured{Object: escapedStrings(o.Object).(map[string]any)}
	case *unstructured.UnstructuredList:
		l := &unstructured.UnstructuredList{Object: escapedStrings(o.Object).(map[string]any)}
		for _, item := range o.Items {
			l.Items = append(l.Items, unstructured.Unstructured{Object: escapedStrings(item.Object).(map[string]any)})
		}
		obj = l
	default:
		return fmt.Errorf("print %T as text: only documents are printed", obj)
	}
	return p.ResourcePrinter.PrintObj(obj, w)
}

// escapedStrings is a copy of a decoded document with every string and key
// passed through termsafe.EscapeLine.
func escapedStrings(v any) any {
	switch v := v.(type) {
	case string:
		return termsafe.EscapeLine(v)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[termsafe.EscapeLine(k)] = escapedStrings(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = escapedStrings(e)
		}
		return out
	default:
		return v
	}
}

// addRetiredOutput keeps -o on a command where it named a file, hidden,
// so that the old command line is refused with the flag to use (retired).
func addRetiredOutput(f *pflag.FlagSet) {
	var v string
	f.StringVarP(&v, "output", "o", "", "")
	_ = f.MarkHidden("output")
}

// retired refuses -o on a command that takes no output format: it prints no
// document, or one of its own kind as it is (render's Talos patch).
func retired(cmd *cobra.Command, fileFlag string) error {
	if !cmd.Flags().Changed("output") {
		return nil
	}
	v, _ := cmd.Flags().GetString("output")
	return usage.Errorf("-o %q: -o is an output format in ichor, as in kubectl, and this command takes none; the file to write is %s", v, fileFlag)
}
