# METADATA
# title: Decision-log masking
# description: |
#   What the decision log must not keep. The requester's "extra" attributes come from
#   whatever authenticator the cluster uses (an authenticating proxy, OIDC claims) and can
#   hold personal or secret values; each value of a key not listed in data.json is
#   replaced, so the key stays visible and the value does not. The extra attributes sit
#   under input.csr (CSR decisions), input.user (credential admission: who made the
#   request) and input.requester (spec.requester, at admission and issuance). One rule reads
#   extra: admission compares spec.requester with the user (RequesterMismatch). Both are
#   masked alike, so a masked entry replays to the same decision unless the two differed in
#   a masked value only; the logged result still says what was decided.
package system.log

_config := data.system.log.config

# METADATA
# title: Mask
# description: The JSON patch operations OPA's decision-log plugin applies to each entry before it is written.
# entrypoint: true
mask contains {"op": "upsert", "path": sprintf("/input/%s/extra", [holder]), "value": _masked(extra)} if {
	some holder in _config.extra_holders
	extra := input.input[holder].extra
	some key, _ in extra
	not _config.logged_extra_keys[key]
}

_masked(extra) := {key: _masked_value(key, values) | some key, values in extra}

_masked_value(key, values) := values if _config.logged_extra_keys[key]

_masked_value(key, values) := [_config.redacted | some _ in values] if not _config.logged_extra_keys[key]
