package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
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

// ResultChanges are the fields of a rule's result (the top-level keys of an
// object) whose values differ between two results once their text for
// people is set aside: the reasons, compared by code apart, and every
// "message" (a reason's, an Event's), whose wording may change without the
// decision changing. What is left is what the manager acts on beside the
// action word: the node approved, the Talos role, the groups, the lifetime,
// the admin binding's role, the Event's reason, a kubeconfig's
// check_identity. A result that is not an object is one field, "result".
//
// Every field counts, under every action: a refusal that names another
// lifetime is reported too, rather than trusting the action word, which
// Outcome reads from "action" before "allowed" while the credential rules'
// callers read "allowed" alone (a result {"allowed": true, "action":
// "refused", ...} issues; review of 2026-12-05), and a refusal of a
// kubeconfig can still ask for its server's identity (check_identity).
func ResultChanges(a, b json.RawMessage) []string {
	x, errX := withoutText(a)
	y, errY := withoutText(b)
	if errX != nil || errY != nil {
		if bytes.Equal(a, b) {
			return nil
		}
		return []string{"result"}
	}
	xo, okX := x.(map[string]any)
	yo, okY := y.(map[string]any)
	if !okX || !okY {
		if reflect.DeepEqual(x, y) {
			return nil
		}
		return []string{"result"}
	}
	var changed []string
	for k, v := range xo {
		if w, ok := yo[k]; !ok || !reflect.DeepEqual(v, w) {
			changed = append(changed, k)
		}
	}
	for k := range yo {
		if _, ok := xo[k]; !ok {
			changed = append(changed, k)
		}
	}
	slices.Sort(changed)
	return changed
}

// withoutText is a result as a generic value, less its reasons and every
// "message" field.
func withoutText(raw json.RawMessage) (any, error) {
	if raw == nil {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	if o, ok := v.(map[string]any); ok {
		delete(o, "reasons")
	}
	dropMessages(v)
	return v, nil
}

func dropMessages(v any) {
	switch t := v.(type) {
	case map[string]any:
		delete(t, "message")
		for _, e := range t {
			dropMessages(e)
		}
	case []any:
		for _, e := range t {
			dropMessages(e)
		}
	}
}
