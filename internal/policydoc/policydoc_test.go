package policydoc_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/internal/policydoc"
)

func TestReasonCodesAreTheDocumentedOnes(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	pkgs, err := policydoc.Collect(b)
	require.NoError(t, err)
	require.NoError(t, policydoc.CheckCodes(pkgs))
	var codes []string
	for _, p := range pkgs {
		for _, r := range p.Reasons {
			codes = append(codes, r.Code)
		}
	}
	assert.Contains(t, codes, "IPNotNode")
	assert.Contains(t, codes, "MachineUnknown")

	// Every entrypoint the Go side evaluates is documented as one.
	var entrypoints []string
	for _, p := range pkgs {
		for _, e := range p.Entrypoints {
			entrypoints = append(entrypoints, e.Path)
		}
	}
	assert.Subset(t, entrypoints, []string{
		"ichor/kubelet_serving/decision", "ichor/kubelet_client/decision",
		"ichor/credentials/requirements", "ichor/credentials/admission", "ichor/credentials/issuance",
		"ichor/rbac/violations", "system/log/mask",
	})
}

func TestCheckCodesCatchesADriftedCode(t *testing.T) {
	err := policydoc.CheckCodes([]policydoc.Package{{Path: "data.x", Reasons: []policydoc.Reason{{
		Code: "Documented", Outcome: "deny", Source: `deny contains r if { r := {"code": "Emitted", "message": "m"} }`,
	}}}})
	assert.ErrorContains(t, err, `documents code "Documented" but emits`)
}

// The reference in docs/ is what `make docs` writes from the rules.
func TestPolicyReferenceIsCurrent(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	pkgs, err := policydoc.Collect(b)
	require.NoError(t, err)
	want := policydoc.Markdown(pkgs, b.Manifest.Revision)
	got, err := os.ReadFile("../../docs/policy.md")
	require.NoError(t, err, "run make docs")
	assert.Equal(t, want, string(got), "docs/policy.md is stale: run make docs")
}
