package engine

import "testing"

// WithoutModuleCheck takes away the check of each module as it is written
// (bundles.CheckModule) for the rest of t: what Commit's check of the
// compiled bundle refuses on its own is seen then. The engine's tests run
// one at a time.
func WithoutModuleCheck(t *testing.T) {
	t.Helper()
	before := moduleCheck
	moduleCheck = func(string, []byte) error { return nil }
	t.Cleanup(func() { moduleCheck = before })
}
