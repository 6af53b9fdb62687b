package engine

import (
	"encoding/json"
	"errors"
	"strings"
)

// Action words of an outcome besides a CSR rule's own (ActionApprove,
// ActionDeny, ActionPending).
const (
	// ActionAllowed and ActionRefused are the answers of the rules that say
	// "allowed": credential admission and issuance.
	ActionAllowed = "allowed"
	ActionRefused = "refused"
	// ActionNone is no decision: the rule is undefined for the input.
	ActionNone = "none"
	// ActionError is an evaluation that failed.
	ActionError = "error"
)

// Reasons are a decision's reasons, in the rule's (sorted) order.
type Reasons []Reason

// Codes are the reason codes, in order.
func (r Reasons) Codes() []string {
	out := make([]string, 0, len(r))
	for _, reason := range r {
		out = append(out, reason.Code)
	}
	return out
}

// String is the reasons as one line, "CODE: message; CODE: message", for a
// condition, an admission response, a log line or a CLI error.
func (r Reasons) String() string {
	parts := make([]string, 0, len(r))
	for _, reason := range r {
		parts = append(parts, reason.Code+": "+reason.Message)
	}
	return strings.Join(parts, "; ")
}

// Outcome is what any decision answered, in one shape for every rule: the
// action word (a CSR rule's action; allowed or refused for a rule that says
// "allowed"; an audit's status), the reasons, and the node when the rule names one. It is what
// the metrics count, the shadow compares and `ichor decisions` shows.
type Outcome struct {
	// Action is an action word, or "" for a result that is not a decision
	// (ichor/credentials/requirements, a set of RBAC violations).
	Action  string  `json:"action"`
	Reasons Reasons `json:"reasons"`
	Node    string  `json:"node,omitempty"`
}

// OutcomeOf reads a rule's result; err is the evaluation's error, if any.
func OutcomeOf(result json.RawMessage, err error) Outcome {
	o := Outcome{Reasons: Reasons{}}
	switch {
	case errors.Is(err, ErrNoDecision), err == nil && result == nil:
		o.Action = ActionNone
		return o
	case err != nil:
		o.Action = ActionError
		return o
	}
	var r struct {
		Action  *string `json:"action"`
		Status  *string `json:"status"`
		Allowed *bool   `json:"allowed"`
		Reasons Reasons `json:"reasons"`
		Node    string  `json:"node"`
	}
	if json.Unmarshal(result, &r) != nil {
		return o
	}
	switch {
	case r.Action != nil:
		o.Action = *r.Action
	case r.Status != nil:
		o.Action = *r.Status
	case r.Allowed != nil && *r.Allowed:
		o.Action = ActionAllowed
	case r.Allowed != nil:
		o.Action = ActionRefused
	}
	if r.Reasons != nil {
		o.Reasons = r.Reasons
	}
	o.Node = r.Node
	return o
}

// Outcome is the decision's outcome.
func (d Decision) Outcome() Outcome { return OutcomeOf(d.Result, nil) }
