package engine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/ichor-policy/engine"
)

func TestEveryRuleHasOneOutcome(t *testing.T) {
	for _, tc := range []struct {
		name   string
		result string
		err    error
		want   engine.Outcome
	}{
		{"a CSR rule's action", `{"action":"deny","node":"worker-1","reasons":[{"code":"SANMissing","message":"no names"}]}`, nil,
			engine.Outcome{Action: "deny", Node: "worker-1", Reasons: engine.Reasons{{Code: "SANMissing", Message: "no names"}}}},
		{"allowed", `{"allowed":true,"reasons":[{"code":"IchorCredentialAdmitted","message":"ok"}]}`, nil,
			engine.Outcome{Action: engine.ActionAllowed, Reasons: engine.Reasons{{Code: "IchorCredentialAdmitted", Message: "ok"}}}},
		{"an audit's status", `{"status":"drifted","node":"worker-1","reasons":[{"code":"CertificateNamesNotNode","message":"moved"}]}`, nil,
			engine.Outcome{Action: "drifted", Node: "worker-1", Reasons: engine.Reasons{{Code: "CertificateNamesNotNode", Message: "moved"}}}},
		{"refused", `{"allowed":false,"reasons":[]}`, nil, engine.Outcome{Action: engine.ActionRefused, Reasons: engine.Reasons{}}},
		{"not a decision", `{"authorization":{"verb":"download"}}`, nil, engine.Outcome{Reasons: engine.Reasons{}}},
		{"a set, not an object", `[{"code":"RightNotAllowed"}]`, nil, engine.Outcome{Reasons: engine.Reasons{}}},
		{"no result", ``, nil, engine.Outcome{Action: engine.ActionNone, Reasons: engine.Reasons{}}},
		{"undefined", ``, fmt.Errorf("path: %w", engine.ErrNoDecision), engine.Outcome{Action: engine.ActionNone, Reasons: engine.Reasons{}}},
		{"failed", ``, errors.New("evaluate: builtin error"), engine.Outcome{Action: engine.ActionError, Reasons: engine.Reasons{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var result json.RawMessage
			if tc.result != "" {
				result = json.RawMessage(tc.result)
			}
			assert.Equal(t, tc.want, engine.OutcomeOf(result, tc.err))
		})
	}
}

func TestReasonsReadAsOneLine(t *testing.T) {
	r := engine.Reasons{{Code: "DNSNameNotNode", Message: "a.example is not the node's"}, {Code: "IPNotNode", Message: "10.0.0.9 is not"}}
	assert.Equal(t, []string{"DNSNameNotNode", "IPNotNode"}, r.Codes())
	assert.Equal(t, "DNSNameNotNode: a.example is not the node's; IPNotNode: 10.0.0.9 is not", r.String())
	assert.Empty(t, engine.Reasons(nil).String())
	assert.Equal(t, []string{}, engine.Reasons(nil).Codes())
}
