package ichor.manual_test

import data.ichor.manual

# The review of 2026-12-06: a DELETE is admitted before it is stored, and another webhook, a
# policy or a timeout may still refuse it, so the webhook keeps it as an attempt and the watch
# records the revocation once the binding is gone: naming the one person who asked, and nobody
# when several did or attempts may be missing.
_watched(attempts, incomplete) := {
	"act": "admin_binding_deletion", "seen_by": "watch", "binding": _binding,
	"attempts": attempts, "attempts_incomplete": incomplete,
}

_revoke(username) := {"verdict": "revoke", "username": username, "uid": concat("-", ["u", username])}

test_the_one_person_who_asked_is_the_revoker if {
	r := manual.record with input as _watched([_revoke("ada")], false)
	r.actor == "ada"
	r.actor_source == "admission"
	r.whom == "bob"
	contains(r.reasons[0].message, `was revoked by "ada"`)

	# Asked twice (a DELETE refused, then one stored): still one person.
	twice := manual.record with input as _watched([_revoke("ada"), _revoke("ada")], false)
	twice.actor == "ada"
}

test_several_people_who_asked_are_not_told_apart if {
	r := manual.record with input as _watched([_revoke("ada"), _revoke("carl")], false)
	r.actor == "unknown"
	r.actor_source == "ambiguous"
	contains(r.reasons[0].message, `2 people asked for this verdict at once ("ada", "carl")`)
}

test_attempts_that_may_be_missing_name_no_revoker if {
	r := manual.record with input as _watched([_revoke("ada")], true)
	r.actor == "unknown"
	r.actor_source == "ambiguous"
}

test_an_attempt_of_a_verdict_is_no_revocation if {
	# A CSR's attempt under the binding's UID cannot be (its name is keyed by the act), and
	# would not count.
	r := manual.record with input as _watched([{"verdict": "Approved", "username": "mallory", "uid": "u-m"}], false)
	r.actor == "unknown"
	r.actor_source == "unknown"
}

test_an_annotation_naming_another_than_who_asked_names_nobody if {
	# The operator's revocation (the manager's, which calls no webhook) after a DELETE of
	# Ada's that another webhook refused: neither is taken for the revoker.
	b := object.union(_binding, {"revoked_by": "the operator"})
	r := manual.record with input as object.union(_watched([_revoke("ada")], false), {"binding": b})
	r.actor == "unknown"
	r.actor_source == "ambiguous"
	contains(r.reasons[0].message, concat("", [
		`the binding's ichor.dev/revoked-by annotation names "the operator", `,
		`and "ada" asked to delete it`,
	]))

	# The annotation and the one who asked agree: named.
	rita := object.union(_binding, {"revoked_by": "ichor:rita"})
	named := manual.record with input as object.union(_watched([_revoke("ichor:rita")], false), {"binding": rita})
	named.actor == "ichor:rita"
	named.actor_source == "admission"

	# The annotation alone (no webhook called): named as a claim.
	claim := manual.record with input as object.union(_watched([], false), {"binding": b})
	claim.actor == "the operator"
	claim.actor_source == "annotation"
}
