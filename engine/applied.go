package engine

import (
	"context"
	"errors"
)

// PathApplied is the record, in the decision log, that a decision was
// carried out (policy/system/applied).
const PathApplied = "system/applied/record"

// RecordApplied writes to the decision log that the decision with this id
// was carried out on object (as "csr/NAME" or "taloscredentialrequest/NS/NAME")
// by action. A bundle without the record's rule still logs the record, as an
// undefined decision with the same input.
func (e *Engine) RecordApplied(ctx context.Context, decisionID, object, action string) error {
	_, err := e.Decide(ctx, PathApplied, map[string]string{"decision_id": decisionID, "object": object, "action": action})
	if errors.Is(err, ErrNoDecision) {
		return nil
	}
	return err
}
