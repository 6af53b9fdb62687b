package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A shadow bundle that gives the same reasons in another order agrees: a
// drifted audit lists what drifted first since review 197C F3, and a shadow
// from before it counted a disagreement for each drift whose node was not
// read (review 200 F7). Another set of codes, or another action, disagrees.
func TestAShadowsReasonsInAnotherOrderAgree(t *testing.T) {
	active := verdict{Action: "drifted", Codes: []string{"CertificateNotIssuedByClusterCA", "CertificateNodeUnreadable"}}
	assert.True(t, active.sameAs(verdict{Action: "drifted", Codes: []string{"CertificateNodeUnreadable", "CertificateNotIssuedByClusterCA"}}))
	assert.False(t, active.sameAs(verdict{Action: "drifted", Codes: []string{"CertificateNodeUnreadable"}}))
	assert.False(t, active.sameAs(verdict{Action: "unknown", Codes: active.Codes}))
	assert.Equal(t, []string{"CertificateNotIssuedByClusterCA", "CertificateNodeUnreadable"}, active.Codes, "the verdict's own order is kept for the log")
}
