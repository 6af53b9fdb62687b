package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A shadow bundle that gives the same reasons after the first in another
// order agrees (review 200 F7); one whose first reason differs does not:
// the first names the verdict, a denial's reason, an audit condition's and
// its Event's (review 201 F5: a drifted audit lists what drifted first since
// review 197C F3, and a shadow from before it names such a verdict
// otherwise). Another set of codes, or another action, disagrees.
func TestAShadowsReasonsInAnotherOrderAgreeButTheFirst(t *testing.T) {
	active := verdict{Action: "drifted", Codes: []string{"CertificateNotIssuedByClusterCA", "CertificateNodeUnreadable", "CertificateExpiresSoon"}}
	assert.True(t, active.sameAs(verdict{Action: "drifted", Codes: []string{"CertificateNotIssuedByClusterCA", "CertificateExpiresSoon", "CertificateNodeUnreadable"}}))
	assert.False(t, active.sameAs(verdict{Action: "drifted", Codes: []string{"CertificateNodeUnreadable", "CertificateNotIssuedByClusterCA", "CertificateExpiresSoon"}}), "another first reason")
	assert.False(t, active.sameAs(verdict{Action: "drifted", Codes: []string{"CertificateNotIssuedByClusterCA", "CertificateNodeUnreadable"}}))
	assert.True(t, verdict{Action: "approve"}.sameAs(verdict{Action: "approve", Codes: []string{}}))
	assert.False(t, active.sameAs(verdict{Action: "unknown", Codes: active.Codes}))
	assert.Equal(t, []string{"CertificateNotIssuedByClusterCA", "CertificateNodeUnreadable", "CertificateExpiresSoon"}, active.Codes, "the verdict's own order is kept for the log")
}
