package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A result whose key names a field only as encoding/json's folding matches
// it is refused: ſ (U+017F) folds to s and sorts after it, so the look-alike
// would win over the key every reader sees (review of 2026-12-05).
func TestAResultWithALookAlikeKeyIsRefused(t *testing.T) {
	for name, result := range map[string]string{
		"a look-alike of a nested field": `{"allowed": true, "reasons": [{"code": "IchorCredentialIssuable", "message": "yes"}], "purpose": "talosconfig-reader",
			"lifetime_seconds": 3600, "certificate": {"kind": "talos", "talos_role": "os:reader", "taloſ_role": "os:admin"}}`,
		"a look-alike of a top-level field": `{"allowed": true, "reasons": [{"code": "IchorCredentialIssuable", "message": "yes"}], "purpose": "talosconfig-reader",
			"lifetime_seconds": 3600, "lifetime_ſeconds": 31536000, "certificate": {"kind": "talos", "talos_role": "os:reader"}}`,
		"a field in other case alone": `{"allowed": true, "reasons": [{"code": "IchorCredentialIssuable", "message": "yes"}], "purpose": "talosconfig-reader",
			"lifetime_seconds": 3600, "certificate": {"kind": "talos", "Talos_Role": "os:admin"}}`,
		"a kind by the Kelvin sign":        `{"action": "approve", "reasons": [{"code": "IchorApproved", "message": "yes"}], "kind": "a", "\u212aind": "b"}`,
		"a reason's message by the long s": `{"action": "approve", "reasons": [{"code": "IchorApproved", "message": "yes", "meſſage": "no"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			var issuance CredentialIssuance
			var csr CSRDecision
			err := decodeResult([]byte(result), &issuance)
			if name == "a kind by the Kelvin sign" || name == "a reason's message by the long s" {
				err = decodeResult([]byte(result), &csr)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "but encoding/json would read it as that field")
		})
	}

	var d CredentialIssuance
	require.NoError(t, decodeResult([]byte(`{"allowed": true, "reasons": [{"code": "IchorCredentialIssuable", "message": "yes"}], "purpose": "talosconfig-reader",
		"lifetime_seconds": 3600, "certificate": {"kind": "talos", "talos_role": "os:reader"}, "unknown_to_go": {"Talos_role": 1}}`), &d))
	assert.Equal(t, "os:reader", d.Certificate.TalosRole)
	assert.EqualValues(t, 3600, d.LifetimeSeconds)
}

// A credential result answering "allowed" beside an "action" (or "status")
// word is refused: the outcome counted, shadowed and replayed is read from
// the word, the issuer acts on "allowed" (review of 2026-12-05).
func TestAnAllowedResultWithAnActionWordIsRefused(t *testing.T) {
	for _, word := range []string{"action", "status", "Action", "STATUS", "ſtatus"} {
		var d CredentialIssuance
		err := decodeResult([]byte(`{"allowed": true, "`+word+`": "refused", "reasons": [{"code": "IchorCredentialIssuable", "message": "yes"}], "purpose": "talosconfig-reader",
			"lifetime_seconds": 3600, "certificate": {"kind": "talos", "talos_role": "os:reader"}}`), &d)
		require.Error(t, err, word)
		assert.Contains(t, err.Error(), `carries "`+word+`" too`)
	}
	// A CSR decision has its own action.
	var csr CSRDecision
	require.NoError(t, decodeResult([]byte(`{"action": "approve", "reasons": [{"code": "IchorApproved", "message": "yes"}]}`), &csr))
}
