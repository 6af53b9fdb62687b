package jsonappend_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/jsonappend"
)

// Every generic document, filled at random, is written byte for byte as
// json.Marshal writes it.
func TestTheBytesAreEncodingJSONs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // a reproducible source of test documents, not a secret
	for i := range 3000 {
		v := document(r, 0)
		assertSame(t, v, "document %d", i)
	}
}

// Each value the walk writes itself, and each it leaves to encoding/json.
func TestEachKindOfValue(t *testing.T) {
	type plain struct {
		A string `json:"a,omitempty"`
		B int    `json:"b"`
	}

	deep := any("bottom")
	for range 600 {
		deep = []any{map[string]any{"k": deep}}
	}

	for name, v := range map[string]any{
		"nil":                         nil,
		"empty string":                "",
		"HTML":                        "<a href='x'>&amp;</a>",
		"controls":                    "\x00\x01\b\f\n\r\t\x1f\x7f",
		"quote and backslash":         `"\`,
		"invalid UTF-8":               "a\xffb\xc3(\xe2\x82",
		"line separators":             "a\u2028b\u2029c",
		"multibyte":                   "é 漢字 🙂",
		"true":                        true,
		"false":                       false,
		"integer number":              json.Number("-120"),
		"zero number":                 json.Number("0"),
		"decimal number":              json.Number("1.5e3"),
		"empty number":                json.Number(""),
		"int":                         -7,
		"int64":                       int64(math.MinInt64),
		"uint64":                      uint64(math.MaxUint64),
		"int32 (encoding/json)":       int32(5),
		"float (encoding/json)":       1e21,
		"nil map":                     map[string]any(nil),
		"empty map":                   map[string]any{},
		"nil list":                    []any(nil),
		"empty list":                  []any{},
		"nil string map":              map[string]string(nil),
		"string map":                  map[string]string{"b": "<", "a": "\xff"},
		"nil string list":             []string(nil),
		"string list":                 []string{"&", ""},
		"struct":                      plain{B: 2},
		"time":                        time.Date(2026, 12, 4, 13, 0, 0, 5, time.UTC),
		"pointer":                     &plain{A: "x"},
		"nested deeper than the walk": deep,
	} {
		assertSame(t, v, name)
	}
}

// What encoding/json refuses is refused, with its error: an invalid number,
// a float it cannot write, a map that holds itself.
func TestWhatEncodingJSONRefusesIsRefused(t *testing.T) {
	cycle := map[string]any{}
	cycle["self"] = cycle

	for name, v := range map[string]any{
		"invalid number":   map[string]any{"n": json.Number("1x")},
		"leading zeros":    []any{json.Number("012")},
		"NaN":              map[string]any{"f": math.NaN()},
		"a map in a cycle": cycle,
	} {
		_, want := json.Marshal(v)
		require.Error(t, want, name)

		_, err := jsonappend.Value(nil, v)
		assert.EqualError(t, err, want.Error(), name)
	}
}

// It appends to what dst holds.
func TestItAppends(t *testing.T) {
	got, err := jsonappend.Value([]byte("x="), map[string]any{"a": []any{"b"}})
	require.NoError(t, err)
	assert.Equal(t, `x={"a":["b"]}`, string(got))
}

func FuzzTheBytesAreEncodingJSONs(f *testing.F) {
	for _, s := range []string{"", "a<b>&c", "\xff\xfe", "\u2028", "\x00\"\\", "0", "-1", "01", "1.5"} {
		f.Add(s, s)
	}

	f.Fuzz(func(t *testing.T, key, value string) {
		assertSame(t, map[string]any{key: value, value: []any{key, json.Number(value)}}, "fuzzed")
		assertSame(t, map[string]string{key: value}, "fuzzed string map")
	})
}

func assertSame(t *testing.T, v any, msgAndArgs ...any) {
	t.Helper()

	want, wantErr := json.Marshal(v)
	got, err := jsonappend.Value(nil, v)

	if wantErr != nil {
		require.EqualError(t, err, wantErr.Error(), msgAndArgs...)

		return
	}

	require.NoError(t, err, msgAndArgs...)
	require.Equal(t, string(want), string(got), msgAndArgs...)
}

// document is a generic document of the kinds a decision-log entry holds,
// and a few the walk leaves to encoding/json.
func document(r *rand.Rand, depth int) any {
	kinds := 12
	if depth > 4 {
		kinds = 8 // no more containers
	}

	switch r.IntN(kinds) {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return json.Number(strings.TrimPrefix(numberText(r), "+"))
	case 3:
		return r.Int64() - r.Int64()
	case 4:
		return r.Float64() * 1e6
	case 5, 6, 7:
		return text(r)
	case 8:
		if r.IntN(5) == 0 {
			return map[string]any(nil)
		}

		m := map[string]any{}
		for range r.IntN(6) {
			m[text(r)] = document(r, depth+1)
		}

		return m
	case 9:
		if r.IntN(5) == 0 {
			return []any(nil)
		}

		l := []any{}
		for range r.IntN(6) {
			l = append(l, document(r, depth+1))
		}

		return l
	case 10:
		m := map[string]string{}
		for range r.IntN(4) {
			m[text(r)] = text(r)
		}

		return m
	default:
		return []string{text(r), text(r)}
	}
}

func numberText(r *rand.Rand) string {
	return []string{"0", "-0", "17", "-42", "9007199254740993", "1.25", "-3e10", "1E+2"}[r.IntN(8)]
}

// text is a short string of bytes JSON treats specially, ASCII and
// multibyte characters, and bytes that are not UTF-8.
func text(r *rand.Rand) string {
	pieces := []string{"a", "Z", " ", "<", ">", "&", `"`, `\`, "\n", "\t", "\x00", "\x1f", "\x7f", "é", "漢", "🙂", "\u2028", "\u2029", "\xff", "\xc3", "\xe2\x82", "/", "'"}

	var b strings.Builder
	for range r.IntN(8) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}

	return b.String()
}
