package engine

import (
	"context"
	"errors"
	"slices"
)

// verdict is what a shadow comparison looks at beside the result's other
// fields (ResultChanges): the action word and the reason codes. Messages may
// change wording without the decision changing.
type verdict struct {
	Action string   `json:"action"`
	Codes  []string `json:"codes"`
}

func verdictOf(d Decision, err error) verdict {
	o := OutcomeOf(d.Result, err)
	return verdict{Action: o.Action, Codes: o.Reasons.Codes()}
}

// sameAs reports whether two verdicts are one action for one set of reason
// codes: the order of the reasons is a rule's presentation (a drifted audit
// lists what drifted first), and replay compares them so too (review 200
// F7).
func (v verdict) sameAs(o verdict) bool {
	return v.Action == o.Action && slices.Equal(slices.Sorted(slices.Values(v.Codes)), slices.Sorted(slices.Values(o.Codes)))
}

// compareShadow evaluates the shadow bundle on the same input and logs and
// counts a disagreement. It never changes the decision.
func (e *Engine) compareShadow(ctx context.Context, path string, input any, active Decision, activeErr error) {
	shadow, shadowErr := e.shadow.decide(ctx, path, input)
	a := verdictOf(active, activeErr)
	if a.Action == ActionError {
		// The active decision failed; the caller sees that, and there is
		// nothing to compare.
		return
	}
	s := verdictOf(shadow, shadowErr)
	// A shadow that grants more for the same action (another Talos role,
	// groups, a longer lifetime) keeps its reason code: the fields count.
	changed := ResultChanges(active.Result, shadow.Result)
	if a.sameAs(s) && len(changed) == 0 {
		return
	}
	if e.metrics != nil {
		e.metrics.disagreement(path)
	}
	fields := map[string]any{
		"decision_id":     active.ID,
		"path":            path,
		"active":          a,
		"active_revision": active.Revision,
		"shadow":          s,
		"shadow_revision": shadow.Revision,
	}
	if len(changed) > 0 {
		fields["result_fields_changed"] = changed
	}
	if shadowErr != nil && !errors.Is(shadowErr, ErrNoDecision) {
		fields["shadow_error"] = shadowErr.Error()
	}
	e.notes.WithFields(fields).Warn("Shadow bundle disagrees with the active bundle.")
}
