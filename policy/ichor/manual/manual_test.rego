package ichor.manual_test

import data.ichor.manual

_ada := {"username": "ada", "uid": "u-1", "groups": ["admins", "system:authenticated"]}

_approved := {"type": "Approved", "status": "True", "reason": "IchorManualApproval", "message": "worker-4's IP moved"}

_csr(conditions, previous) := {
	"name": "csr-8x2kq",
	"uid": "c-1",
	"signer_name": "kubernetes.io/kubelet-serving",
	"username": "system:node:worker-4",
	"conditions": conditions,
	"previous_conditions": previous,
	"verdict_condition_sha256": "sha-stored",
}

# A decision as the watch saw it stored, with the attempts the webhook kept from the version
# the stored write replaced.
_csr_act(conditions, attempts) := {
	"act": "csr_decision",
	"seen_by": "watch",
	"certificate_request": _csr(conditions, []),
	"attempts": attempts,
}

# An attempt that wrote the condition stored (its digest is the stored condition's).
_attempt(verdict, username) := _attempt_wrote(verdict, username, "sha-stored")

_attempt_wrote(verdict, username, digest) := {
	"verdict": verdict,
	"condition_sha256": digest,
	"username": username,
	"uid": concat("-", ["uid", username]),
}

_denied := {"type": "Denied", "status": "True", "reason": "Stolen", "message": "not ours"}

test_a_persons_approval_names_the_person_and_what_they_wrote if {
	r := manual.record with input as _csr_act([_approved], [_attempt("Approved", "ada")])
	r.kind == "manual-decision"
	r.action == "approve"
	r.actor == "ada"
	r.actor_source == "admission"
	r.whom == "system:node:worker-4"
	r.node == "worker-4"
	r.object == "csr/csr-8x2kq"
	r.reasons == [{
		"code": "ManualApproval",
		"message": concat("", [
			`certificate signing request csr-8x2kq of "system:node:worker-4" (signer kubernetes.io/kubelet-serving) `,
			`approved by hand by "ada", not by Ichor: reason "IchorManualApproval", message "worker-4's IP moved"`,
		]),
	}]
}

test_a_persons_denial_is_a_manual_denial if {
	r := manual.record with input as _csr_act([_denied], [_attempt("Denied", "ada")])
	r.action == "deny"
	r.reasons[0].code == "ManualDenial"
	contains(r.reasons[0].message, `denied by hand by "ada"`)
}

test_a_decision_no_attempt_was_kept_of_has_an_unknown_actor if {
	# The webhook was not called: no attempt.
	r := manual.record with input as object.remove(_csr_act([_approved], []), ["attempts"])
	r.actor == "unknown"
	r.actor_source == "unknown"
	contains(r.reasons[0].message, "by someone the manager did not see")
}

test_a_decision_found_made_as_the_watch_started_names_nobody if {
	# Decided while no manager watched: the version the write replaced is not known, so an
	# attempt, even of the verdict stored, names nobody.
	found := object.union(_csr_act([_denied], [_attempt("Denied", "ada")]), {"seen_by": "watch_start"})
	r := manual.record with input as found
	r.action == "deny"
	r.actor == "unknown"
	r.actor_source == "not_watched"
	contains(r.reasons[0].message, "denied by hand by someone no manager saw (it was decided while none watched")
	contains(r.reasons[0].message, "the API server's audit log names the user")
}

test_the_attempt_that_lost_names_nobody if {
	# Ada's approval and Bob's denial both passed admission; the denial was stored.
	r := manual.record with input as _csr_act([_denied], [_attempt("Approved", "ada"), _attempt("Denied", "bob")])
	r.action == "deny"
	r.actor == "bob"
	r.actor_source == "admission"

	# Only Ada's denial was admitted, and an approval was stored: not hers.
	u := manual.record with input as _csr_act([_approved], [_attempt("Denied", "ada")])
	u.action == "approve"
	u.actor == "unknown"
	u.actor_source == "unknown"
}

test_an_attempt_of_the_verdict_in_other_words_names_nobody if {
	# Review 4, R4: Cy's approval was kept and lost; Ada's, stored, was not kept (its webhook
	# call timed out). Cy asked for the verdict stored, but did not write the condition stored.
	r := manual.record with input as _csr_act([_approved], [_attempt_wrote("Approved", "cy", "sha-cys-words")])
	r.action == "approve"
	r.actor == "unknown"
	r.actor_source == "unknown"
	contains(r.reasons[0].message, "kept no attempt that wrote the condition stored")

	# Both kept: the one whose words were stored is named.
	both := manual.record with input as _csr_act([_approved], [
		_attempt_wrote("Approved", "cy", "sha-cys-words"),
		_attempt("Approved", "ada"),
	])
	both.actor == "ada"
	both.actor_source == "admission"

	# An attempt without a digest (an older webhook's) names nobody.
	undigested := object.remove(_attempt("Approved", "ada"), ["condition_sha256"])
	bare := manual.record with input as _csr_act([_approved], [undigested])
	bare.actor == "unknown"

	# Nor does a digest that is not a string, or a stored condition without one.
	odd := manual.record with input as _csr_act([_approved], [_attempt_wrote("Approved", "ada", 7)])
	odd.actor == "unknown"
	unstored := manual.record with input as object.union(
		_csr_act([_approved], [_attempt_wrote("Approved", "ada", "")]),
		{"certificate_request": {"verdict_condition_sha256": ""}},
	)
	unstored.actor == "unknown"
}

test_two_people_who_attempted_the_verdict_stored_are_not_told_apart if {
	r := manual.record with input as _csr_act([_denied], [_attempt("Denied", "bob"), _attempt("Denied", "ada")])
	r.action == "deny"
	r.actor == "unknown"
	r.actor_source == "ambiguous"
	contains(r.reasons[0].message, concat("", [
		"by someone the manager cannot single out: ",
		`2 people asked for this verdict at once ("ada", "bob")`,
	]))
	contains(r.reasons[0].message, "the API server's audit log names whose write was stored")

	# One person twice is one person.
	twice := manual.record with input as _csr_act([_denied], [_attempt("Denied", "ada"), _attempt("Denied", "ada")])
	twice.actor == "ada"
}

test_attempts_that_may_be_missing_name_nobody if {
	act := object.union(_csr_act([_approved], [_attempt("Approved", "ada")]), {"attempts_incomplete": true})
	r := manual.record with input as act
	r.actor == "unknown"
	r.actor_source == "ambiguous"
	contains(r.reasons[0].message, "more people asked for a verdict at once than the manager keeps")
}

test_a_user_is_an_actor_only_as_an_attempt_of_the_verdict_stored if {
	# A user beside a decision is not who acted: only an attempt says who.
	r := manual.record with input as object.union(_csr_act([_approved], []), {"seen_by": "admission", "user": _ada})
	r.actor == "unknown"

	empty := manual.record with input as _csr_act([_approved], [_attempt("Approved", "")])
	empty.actor == "unknown"
}

test_a_request_of_a_client_is_no_node if {
	act := object.union(_csr_act([_approved], [_attempt("Approved", "ada")]), {"certificate_request": {"username": "bob"}})
	r := manual.record with input as act
	r.whom == "bob"
	not r.node
}

test_a_write_that_decides_nothing_is_not_recorded if {
	# Already approved before the write, or a condition that is not a decision.
	not manual.record with input as object.union(
		_csr_act([_approved], []),
		{"certificate_request": {"previous_conditions": [_approved]}},
	)
	not manual.record with input as _csr_act([{"type": "Failed", "status": "True"}], [])
	not manual.record with input as _csr_act([object.union(_approved, {"status": "False"})], [])
	not manual.record with input as {"act": "something_else", "user": _ada}
}

test_what_a_person_wrote_is_quoted_and_cut if {
	long := concat("", [x | some _ in numbers.range(1, 300); x := "a"])
	hostile := object.union(_approved, {"reason": "X\u001b[2J", "message": concat("", ["\r", long])})
	r := manual.record with input as _csr_act([hostile], [_attempt("Approved", "ada")])
	msg := r.reasons[0].message
	contains(msg, `reason "X\x1b[2J"`)
	contains(msg, `... (301 bytes)`)
	not contains(msg, "\u001b")
	not contains(msg, "\r")
}

_binding := {
	"name": "ichor-admin:u:bob:1a2b3c4d5e",
	"uid": "b-1",
	"username": "bob",
	"identity": "ichor-admin:u:bob",
	"revoked_by": "",
	"role_ref": {"kind": "ClusterRole", "name": "cluster-admin"},
}

test_a_revocation_by_ada_names_ada_and_bob if {
	act := {"act": "admin_binding_deletion", "seen_by": "admission", "user": _ada, "binding": _binding}
	r := manual.record with input as act
	r == {
		"kind": "revocation",
		"action": "revoke",
		"actor": "ada",
		"actor_source": "admission",
		"whom": "bob",
		"object": "clusterrolebinding/ichor-admin:u:bob:1a2b3c4d5e",
		"reasons": [{
			"code": "AdminRevoked",
			"message": concat("", [
				`the admin binding ichor-admin:u:bob:1a2b3c4d5e of "bob" (identity "ichor-admin:u:bob") was revoked by "ada"; `,
				"their admin kubeconfigs no longer have cluster-admin",
			]),
		}],
	}
}

test_a_revocation_the_watch_saw_has_an_unknown_actor if {
	r := manual.record with input as {"act": "admin_binding_deletion", "seen_by": "watch", "binding": _binding}
	r.actor == "unknown"
	r.whom == "bob"
	contains(r.reasons[0].message, "the API server's audit log names the user")
}

test_the_revoked_by_annotation_is_named_as_a_claim if {
	b := object.union(_binding, {"revoked_by": "the operator"})
	r := manual.record with input as {"act": "admin_binding_deletion", "seen_by": "watch", "binding": b}
	r.actor == "the operator"
	r.actor_source == "annotation"
	contains(r.reasons[0].message, "a claim on the object")

	# The API server's word wins over the annotation.
	act := {"act": "admin_binding_deletion", "seen_by": "admission", "user": _ada, "binding": b}
	seen := manual.record with input as act
	seen.actor == "ada"
}

_deletion(binding) := {"act": "admin_binding_deletion", "seen_by": "admission", "user": _ada, "binding": binding}

test_whom_is_read_from_the_identity_not_the_annotation if {
	# An annotation names alice on bob's binding: whom is bob, the annotation a claim.
	r := manual.record with input as _deletion(object.union(_binding, {"username": "alice"}))
	r.whom == "bob"
	contains(r.reasons[0].message, concat("", [
		`of "bob" (identity "ichor-admin:u:bob") `,
		`(its ichor.dev/admin-username annotation, a claim on the object, says "alice")`,
	]))

	# A hashed identity carries no username: it is whom.
	h := object.union(_binding, {
		"identity": "ichor-admin:h:0a1b2c",
		"name": "ichor-admin:h:0a1b2c:1a2b3c4d5e",
		"username": "Bob Smith",
	})
	rh := manual.record with input as _deletion(h)
	rh.whom == "ichor-admin:h:0a1b2c"
	contains(rh.reasons[0].message, `says "Bob Smith"`)
}

test_a_labelled_binding_that_is_not_ichors_is_no_revocation if {
	# Whoever may create bindings labels one to a harmless role and deletes it.
	harmless := object.union(_binding, {"role_ref": {"kind": "ClusterRole", "name": "system:public-info-viewer"}})
	not manual.record with input as _deletion(harmless)

	# The manager names no identity for a binding not named IDENTITY:NONCE.
	not manual.record with input as _deletion(object.union(_binding, {"identity": ""}))
}
