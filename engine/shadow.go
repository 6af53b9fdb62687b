package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
)

// verdict is what a shadow comparison looks at: the action (or admission's
// allowed) and the reason codes. Messages may change wording without the
// decision changing.
type verdict struct {
	Action  string   `json:"action,omitempty"`
	Allowed *bool    `json:"allowed,omitempty"`
	Codes   []string `json:"codes"`
	None    bool     `json:"no_decision,omitempty"`
}

func verdictOf(d Decision, err error) (verdict, bool) {
	if errors.Is(err, ErrNoDecision) {
		return verdict{None: true}, true
	}
	if err != nil {
		return verdict{}, false
	}
	var r struct {
		Action  string `json:"action"`
		Allowed *bool  `json:"allowed"`
		Reasons []struct {
			Code string `json:"code"`
		} `json:"reasons"`
	}
	if json.Unmarshal(d.Result, &r) != nil {
		return verdict{}, false
	}
	v := verdict{Action: r.Action, Allowed: r.Allowed, Codes: []string{}}
	for _, reason := range r.Reasons {
		v.Codes = append(v.Codes, reason.Code)
	}
	return v, true
}

// compareShadow evaluates the shadow bundle on the same input and logs and
// counts a disagreement. It never changes the decision.
func (e *Engine) compareShadow(ctx context.Context, path string, input any, active Decision, activeErr error) {
	shadow, shadowErr := e.shadow.decide(ctx, path, input)
	a, okA := verdictOf(active, activeErr)
	s, okS := verdictOf(shadow, shadowErr)
	if !okA {
		return
	}
	ab, _ := json.Marshal(a)
	sb, _ := json.Marshal(s)
	if okS && bytes.Equal(ab, sb) {
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
	if shadowErr != nil && !errors.Is(shadowErr, ErrNoDecision) {
		fields["shadow_error"] = shadowErr.Error()
	}
	e.notes.WithFields(fields).Warn("Shadow bundle disagrees with the active bundle.")
}
