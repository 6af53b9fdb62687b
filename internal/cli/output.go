package cli

import (
	"io"
	"strings"

	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// The streams escape what a terminal would act on (see streams); what they
// cannot tell is a newline or a tab that a value carries from one that lays
// the output out. A value printed inside a line goes through row or line, so
// that a node name with a newline cannot forge a row of a table, nor a tab
// move the columns after it.

// row writes one row of a table (to a tabwriter): the cells, each kept to
// its line, separated by tabs.
func row(w io.Writer, cells ...string) {
	for i, c := range cells {
		cells[i] = line(c)
	}
	_, _ = io.WriteString(w, strings.Join(cells, "\t")+"\n")
}

// line is s kept to the line it is printed in.
func line(s string) string { return termsafe.EscapeLine(s) }
