package engine

import (
	"context"
	"errors"

	"github.com/open-policy-agent/opa/v1/ast"
)

// PathApplied is the record, in the decision log, that a decision was
// carried out (policy/system/applied).
const PathApplied = "system/applied/record"

// RecordApplied writes to the decision log that the decision with this id
// was carried out on object (as "csr/NAME" or "taloscredentialrequest/NS/NAME")
// by action. A bundle without the record's rule still logs the record, as an
// undefined decision with the same input.
func (e *Engine) RecordApplied(ctx context.Context, decisionID, object, action string) error {
	_, err := e.Decide(ctx, PathApplied, appliedInput(decisionID, object, action))
	if errors.Is(err, ErrNoDecision) {
		return nil
	}
	return err
}

// appliedInput is the record's input, {"decision_id", "object", "action"},
// built as OPA's value: the same value inputValue reads from its JSON,
// without the encoding and the reading back, on every approval.
func appliedInput(decisionID, object, action string) ast.Value {
	return ast.NewObject(
		ast.Item(ast.InternedTerm("decision_id"), ast.StringTerm(decisionID)),
		ast.Item(ast.InternedTerm("object"), ast.StringTerm(object)),
		ast.Item(ast.InternedTerm("action"), ast.StringTerm(action)),
	)
}
