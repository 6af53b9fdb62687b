package termsafe_test

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/termsafe/termsafetest"
)

func TestEscapeLeavesHonestTextAlone(t *testing.T) {
	for _, s := range []string{
		"", "worker-1", `node "worker-1" (machine "worker-1")`, "IP address 10.5.0.3 is not one of [\"10.5.0.4\"]",
		"approve → deny", "naïve Ünïcödé 日本語 😀", "tab\tand\nnewline", "a\u00a0no-break space", "\ufffd",
	} {
		assert.Equal(t, s, termsafe.Escape(s), "%q", s)
	}
}

func TestEscapeHostileStrings(t *testing.T) {
	for _, c := range termsafetest.Hostile {
		t.Run(c.Name, func(t *testing.T) {
			got := termsafe.Escape(c.In)
			assert.Equal(t, c.Want, got)
			termsafetest.AssertInert(t, got)
		})
	}
}

func TestEscapeLineKeepsAValueOnItsLine(t *testing.T) {
	assert.Equal(t, `worker-1\n2026-01-01T00:00:00Z  forged\trow`, termsafe.EscapeLine("worker-1\n2026-01-01T00:00:00Z  forged\trow"))
	assert.Equal(t, "^[[2J", termsafe.EscapeLine("\x1b[2J"))
}

// A JSON document written through the Writer is the same document: it
// decodes to the very strings it was encoded from, control characters and
// all.
func TestWriterKeepsJSONExact(t *testing.T) {
	var values []string
	for _, c := range termsafetest.Hostile {
		if utf8.ValidString(c.In) {
			values = append(values, c.In)
		}
	}
	doc, err := json.MarshalIndent(map[string]any{"values": values}, "", "  ")
	require.NoError(t, err)
	var out bytes.Buffer
	w := termsafe.NewWriter(&out)
	_, err = w.Write(doc)
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	termsafetest.AssertInert(t, out.String())
	var back struct{ Values []string }
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	assert.Equal(t, values, back.Values)
}

// A character cut between two writes (a buffered copy does that) is written
// whole, not as two invalid halves.
func TestWriterJoinsACharacterCutBetweenWrites(t *testing.T) {
	var out bytes.Buffer
	w := termsafe.NewWriter(&out)
	in := []byte("é\u202e日😀")
	for i := range in {
		_, err := w.Write(in[i : i+1])
		require.NoError(t, err)
	}
	require.NoError(t, w.Flush())
	assert.Equal(t, `é\u202e日😀`, out.String())

	out.Reset()
	_, err := w.Write([]byte("cut \xe6\x97"))
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	assert.Equal(t, `cut \ufffd\ufffd`, out.String())
}

func TestTheTestNodeIsAllTricks(t *testing.T) {
	assert.Equal(t, termsafetest.NodeEscaped, termsafe.Escape(termsafetest.Node))
	assert.Len(t, termsafetest.Controls(termsafetest.Node), 8, "ESC four times, BEL, CR, CSI, RLO")
}

// The Writer writes what Escape makes of each write, hostile or honest, and
// an honest line (every decision-log line) without a copy of it.
func TestWriterWritesWhatEscapeMakes(t *testing.T) {
	ins := []string{"", "worker-1\n", `{"msg":"Decision Log","input":{"csr":{"name":"csr-1"}}}` + "\n", "\ufffd", "naïve 😀\t"}
	for _, c := range termsafetest.Hostile {
		ins = append(ins, c.In)
	}
	for _, in := range ins {
		var out bytes.Buffer
		w := termsafe.NewWriter(&out)
		n, err := w.Write([]byte(in))
		require.NoError(t, err)
		require.NoError(t, w.Flush())
		assert.Equal(t, len(in), n)
		assert.Equal(t, termsafe.Escape(in), out.String(), "%q", in)
	}

	line := bytes.Repeat([]byte(`{"input":{"csr":{"name":"csr-1","usages":["server auth"]}}} `), 50)
	w := termsafe.NewWriter(io.Discard)
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = w.Write(line)
	})
	assert.Zero(t, allocs, "an honest line is written as it is")
}
