package kubeletserving

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// TestTruncateKeepsAConditionMessageValid: Ready repeats another
// condition's message after a prefix, so it may exceed the API server's
// limit; the cut is within it and never splits a character.
func TestTruncateKeepsAConditionMessageValid(t *testing.T) {
	assert.Equal(t, "short", truncate("short", 10))
	long := strings.Repeat("é", maxConditionMessage)
	got := truncate(long, maxConditionMessage)
	assert.LessOrEqual(t, len(got), maxConditionMessage)
	assert.True(t, utf8.ValidString(got))
	assert.True(t, strings.HasSuffix(got, "..."))
}
