package bench_test

import (
	"context"

	"github.com/ichor-dev/ichor-policy/engine"
)

// recordApproval records an approval as the kubelet-serving reconciler does
// once its write succeeded.
func recordApproval(ctx context.Context, e *engine.Engine, d engine.CSRDecision) error {
	return e.RecordApplied(ctx, engine.Applied{
		DecisionID: d.DecisionID, Object: "csr/csr-bench", UID: "0b6f3c9e-5d1a-4f7b-8e2c-9a4d6b1f3e70", Action: d.Action, Outcome: engine.AppliedWritten,
	})
}
