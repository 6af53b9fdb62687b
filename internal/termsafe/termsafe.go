// Package termsafe keeps the strings others wrote from acting on an
// operator's terminal.
//
// A CSR's common name, its SANs, a requester's user name, a reason's message
// that quotes them, a decision log anyone could have written: the CLI prints
// them all, and a control sequence among them (ESC [2J clears the screen,
// ESC ]0;...BEL retitles the window, \r overwrites the line before it, a C1
// CSI U+009B or a bidi override U+202E reorders what is read) would be obeyed
// by the terminal, not shown. kubectl answers the same threat
// (CVE-2021-25743) with k8s.io/cli-runtime's printers.EscapeTerminal, which
// is applied first here, so that ESC and \r read as they do in kubectl's
// output (^[ and \r). That function covers only those two; every other
// character that is not graphic (the rest of C0, DEL, C1, the bidi and other
// format characters, line and paragraph separators, unassigned code points,
// invalid UTF-8) or is drawn as nothing is written as a JSON escape, \u009b or \u202e, so that the
// same writer keeps a JSON document the same document (raw C0 cannot appear
// in one, and a \u escape inside a JSON string decodes to the very rune it
// replaced).
package termsafe

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"k8s.io/cli-runtime/pkg/printers"
)

// safe says whether r is written as it is. Newline and tab lay text out;
// every other character must be graphic (a letter, mark, number,
// punctuation, symbol or space separator) and visible: some graphic
// characters are default-ignorable, drawn as nothing (the combining grapheme
// joiner U+034F, the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, the
// variation selectors), so "alice" followed by one reads as "alice".
func safe(r rune) bool {
	if r < utf8.RuneSelf {
		// ASCII, every byte of a decision-log line: no table lookup.
		return r == '\n' || r == '\t' || (r >= 0x20 && r < 0x7f)
	}
	return r != utf8.RuneError && strconv.IsGraphic(r) && !unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// Escape is s as it is safe to print on a terminal; s unchanged when it holds
// nothing to escape.
func Escape(s string) string {
	s = printers.EscapeTerminal(s)
	// Invalid UTF-8 decodes as U+FFFD, which safe refuses, so a string
	// this finds nothing in is valid and has nothing to escape.
	if strings.IndexFunc(s, unsafeRune) < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if safe(r) || (r == utf8.RuneError && size == 3) {
			// A U+FFFD written in the text is graphic.
			b.WriteString(s[:size])
		} else {
			writeEscape(&b, r)
		}
		s = s[size:]
	}
	return b.String()
}

// EscapeLine is Escape for a value printed inside a line, a table's cell or a
// field: its newlines and tabs are escaped too, so that a value can neither
// start a line of its own nor move the columns after it.
func EscapeLine(s string) string {
	if strings.ContainsAny(s, "\n\t") {
		s = strings.NewReplacer("\n", `\n`, "\t", `\t`).Replace(s)
	}
	return Escape(s)
}

// writeEscape writes r as a JSON escape: invalid UTF-8 as U+FFFD, which is
// what a JSON decoder reads for it, and a rune beyond the BMP as its UTF-16
// surrogate pair.
func writeEscape(b *strings.Builder, r rune) {
	if r > 0xffff {
		r1, r2 := utf16.EncodeRune(r)
		fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
		return
	}
	fmt.Fprintf(b, `\u%04x`, r)
}

// Writer escapes what is written to it: every command's standard output and
// error. It is safe for concurrent use (the manager's loggers share one), and
// each Write reaches w in one Write, so lines written whole stay whole.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
	// partial is the start of a UTF-8 sequence that the last Write cut,
	// kept until the next one completes it.
	partial []byte
}

// NewWriter returns a Writer writing to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write escapes p and writes it. A multi-byte character cut between two
// writes is written whole with the second; Flush writes what is left.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	if len(w.partial) > 0 {
		p = append(w.partial, p...)
		w.partial = nil
	}
	if cut := incompleteTail(p); cut > 0 {
		w.partial = append([]byte(nil), p[len(p)-cut:]...)
		p = p[:len(p)-cut]
	}
	// Most of what is written (every decision-log line) has nothing to
	// escape: it goes out as it came, without a copy of each line.
	if bytes.IndexFunc(p, unsafeRune) < 0 {
		if _, err := w.w.Write(p); err != nil {
			return 0, err
		}
		return n, nil
	}
	if _, err := io.WriteString(w.w, Escape(string(p))); err != nil {
		return 0, err
	}
	return n, nil
}

// unsafeRune is !safe; ESC and \r, which EscapeTerminal rewrites, are not safe
// either, so text without an unsafe rune is what Escape leaves alone.
func unsafeRune(r rune) bool { return !safe(r) }

// Escaped says whether Escape writes the character r of valid UTF-8
// otherwise than as it is; a U+FFFD written in the text is kept.
func Escaped(r rune) bool { return r != utf8.RuneError && !safe(r) }

// Flush writes a cut sequence that no write completed, escaped as the
// invalid UTF-8 it is.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) == 0 {
		return nil
	}
	p := w.partial
	w.partial = nil
	_, err := io.WriteString(w.w, Escape(string(p)))
	return err
}

// incompleteTail is how many bytes at the end of p start a UTF-8 sequence
// that p does not finish: 0 to 3.
func incompleteTail(p []byte) int {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(p); i++ {
		c := p[len(p)-i]
		if c < utf8.RuneSelf {
			return 0
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(p[len(p)-i:]) {
				return 0
			}
			return i
		}
	}
	return 0
}
