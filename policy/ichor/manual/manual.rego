# METADATA
# title: A person's acts, recorded
# description: |
#   Not a decision of Ichor's: the record, in the decision log, of what a person did with
#   their own rights where Ichor's rules do not decide, so that the log names who did it.
#   Two acts are recorded: a certificate signing request of a signer Ichor decides
#   (kubernetes.io/kubelet-serving, kubernetes.io/kube-apiserver-client-kubelet) approved
#   or denied by hand (`ichor approve|deny`, `kubectl certificate approve|deny`), and an
#   admin's own ClusterRoleBinding deleted (`ichor cluster admins revoke`, or any DELETE of
#   a binding labelled ichor.dev/admin-binding). The act is never refused: the API server
#   has already authorized it, and the manager's webhook that sees it always allows.
#
#   Who acted is a fact only when the API server said so: the admission request's user, seen by
#   the manager's webhook. A webhook is called before the write is stored, and the API server
#   may refuse the write afterwards (an approve and a deny sent at once on one request both pass
#   admission; one is stored), so a decision is recorded from what was stored: the manager's
#   watch sees the verdict stored (seen_by "watch"), and the webhook keeps each write of a
#   verdict it admitted as an attempt. The person is named only if exactly one person attempted
#   the verdict stored from the version of the request the stored write replaced, writing the
#   very condition stored (type, reason and message: its digest), and no attempt may be missing;
#   else the actor is unknown, and the record says why (actor_source "ambiguous"
#   for several people or attempts the manager did not keep, "unknown" when the webhook saw
#   none: down, unreachable, or timed out, as its failurePolicy is Ignore). A decision stored
#   while no manager watched (a leader change, a restart) is recorded when the watch starts and
#   finds the request decided (seen_by "watch_start"), with the actor unknown (actor_source
#   "not_watched"): the version the write replaced is not known, so neither are its attempts. A
#   decision of Ichor's own approver is no person's act, and a person's attempt that lost to it
#   is recorded nowhere. An admin binding's deletion is recorded the same way: the watch sees
#   the binding gone (seen_by "watch"), and the webhook keeps each DELETE it admitted as an
#   attempt (verdict "revoke"), so that a DELETE refused after admission (another webhook, a
#   policy, a timeout) is recorded as nothing; the person is named if exactly one person asked
#   and no attempt may be missing. A record of a webhook before 2026-12-06 (seen_by
#   "admission", user) names its user. A binding's ichor.dev/revoked-by annotation, which the
#   manager writes before it removes the bindings for the operator, is named as what it is: a
#   claim on the object. The API server's audit log names the user whenever the record cannot.
#
#   Input: act ("csr_decision" or "admin_binding_deletion"), seen_by ("admission", "watch", or
#   "watch_start" for a request found decided), user (username, uid, groups, extra: the
#   admission request's, for a binding seen by the webhook); for a CSR, certificate_request
#   (name, uid, signer_name, username: the requester as the API server recorded it, conditions
#   and previous_conditions: each {type, status, reason, message}, after and before the stored
#   write, verdict_condition_sha256: the hex sha256 of the verdict condition the stored write
#   added, over the JSON array [type, reason, message] of the whole condition), attempts (each
#   {verdict: the condition type the write added, condition_sha256: the same digest of the
#   condition it added, username, uid: its user}: the writes the webhook admitted from the
#   version the stored write replaced, at most 4) and attempts_incomplete (true when more
#   attempts may have been made than are listed); for a binding, the same attempts (verdict
#   "revoke", no digest: the DELETEs the webhook admitted) and binding (name, uid,
#   identity: read by the manager from the name of a labelled binding named IDENTITY:NONCE,
#   else empty, username: the manager's annotation, a claim, revoked_by: the annotation,
#   role_ref {kind, name}).
package ichor.manual

# The tables of data.json, beside this file, under "config" so that the package's own
# rules can share the path data.ichor.manual.
_config := data.ichor.manual.config

# METADATA
# title: Record of a person's act
# description: |
#   {"kind": "manual-decision" or "revocation", "action": "approve", "deny" or "revoke",
#   "actor": the username, or "unknown", "actor_source": "admission" (the API server named
#   the user to the webhook), "annotation" (a claim on the binding), "ambiguous" (several
#   people attempted the verdict stored at once, or attempts were not kept: the actor is
#   unknown), "not_watched" (decided while no manager watched: the actor is unknown) or
#   "unknown" (the webhook saw no attempt), "whom": the CSR's requester or the binding's person, "object":
#   "csr/NAME" or "clusterrolebinding/NAME", "node" (a CSR of a node), "reasons": one
#   {"code", "message"}}. The reason is also the Event the manager writes on the object.
#   Undefined for an act the input does not describe (a write that decides nothing).
# entrypoint: true
record := object.union(
	{
		"kind": "manual-decision",
		"action": _decision.action,
		"actor": _actor.name,
		"actor_source": _actor.source,
		"whom": _request.username,
		"object": concat("/", ["csr", _request.name]),
		"reasons": [_csr_reason],
	},
	_node,
) if {
	input.act == "csr_decision"
	_decision
}

record := {
	"kind": "revocation",
	"action": "revoke",
	"actor": _actor.name,
	"actor_source": _actor.source,
	"whom": _whom,
	"object": concat("/", ["clusterrolebinding", _binding.name]),
	"reasons": [_revocation],
} if {
	input.act == "admin_binding_deletion"
	_admin_binding
}

_request := object.union(
	{
		"name": "", "username": "", "signer_name": "", "conditions": [], "previous_conditions": [],
		"verdict_condition_sha256": "",
	},
	object.get(input, "certificate_request", {}),
)

_binding := object.union(
	{"name": "", "username": "", "identity": "", "revoked_by": "", "role_ref": {}},
	object.get(input, "binding", {}),
)

# Only the deletion of one of Ichor's admin bindings is a revocation: the identity, which the
# manager reads from the binding's name (IDENTITY:NONCE) only for a labelled binding so
# named, and cluster-admin as its role. Whoever may create bindings can label one to a
# harmless role and delete it; that revokes nobody.
_admin_binding if {
	startswith(_binding.identity, _config.admin_identity_prefix)
	object.get(_binding.role_ref, "kind", "") == _config.admin_role.kind
	object.get(_binding.role_ref, "name", "") == _config.admin_role.name
}

# Whose binding it was: the username its identity carries ("ichor-admin:u:" and the
# username), else the identity itself (a hashed one). Never the ichor.dev/admin-username
# annotation alone, which whoever made the binding wrote.
_whom := trim_prefix(_binding.identity, _config.user_identity_prefix) if {
	startswith(_binding.identity, _config.user_identity_prefix)
} else := _binding.identity

# The annotation's username, named as a claim when it is not whom the identity says.
_claimed_username := "" if {
	_binding.username in {"", _whom}
} else := sprintf(" (its ichor.dev/admin-username annotation, a claim on the object, says %q)", [_binding.username])

# The decision this write made: a condition Approved or Denied, True, that the request did
# not have before the write. The API server lets neither be removed nor both be held.
_decision := object.union(_config.decisions[c.type], {"condition": c}) if {
	some c in _request.conditions
	c.status == "True"
	_config.decisions[c.type]
	not _decided_before(c.type)
}

_decided_before(type) if {
	some p in _request.previous_conditions
	p.type == type
}

_node := {"node": trim_prefix(_request.username, _config.node_user_prefix)} if {
	startswith(_request.username, _config.node_user_prefix)
}

_node := {} if not startswith(_request.username, _config.node_user_prefix)

_actor := {"name": input.user.username, "source": "admission"} if {
	input.act == "admin_binding_deletion"
	input.seen_by == "admission"
	is_string(input.user.username)
	input.user.username != ""
} else := {"name": _config.unknown_actor, "source": "not_watched"} if {
	# Found decided as the watch started: no manager watched the change, and the version the
	# write replaced, to which any attempt belongs, is not known.
	input.act == "csr_decision"
	input.seen_by == "watch_start"
} else := {"name": _config.unknown_actor, "source": "ambiguous"} if {
	_claimed_by_another
} else := {"name": _attempted_by, "source": "admission"} if {
	_attempted_by
} else := {"name": _config.unknown_actor, "source": "ambiguous"} if {
	_ambiguity
} else := {"name": _binding.revoked_by, "source": "annotation"} if {
	input.act == "admin_binding_deletion"
	is_string(_binding.revoked_by)
	_binding.revoked_by != ""
} else := {"name": _config.unknown_actor, "source": "unknown"}

# The people who attempted the verdict stored: the writes of that condition type the webhook
# admitted from the version of the request that the stored write replaced, each of which wrote
# the very condition stored (its digest: type, reason and message). Writes of the other verdict
# were refused (the API server lets a request hold only one); a write of the same verdict in
# other words was not the one stored, whoever's write was (its attempt may not have been kept).
_attempters contains a.username if {
	input.act == "csr_decision"
	some a in object.get(input, "attempts", [])
	a.verdict == _decision.condition.type
	_wrote_the_condition_stored(a)
}

# For a binding's deletion: whoever asked to delete it. Every DELETE that was refused
# counts too: it cannot be told from the one stored.
_attempters contains a.username if {
	input.act == "admin_binding_deletion"
	some a in object.get(input, "attempts", [])
	a.verdict == "revoke"
}

_wrote_the_condition_stored(a) if {
	is_string(a.condition_sha256)
	a.condition_sha256 != ""
	a.condition_sha256 == _request.verdict_condition_sha256
}

# Who decided: the one person who attempted the verdict stored, when no attempt can be missing.
_attempted_by := name if {
	not input.attempts_incomplete
	count(_attempters) == 1
	some name in _attempters
	is_string(name)
	name != ""
}

# A binding whose ichor.dev/revoked-by annotation names someone other than those who asked to
# delete it: an attempt may be a DELETE refused before this one (it cannot be told from the one
# stored), the annotation a claim whoever could update the binding wrote, and the manager's own
# revocation calls no webhook. Neither is taken over the other (review of 2026-12-06: a DELETE
# refused earlier named its sender as the revoker of the operator's revocation).
_claimed_by_another if {
	input.act == "admin_binding_deletion"
	is_string(_binding.revoked_by)
	_binding.revoked_by != ""
	count(_attempters) > 0
	not _binding.revoked_by in _attempters
}

# Why the attempts do not say who decided, when they cannot.
_ambiguity := sprintf("the binding's ichor.dev/revoked-by annotation names %s, and %s asked to delete it", [
	_quoted(_binding.revoked_by),
	concat(", ", sort([_quoted(u) | some u in _attempters])),
]) if {
	_claimed_by_another
} else := sprintf("%d people asked for this verdict at once (%s)", [
	count(_attempters),
	concat(", ", sort([_quoted(u) | some u in _attempters])),
]) if {
	count(_attempters) > 1
} else := "more people asked for a verdict at once than the manager keeps, or it could not read them all" if {
	input.attempts_incomplete == true
}

# What the person wrote on the condition, quoted (every control character escaped) and cut.
_quoted(s) := sprintf("%q", [s]) if {
	count(s) <= _config.max_quoted_length
} else := sprintf("%q... (%d bytes)", [substring(s, 0, _config.max_quoted_length), count(s)])

_who := sprintf("by %q", [_actor.name]) if _actor.source == "admission"

_who := sprintf("by %q, as the binding's ichor.dev/revoked-by annotation says (%s)", [
	_actor.name,
	"a claim on the object, which the manager writes when the operator revokes admin kubeconfigs",
]) if {
	_actor.source == "annotation"
}

_who := concat("; ", [
	sprintf("by someone the manager cannot single out: %s", [_ambiguity]),
	"the API server's audit log names whose write was stored",
]) if {
	_actor.source == "ambiguous"
}

_who := concat(": ", [
	"by someone no manager saw (it was decided while none watched, as during a leader change or a restart)",
	"the API server's audit log names the user",
]) if {
	_actor.source == "not_watched"
}

_who := concat(": ", [
	"by someone the manager did not see (its webhook was not called, or kept no attempt that wrote the condition stored)",
	"the API server's audit log names the user",
]) if {
	_actor.source == "unknown"
}

# METADATA
# title: Manual approval
# description: |
#   A request of a signer Ichor decides was approved by a person, with their own rights,
#   not by Ichor's approver: the message names the person as the API server authenticated
#   them, the requester, the signer and the condition's reason and message as they wrote
#   them (quoted and cut).
# custom:
#   code: ManualApproval
_csr_reason := {"code": "ManualApproval", "message": _csr_message} if _decision.action == "approve"

# METADATA
# title: Manual denial
# description: |
#   A request of a signer Ichor decides was denied by a person, with their own rights: the
#   message says the same as a manual approval's.
# custom:
#   code: ManualDenial
_csr_reason := {"code": "ManualDenial", "message": _csr_message} if _decision.action == "deny"

_csr_message := sprintf(
	"certificate signing request %s of %q (signer %s) %s by hand %s, not by Ichor: reason %s, message %s",
	[
		_request.name, _request.username, _request.signer_name, _decision.verb, _who,
		_quoted(object.get(_decision.condition, "reason", "")),
		_quoted(object.get(_decision.condition, "message", "")),
	],
)

# METADATA
# title: Admin revoked
# description: |
#   An admin's own ClusterRoleBinding was deleted: that person's admin kubeconfigs no
#   longer have cluster-admin. The message names the person (from the identity in the
#   binding's name; the username annotation too, as a claim, when it says otherwise), the
#   binding, and who revoked it.
# custom:
#   code: AdminRevoked
_revocation := {
	"code": "AdminRevoked",
	"message": sprintf(
		"the admin binding %s of %q (identity %q)%s was revoked %s; %s",
		[
			_binding.name, _whom, _binding.identity, _claimed_username, _who,
			"their admin kubeconfigs no longer have cluster-admin",
		],
	),
}
