package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// TestKYAMLReadsBackWhatARequesterWroteThroughTheStreams: -o kyaml is
// cli-runtime's KYAML printer behind yamlReadable, written through the
// streams' escaping writer. Whatever a requester puts in a key or a value
// (each character the streams escape, quotes and backslashes beside them,
// several lines, text that looks like KYAML) must read back as it was,
// and the streams must find nothing left to escape. Before, a variation
// selector beyond U+FFFF reached the streams raw and became a surrogate pair
// no YAML reader takes, failing the whole output (review 221 F1), and a key
// of letters with a Hangul filler read back as another key (review 202 F4).
func TestKYAMLReadsBackWhatARequesterWroteThroughTheStreams(t *testing.T) {
	hostile := []string{
		"a\U000E0100b",              // VS17, beyond U+FFFF
		"\u3164scope",               // a letter drawn as nothing
		"x\uffa0.y/z",               // the same, in a key KYAML leaves plain
		"csr-\u202eend",             // a bidi override
		"*csr\u200b",                // a zero-width space
		`a"` + "\u3164" + `b`,       // a quote beside an escaped character
		`ends with \`,               // a backslash before the closing quote
		"\u3164x: y\nz: \"w\"\n",    // KYAML's own syntax, on several lines
		"one\n\U000E0101\ntwo",      // an escaped character on a line of its own
		"\u3164:k",                  // a key KYAML quotes itself
		"-1.5e3", "---", "null", "", // what reads as another type
		// Lines that start with whitespace KYAML escapes, which it marked
		// with a backslash that read back as one (review 222 F1), and
		// with a backslash or whitespace it writes as they are.
		"x\n\u00a0y", "x\n\ry", "x\n\vy", "x\n\u3000y\n\u2028z", "x\n\\y", "x\n y\n\tz",
	}
	obj := map[string]any{"apiVersion": "v1", "kind": "List"}
	extra := map[string]any{}
	var values []any
	for i, s := range hostile {
		extra[s] = []any{s}
		values = append(values, s, float64(i))
	}
	obj["extra"], obj["values"] = extra, values

	var kyaml bytes.Buffer
	w := termsafe.NewWriter(&kyaml)
	require.NoError(t, yamlReadable{&printers.KYAMLPrinter{}}.PrintObj(&unstructured.Unstructured{Object: obj}, w))
	out := kyaml.String()
	assert.Equal(t, termsafe.Escape(out), out, "the streams found something left to escape")

	var back map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(out), &back), out)
	assert.Equal(t, obj, back, out)
}

// TestEscapeForStreamsChangesOnlyWhatTheStreamsEscape: the scanner, on
// KYAML as it is written, keeps in step with its quotes (an escaped quote,
// a backslash ending a string, a folded string) and changes nothing but the
// characters the streams escape and the plain keys that hold one.
func TestEscapeForStreamsChangesOnlyWhatTheStreamsEscape(t *testing.T) {
	for _, c := range []struct{ name, in, want, reads string }{
		{"nothing to escape", "{\n  k: \"v\",\n  n: -1.5e3,\n}\n", "{\n  k: \"v\",\n  n: -1.5e3,\n}\n", ""},
		{"a plain key", "{\n  \u3164k: \"v\",\n}\n", "{\n  \"\\u3164k\": \"v\",\n}\n", ""},
		{"a value with an escaped quote, then a plain key",
			"{\n  k: \"a\\\"\u3164b\",\n  \u3164k: 1,\n}\n", "{\n  k: \"a\\\"\\u3164b\",\n  \"\\u3164k\": 1,\n}\n", ""},
		{"a value ending in a backslash, then a plain key",
			"{\n  k: \"x\\\\\",\n  \u3164k: true,\n}\n", "{\n  k: \"x\\\\\",\n  \"\\u3164k\": true,\n}\n", ""},
		{"a folded value that looks like a key",
			"{\n  k: \"\\\n    \u3164x: \\\"y\\\"\\n\\\n  \",\n}\n", "{\n  k: \"\\\n    \\u3164x: \\\"y\\\"\\n\\\n  \",\n}\n", ""},
		{"a key KYAML quoted", "{\n  \"\u3164:k\": null,\n}\n", "{\n  \"\\u3164:k\": null,\n}\n", ""},
		{"beyond U+FFFF", "---\n{\n  k: [\"a\U000E0100\"],\n}\n", "---\n{\n  k: [\"a\\U000e0100\"],\n}\n", ""},
		{"a folded line marked before an escape", "{\n  k: \"\\\n    x\\n\\\n    \\\\u00a0y\\\n  \",\n}\n",
			"{\n  k: \"\\\n    x\\n\\\n     \\u00a0y\\\n  \",\n}\n", "x\n\u00a0y"},
		{"a folded line starting with a backslash", "{\n  k: \"\\\n    x\\n\\\n     \\\\y\\\n  \",\n}\n",
			"{\n  k: \"\\\n    x\\n\\\n     \\\\y\\\n  \",\n}\n", ""},
		{"a string never closed", "{\n  k: \"\u3164", "{\n  k: \"\\u3164", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := string(escapeForStreams([]byte(c.in)))
			assert.Equal(t, c.want, got)
			assert.Equal(t, termsafe.Escape(got), got, "the streams found something left to escape")
			var back any
			switch {
			case c.reads != "":
				require.NoError(t, yaml.Unmarshal([]byte(got), &back), got)
				assert.Equal(t, map[string]any{"k": c.reads}, back)
			case !strings.HasSuffix(c.name, "never closed"):
				var want any
				require.NoError(t, yaml.Unmarshal([]byte(c.in), &want))
				require.NoError(t, yaml.Unmarshal([]byte(got), &back), got)
				assert.Equal(t, want, back)
			}
		})
	}
}
