package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The log lines of a failed upload name the service, never a password its
// URL holds (review of 2026-12-05).
func TestTheServicesURLIsLoggedWithoutItsPassword(t *testing.T) {
	assert.Equal(t, "https://ichor:xxxxx@decisions.example.com/v1", redactedURL("https://ichor:s3cret@decisions.example.com/v1"))
	assert.Equal(t, "https://decisions.example.com", redactedURL("https://decisions.example.com"))
	assert.Equal(t, "(an unparsable URL)", redactedURL("https://ichor:s3cret@decisions.example.com:port\x7f"))
}
