// Package termsafetest holds the hostile strings the CLI's tests print, and
// the check that nothing a terminal would obey reaches the output.
package termsafetest

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Hostile are the strings an attacker puts where an operator will read them
// (a CSR's common name, a SAN, a reason's message, a decision log written by
// hand), and how each reads once escaped.
var Hostile = []struct {
	Name, In, Want string
}{
	{"clear screen", "worker-1\x1b[2J\x1b[H", "worker-1^[[2J^[[H"},
	{"window title", "\x1b]0;owned\x07worker-1", "^[]0;owned\\u0007worker-1"},
	{"carriage return overwrite", "evil\rworker-1", `evil\rworker-1`},
	{"colour", "\x1b[31mred\x1b[0m", "^[[31mred^[[0m"},
	{"C1 CSI as UTF-8", "a\u009b2Jb", `a\u009b2Jb`},
	{"C1 CSI as a raw byte", "a\x9b2Jb", `a\ufffd2Jb`},
	{"bidi override", "worker-\u202e1-evil", `worker-\u202e1-evil`},
	{"bidi isolate", "\u2067x\u2069", `\u2067x\u2069`},
	{"backspace", "approve\b\b\b\b\b\b\bdeny", `approve\u0008\u0008\u0008\u0008\u0008\u0008\u0008deny`},
	{"delete", "a\x7fb", `a\u007fb`},
	{"line separator", "a\u2028b", `a\u2028b`},
	{"tag character", "a\U000E0041b", `a\udb40\udc41b`},
	{"a cut sequence", "a\xe2\x80", `a\ufffd\ufffd`},
	{"invisible letter", "alice\u3164", `alice\u3164`},
	{"combining grapheme joiner", "worker-1\u034f", `worker-1\u034f`},
	{"variation selector", "a\ufe0fb\U000E0100c", `a\ufe0fb\udb40\udd00c`},
}

// Node is a node name that tries every trick at once: what a CSR's common
// name can carry (valid UTF-8, as the API server's parser requires).
const Node = "evil\x1b[2J\x1b[H\x1b]0;owned\x07\rworker-1\u009b31m\u202e1-rekrow\x1b[0m"

// NodeEscaped is how Node reads in the CLI's output.
const NodeEscaped = `evil^[[2J^[[H^[]0;owned\u0007\rworker-1\u009b31m\u202e1-rekrow^[[0m`

// Controls are the characters of s a terminal would act on: every control
// but newline and tab, DEL, C1, the bidi controls, the line and paragraph
// separators, the tag characters, the graphic characters drawn as nothing
// (default-ignorable: U+034F, the Hangul fillers, the variation selectors),
// and invalid UTF-8 (reported as U+FFFD).
func Controls(s string) []rune {
	var found []rune
	for i, r := range s {
		switch {
		case r == '\n' || r == '\t':
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\ufffd"),
			r < 0x20, r >= 0x7f && r < 0xa0, r >= 0xe0000 && r < 0xe0080,
			r == 0x34f, r == 0x115f, r == 0x1160, r == 0x3164, r == 0xffa0,
			r >= 0x17b4 && r <= 0x17b5, r >= 0x180b && r <= 0x180d,
			r >= 0xfe00 && r <= 0xfe0f, r >= 0xe0100 && r <= 0xe01ef,
			strings.ContainsRune("\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069", r):
			found = append(found, r)
		}
	}
	return found
}

// AssertInert fails the test when out holds anything a terminal would act on.
func AssertInert(t testing.TB, out string) {
	t.Helper()
	if c := Controls(out); len(c) > 0 {
		t.Errorf("%d control characters reach the terminal (%q) in:\n%q", len(c), string(c), out)
	}
}
