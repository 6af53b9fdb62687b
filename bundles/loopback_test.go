package bundles_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// A credential goes over plain http only to this host's loopback: the
// loopback in each way a URL's host may be written, and nothing else (review
// of 2026-12-06: "[::1]" without a port was taken for no loopback, and the
// manager refused what the chart rendered).
func TestOnlyTheLoopbackIsTheLoopback(t *testing.T) {
	for _, host := range []string{"localhost", "LOCALHOST:5000", "127.0.0.1", "127.0.0.1:8181", "127.3.2.1", "[::1]", "[::1]:8181", "::1"} {
		assert.True(t, bundles.OnLoopback(host), host)
	}
	for _, host := range []string{"", "127.1", "127.0.0.1.", "127.0.0.1.example.com", "localhost.example.com", "10.0.0.1:80", "[::2]", "[::ffff:10.0.0.1]", "0.0.0.0", "[::]:80"} {
		assert.False(t, bundles.OnLoopback(host), host)
	}
}
