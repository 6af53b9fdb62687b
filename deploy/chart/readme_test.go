package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	yaml "go.yaml.in/yaml/v4"
)

// The README's values table lies between these markers; the rest of the
// README is written by hand.
const (
	valuesBegin = "<!-- values: generated from values.yaml by `go test ./deploy/chart -run TestREADME -args -update` -->"
	valuesEnd   = "<!-- end of values -->"
)

// TestREADMEValuesTableIsValuesYAML keeps the README's values table (what
// `helm show readme` prints) the values.yaml it describes: every value, its
// default and its `# --` comment. `-args -update` writes it again.
func TestREADMEValuesTableIsValuesYAML(t *testing.T) {
	readmePath := filepath.Join(chartDir(t), "README.md")
	readme := string(readFile(t, readmePath))
	begin, end := strings.Index(readme, valuesBegin), strings.Index(readme, valuesEnd)
	require.True(t, begin >= 0 && end > begin, "README.md has no values table between %q and %q", valuesBegin, valuesEnd)
	want := readme[:begin] + valuesBegin + "\n\n" + valuesTable(t, readFile(t, filepath.Join(chartDir(t), "values.yaml"))) + "\n" + readme[end:]
	if *update {
		require.NoError(t, os.WriteFile(readmePath, []byte(want), 0o644)) //nolint:gosec // a file of the repository
		return
	}
	assert.Equal(t, want, readme, "README.md's values table differs from values.yaml: go test ./deploy/chart -run TestREADME -args -update")
}

// TestThePackagedChartHasItsREADME: `helm show readme` of the packaged chart
// prints the README (it printed nothing before there was one).
func TestThePackagedChartHasItsREADME(t *testing.T) {
	dir := t.TempDir()
	helm(t, nil, "package", chartDir(t), "--destination", dir)
	tgz, err := filepath.Glob(filepath.Join(dir, "ichor-policy-*.tgz"))
	require.NoError(t, err)
	require.Len(t, tgz, 1)
	out := string(helm(t, nil, "show", "readme", tgz[0]))
	assert.Contains(t, out, "# ichor-policy")
	assert.Contains(t, out, "| `networkPolicy.enabled` | `false` |")
}

// valuesTable is the Markdown table of values.yaml: one row per value, or per
// map whose key carries a `# --` comment (its default shown whole), with
// the comment as its description.
func valuesTable(t *testing.T, values []byte) string {
	t.Helper()
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(values, &doc))
	require.Len(t, doc.Content, 1)
	var b strings.Builder
	b.WriteString("| value | default | description |\n|---|---|---|\n")
	walkValues(t, &b, "", doc.Content[0])
	return b.String()
}

func walkValues(t *testing.T, b *strings.Builder, prefix string, m *yaml.Node) {
	t.Helper()
	require.Equal(t, yaml.MappingNode, m.Kind, "%s is not a map", prefix)
	lastDocumented := ""
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, val := m.Content[i], m.Content[i+1]
		path := key.Value
		if prefix != "" {
			path = prefix + "." + key.Value
		}
		desc := valueComment(key.HeadComment)
		if val.Kind == yaml.MappingNode && len(val.Content) > 0 && desc == "" {
			walkValues(t, b, path, val)
			continue
		}
		if desc == "" && lastDocumented != "" {
			desc = fmt.Sprintf("See `%s`.", lastDocumented)
		} else if desc != "" {
			lastDocumented = path
		}
		fmt.Fprintf(b, "| `%s` | `%s` | %s |\n", path, defaultOf(t, val), strings.ReplaceAll(desc, "|", `\|`))
	}
}

// valueComment is the text of a key's `# --` comment (helm-docs'
// convention), from that marker on, as one line; "" if it has none.
func valueComment(head string) string {
	var words []string
	started := false
	for _, line := range strings.Split(head, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if rest, ok := strings.CutPrefix(line, "-- "); ok {
			started, words = true, nil
			line = rest
		}
		if started && line != "" {
			words = append(words, line)
		}
	}
	return strings.Join(words, " ")
}

// defaultOf is a value's default as it would be written on a command line:
// a scalar as it is, a list or a map as compact JSON.
func defaultOf(t *testing.T, n *yaml.Node) string {
	t.Helper()
	if n.Kind == yaml.ScalarNode {
		if n.Value == "" {
			return `""`
		}
		return n.Value
	}
	var v any
	require.NoError(t, n.Decode(&v))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	return strings.TrimSpace(buf.String())
}
