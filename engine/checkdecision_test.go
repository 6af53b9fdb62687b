package engine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/ichor-policy/engine"
)

// CheckDecision refuses of each rule's answer what the engine's caller of
// that rule refuses (the same parse function), and passes what it acts on
// (review 255 F2); a rule no caller acts on passes whatever it answers.
func TestCheckDecisionRefusesWhatTheCallerRefuses(t *testing.T) {
	const reasons = `"reasons":[{"code":"C","message":"m"}]`
	for path, tc := range map[string]struct{ good, broken, why string }{
		engine.PathKubeletServing: {
			good: `{"action":"approve",` + reasons + `}`, broken: `{"action":"approved",` + reasons + `}`, why: "has unknown action",
		},
		engine.PathKubeletServingRejection: {
			good: `{"action":"deny",` + reasons + `}`, broken: `{"action":"approve",` + reasons + `}`, why: "not deny",
		},
		engine.PathKubeletServingLimits: {
			good:   `{"max_undecided_per_requester":1,"node_user_prefix":"system:node:"}`,
			broken: `{"max_undecided_per_requester":0,"node_user_prefix":"system:node:"}`, why: "gives no max_undecided_per_requester",
		},
		engine.PathKubeletServingAudit: {
			good: `{"status":"current",` + reasons + `}`, broken: `{"status":"fine",` + reasons + `}`, why: "has unknown status",
		},
		engine.PathKubeletClient: {
			good: `{"action":"pending",` + reasons + `}`, broken: `{"action":"deny",` + reasons + `}`, why: "answers deny",
		},
		engine.PathKubeconfig: {
			good:   `{"allowed":true,"check_identity":false,` + reasons + `}`,
			broken: `{"allowed":true,"check_identity":true,` + reasons + `}`, why: "does not have the documented shape",
		},
		engine.PathCredentialRequirements: {
			good:   `{"authorization":{"verb":"download","resource":"talosclusters"},"event":{"type":"Normal","reason":"R"}}`,
			broken: `{"authorization":{"verb":"download","resource":"talosclusters"},"event":{"type":"Normal"}}`, why: "names no grant or no event",
		},
		engine.PathCredentialAdmission: {
			good: `{"allowed":false,` + reasons + `}`, broken: `{"allowed":true,"action":"refused",` + reasons + `}`, why: `carries "action" too`,
		},
		engine.PathCredentialIssuance: {
			good:   `{"allowed":true,"certificate":{"kind":"talos","talos_role":"os:reader"},"lifetime_seconds":600,` + reasons + `}`,
			broken: `{"allowed":true,"lifetime_seconds":600,` + reasons + `}`, why: "names no certificate or lifetime",
		},
		engine.PathCredentialCheck: {
			good: `{"allowed":false,` + reasons + `}`, broken: `{"allowed":false,"reasons":[]}`, why: "gives no reason",
		},
		engine.PathManualRecord: {
			good:   `{"kind":"revocation","action":"revoke","object":"clusterrolebinding/b",` + reasons + `}`,
			broken: `{"kind":"revocation","action":"revoke",` + reasons + `}`, why: "does not have the documented shape",
		},
	} {
		d := engine.Decision{ID: "d-1", Path: path, Result: json.RawMessage(tc.good)}
		assert.NoError(t, engine.CheckDecision(d), path)
		d.Result = json.RawMessage(tc.broken)
		err := engine.CheckDecision(d)
		if assert.Error(t, err, path) {
			assert.Contains(t, err.Error(), tc.why, path)
			assert.Contains(t, err.Error(), "decision d-1 of "+path, path)
		}
	}
	for _, path := range []string{engine.PathApplied, "ichor/other/decision"} {
		assert.NoError(t, engine.CheckDecision(engine.Decision{Path: path, Result: json.RawMessage(`{"action":"anything"}`)}), path)
	}
}
