package termsafe

import (
	"slices"
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
	messages := apiMessages(err, nil)
	// The longest first: a message that holds another is escaped whole,
	// not broken by the other's escape first (review 243 F5).
	slices.SortFunc(messages, func(a, b string) int { return len(b) - len(a) })
	for _, m := range messages {
		if m != "" {
			text = strings.ReplaceAll(text, m, EscapeLine(m))
		}
	}
	return text
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
