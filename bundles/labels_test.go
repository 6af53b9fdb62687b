package bundles_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// OPA v1.22.4's SDK keeps the evaluated-rule tracker of a query's first
// decision in the prepared query it caches (sdk/opa.go, evaluate), so every
// later decision of that query records into that one tracker, from as many
// goroutines as decide at once. With no METADATA labels anywhere the tracker
// only reads (a race on one pointer, set each time to the same value, which
// go test -race reports inside topdown/evaluated.go); with labels it writes
// its maps, and concurrent map writes end the manager. The engine refuses
// such a bundle at activation (engine.ErrBundleLabels), so the shipped policy
// must declare none until OPA fixes it (no later OPA is served here).
func TestTheShippedPolicyDeclaresNoMetadataLabels(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	seen := 0
	for _, m := range b.Modules {
		seen += len(m.Parsed.Annotations)
		for _, a := range m.Parsed.Annotations {
			require.Empty(t, a.Labels, "%s: METADATA labels at %s (OPA's shared tracker would write them from concurrent decisions)", m.Path, a.Location)
		}
	}
	require.NotZero(t, seen, "the bundle's METADATA was read")
}
