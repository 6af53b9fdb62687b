package termsafe

import (
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// ErrorText is err's message with every message an API server answered
// within it kept to its line. An escaping writer lets newlines through, which
// lay out ichor's own errors; a server's answer (a webhook's denial, a policy
// engine's list of violations, a status any client wrote) with one could add
// a line that reads as ichor's own, above what kubectl says of its exec
// plugin (reviews 234 F1, 237 F4).
func ErrorText(err error) string {
	text := err.Error()
	// Every byte any occurrence of any message covers, overlapping ones
	// too, is the server's: replacing one message after another left the
	// newline of an occurrence that began inside another's unescaped
	// (reviews 243 F5, 244 F1).
	theirs := make([]bool, len(text))
	for _, m := range apiMessages(err, nil) {
		if m == "" {
			continue
		}
		for from := 0; ; {
			i := strings.Index(text[from:], m)
			if i < 0 {
				break
			}
			for j := from + i; j < from+i+len(m); j++ {
				theirs[j] = true
			}
			from += i + 1
		}
	}
	var b strings.Builder
	for start := 0; start < len(text); {
		end := start
		for end < len(text) && theirs[end] == theirs[start] {
			end++
		}
		if theirs[start] {
			b.WriteString(EscapeLine(text[start:end]))
		} else {
			b.WriteString(text[start:end])
		}
		start = end
	}
	return b.String()
}

// apiMessages are the messages of every API status in err's chain, joined
// errors' included.
func apiMessages(err error, into []string) []string {
	if err == nil {
		return into
	}
	if status, ok := err.(apierrors.APIStatus); ok { //nolint:errorlint // each error of the chain is looked at, below
		into = append(into, status.Status().Message)
	}
	switch u := err.(type) { //nolint:errorlint // walking the chain by hand, as errors.As does
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			into = apiMessages(e, into)
		}
	case interface{ Unwrap() error }:
		into = apiMessages(u.Unwrap(), into)
	}
	return into
}
