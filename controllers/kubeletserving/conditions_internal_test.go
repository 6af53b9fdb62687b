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

// TestNameSomeBoundsTheMachinesAConditionNames: a cluster of thousands of
// machines waiting for certificates (a new cluster, a mass reboot) must not
// make KubeletServingCertificates larger than the API server accepts.
func TestNameSomeBoundsTheMachinesAConditionNames(t *testing.T) {
	assert.Equal(t, "a, b", nameSome([]string{"a", "b"}, 2))
	names := make([]string, 5000)
	for i := range names {
		names[i] = strings.Repeat("m", 63)
	}
	got := nameSome(names, maxNamedMachines)
	assert.True(t, strings.HasSuffix(got, " and 4980 more"), got)
	assert.Less(t, len(got), maxConditionMessage)
}
