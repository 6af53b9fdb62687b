package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A URL carried into an exec kubeconfig may hold no user: in any spelling a
// password can take, a URL without a scheme (an opaque one to Go) included
// (reviews 253 F3, 258 F9).
func TestAURLWithAUserIsToldInAnySpelling(t *testing.T) {
	for raw, want := range map[string]bool{
		"http://proxy.example:3128":       false,
		"https://api.example:6443":        false,
		"socks5://127.0.0.1:1080":         false,
		"http://me:pw@proxy.example:3128": true,
		"http://me@proxy.example:3128":    true,
		"me:pw@proxy.example:3128":        true,
		"https://api.example:6443/a@b":    true,
		"http://proxy example:3128":       true,
		"http://[::1]:3128":               false,
	} {
		assert.Equal(t, want, urlHasUser(raw), raw)
	}
}
