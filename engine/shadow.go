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

// sameAs reports whether two verdicts are one action for one first reason
// code and one set of the others: the first names the verdict (a denial's
// reason, an audit condition's and its Event's, a metric's label), the
// order of the rest is a rule's presentation (review 200 F7, review 201
// F5).
func (v verdict) sameAs(o verdict) bool {
	return v.Action == o.Action && SameCodes(v.Codes, o.Codes)
}

// SameCodes reports whether two lists of reason codes have one first code
// and one set of the others, as many of each: the first names a verdict (a
// denial's reason, an audit condition's and its Event's, a metric's
// label), the order of the rest is a rule's presentation.
func SameCodes(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	return a[0] == b[0] && slices.Equal(slices.Sorted(slices.Values(a[1:])), slices.Sorted(slices.Values(b[1:])))
}

// compareShadow evaluates the shadow bundle on the same input and logs and
// counts a disagreement. It never changes the decision.
func (e *Engine) compareShadow(ctx context.Context, path string, input any, active Decision, activeErr error) {
	a := verdictOf(active, activeErr)
	if a.Action == ActionError {
		// The active decision failed; the caller sees that, and there is
		// nothing to compare: the shadow is not asked either, whose
		// evaluation would add its own bound to an active one that ran to
		// its bound (review 252 F3).
		return
	}
	shadow, shadowErr := e.shadow.decide(ctx, path, input)
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
