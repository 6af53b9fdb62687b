package bench_test

import (
	"context"

	"github.com/ichor-dev/ichor-policy/engine"
)

// recordApproval records an approval as the kubelet-serving reconciler does
// once its write succeeded.
func recordApproval(ctx context.Context, e *engine.Engine, d engine.CSRDecision) error {
	return e.RecordApplied(ctx, d.DecisionID, "csr/csr-bench", d.Action)
}
