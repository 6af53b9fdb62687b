package manualact_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/manualact"
)

// Review 4, R1: a person's verdict whose message ends as an approver's
// ("(decision ID, policy revision R)") would be taken for Ichor's, and
// recorded as no one's act. The webhook refuses it; the same verdict
// without that ending is stored and recorded as the person's.
func TestAVerdictPassedOffAsIchorsIsRefused(t *testing.T) {
	re := startRecEnv(t)
	c := re.csr(t, "csr-mimic")
	mimic := "looks fine (decision 00000000-0000-0000-0000-000000000000, policy revision x)"
	require.True(t, manualact.ReadsAsIchors(mimic))

	out := re.ichor(t, 1, "approve", c.Name, "--message", mimic, "--kubeconfig", re.ada)
	assert.Contains(t, out, "only Ichor writes")
	after := re.env.GetCSR(t, c.Name)
	assert.Empty(t, after.Status.Conditions, "the refused verdict is not stored")

	re.ichor(t, 0, "approve", c.Name, "--message", "looks fine", "--kubeconfig", re.ada)
	re.flush(t)
	recs := re.records("csr/" + c.Name)
	require.Len(t, recs, 1, "the person's verdict is recorded once")
	assert.Equal(t, "ada", recs[0].Result.Actor)
}
