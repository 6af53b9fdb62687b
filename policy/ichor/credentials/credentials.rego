# METADATA
# title: Credential issuance
# description: |
#   Decides TalosCredentialRequests: who may ask for which short-lived credential, for how
#   long, and what is signed for it (ADR 0124, KEP-4214). One table in data.json, keyed by
#   purpose, fixes each purpose's certificate (a Talos role, or Kubernetes groups and a
#   common name), its default lifetime and cap, the SubjectAccessReview its requester must
#   pass and the Event that records it. The webhook and the controller read the same table.
#
#   Entrypoints: requirements (what Go gathers before asking for admission), admission (the
#   validating webhook, on CREATE) and issuance (the controller's check again before it
#   signs, so a request admitted under an older policy is held to the current caps). A
#   lifetime above the cap is refused, never shortened. Every failing check is reported,
#   sorted by code.
#
#   Who asks is recorded on the request (spec.requester), pinned to the user who creates it
#   by a ValidatingAdmissionPolicy and by the webhook; the issuer signs only a request whose
#   admission by the webhook it can prove, after a SubjectAccessReview as that requester.
#   A Talos certificate does not name the requester (ADR 0124); the Event and the API
#   server's audit log name them. A Kubernetes certificate does: its common name is the
#   requester's identity (identity.rego: "ichor-admin:" or "ichor-super-admin:", then the
#   username or its hash), outside the "system:" names of Kubernetes and never another
#   person's, so the API server's audit log names who did what. An admin kubeconfig's only
#   group is bound to cluster-admin by its person's own ClusterRoleBinding, which the issuer
#   makes before it signs, so one person's can be revoked without the others'.
package ichor.credentials

import data.ichor.lib.keys as lib_keys

# The tables of data.json, beside this file. They sit under "config" because the
# package's own rules share the path data.ichor.credentials.
_config := data.ichor.credentials.config

# The request as the webhook sends it. Missing, it is an empty object, so that every
# check still runs and fails closed rather than leaving the decision undefined.
default _request := {}

_request := input.request

# METADATA
# title: Requirements of a purpose
# description: |
#   Input {"purpose": name, "username": the requester's, optional}. The row Go needs before
#   it asks for admission or issuance: which SubjectAccessReview to make as the requester and
#   which Event it will write, {"authorization": {"verb", "group", "resource",
#   "subresource"}, "event": {"type", "reason"}}, and, only for a purpose whose credential
#   gets its power from its person's own ClusterRoleBinding (kubeconfig-admin) and a
#   username that has an identity, "admin_binding": {"identity", "cluster_role"}: the
#   person's identity (identity.rego) and the role their binding grants. The issuer gathers
#   admin bindings for such a request only, and only those named after that identity that
#   bind that role; every other purpose costs no binding lookup. Undefined for an unknown
#   purpose, which admission refuses.
# entrypoint: true
requirements := object.union(
	{"authorization": purpose.authorization, "event": purpose.event},
	_admin_binding_requirement(purpose),
) if {
	purpose := _config.purposes[input.purpose]
}

default _admin_binding_requirement(_) := {}

_admin_binding_requirement(purpose) := {"admin_binding": {
	"identity": _person_identity(purpose, input.username),
	"cluster_role": _config.person_identity.binding_roles[purpose.identity],
}}

# METADATA
# title: Admission decision
# description: |
#   The validating webhook's decision on one TalosCredentialRequest:
#   {"allowed": bool, "reasons": [{"code", "message"}], "purpose": name,
#   "lifetime_seconds": the effective lifetime (the purpose's default when no ttl was asked),
#   "credential": what the person is handed (kind, credential, and talos_role, or
#   common_name, groups and bound_to), "event": {"type", "reason", "message"}}. The
#   credential is there only when the request is allowed: the webhook pins it, with the
#   lifetime, in the admission record, and issuance refuses another. The event is there only when the request is
#   allowed and is not a dry run; the webhook writes it on the TalosCluster before it admits,
#   and refuses the request if it cannot (ADR 0124: a credential that cannot be recorded is
#   not issued). The Event is also the proof of admission the issuer looks for.
#
#   Input: operation and dry_run of the admission request; user (the requester's
#   userInfo, as the API server authenticated them); requester (spec.requester, the
#   requester's claim of who they are, which must be exactly user); request (name,
#   namespace, uid, cluster, purpose, ttl_seconds if spec.ttl is set, public_key: the facts
#   of spec.publicKey: parsed, error, algorithm, curve, bits); authorization (the
#   SubjectAccessReview Go made: user, groups, verb, group, resource, subresource, namespace,
#   name, and its answer: allowed, reason, evaluation_error); cluster (exists;
#   kubeconfig_ref, whether it judges another API server; local, whether it is one whose
#   machines are the nodes of the API server Ichor runs in, --local-clusters: a Kubernetes
#   credential needs local true and kubeconfig_ref false); settings, where the manager
#   decides (component_namespaces: the namespaces of Ichor's own ServiceAccounts, the only
#   requesters of a purpose not for people).
# entrypoint: true
admission := object.union_n([
	{
		"allowed": count(_admission_refusals) == 0,
		"reasons": _admission_reasons,
		"purpose": _purpose_name(_request),
		"lifetime_seconds": _lifetime(_request, _config.purposes),
	},
	_admission_credential,
	_admission_event,
])

# METADATA
# title: Issuance decision
# description: |
#   The issuer's decision right before it signs. It holds the request to the same caps as
#   admission, under the current policy, and to who asked: the request must carry proof that
#   this policy's admission webhook admitted exactly it, and the recorded requester must hold
#   the purpose's grant now, so a role removed since admission stops the issuance.
#
#   Input: request (as at admission); requester (spec.requester, pinned at admission to the
#   user who created the request); admission (the proof Go looked for: recorded, whether the
#   webhook's admission record of this request exists; verified, whether its MAC, made with
#   a key only the manager holds over the request's uid, spec and requester, checks out;
#   decision_id of the admission; lifetime_seconds, the lifetime the record says was
#   admitted, and credential, the credential it says was admitted (as admission's output
#   names it), each absent from a record of an older webhook; error, why it does not verify);
#   authorization (the
#   SubjectAccessReview Go made as the requester just now, as at admission); cluster
#   (exists; kubeconfig_ref and local, as at admission); secrets, when the
#   cluster exists (what Go read of the Secret its secretsRef names, whose CAs would sign:
#   secret, its name; read, false when it cannot be read; claimed, whether it names the
#   cluster in its annotation ichor.dev/talos-clusters (--require-secrets-claim); claim_error,
#   why not; usable, whether it also holds a bundle with the CAs; error, why it cannot be read
#   or used, at most 1024 bytes); admin_identity, only
#   for a purpose whose requirements name an admin_binding (bindings: the ClusterRoleBindings
#   labelled as Ichor's admin bindings whose name is the requester's identity, ":" and one
#   more part, to the requirements' role, each {"name", "role_ref": {"api_group", "kind",
#   "name"}, "subjects": [{"api_group", "kind", "name"}]}; nonce: ten lowercase letters or
#   digits Go drew for a new binding's name); settings
#   (admin_kubeconfigs: true while admin kubeconfigs may be issued, false when the operator
#   revoked them, and anything else, absent included, is read as revoked; component_namespaces,
#   as at admission).
#
#   Output: {"allowed": bool, "reasons": [...], "purpose": name, "lifetime_seconds",
#   "certificate": {"kind": "talos", "talos_role"} or
#   {"kind": "kubernetes", "groups", "common_name"}}, and for an admin kubeconfig
#   "admin_binding": {"name", "group", "cluster_role", "username", "identity", "create"}: the
#   person's ClusterRoleBinding, which Go makes (create) or found intact before it signs. The
#   certificate and the binding are there only when allowed, so nothing can be signed or
#   bound from a refusal.
# entrypoint: true
issuance := object.union_n([
	{
		"allowed": count(_issuance_refusals) == 0,
		"reasons": _issuance_reasons,
		"purpose": _purpose_name(_request),
		"lifetime_seconds": _lifetime(_request, _config.purposes),
	},
	_certificate_of(_request, _issuance_refusals, _subject_name(_requester)),
	_admin_binding_of(_issuance_refusals),
])

# METADATA
# title: Credential checks
# description: |
#   The checks of a credential alone, without who asks: the purpose, the lifetime and the
#   key, input {"purpose", "ttl_seconds" (absent: the default), "public_key": {...}}, with
#   the output of the issuance decision. `ichor cluster` asks it before it sends a request,
#   so a lifetime above the cap is refused before anything is sent, and the manager asks it
#   for its own os:reader identity (purpose node-reader), which no person requests. Nothing
#   is signed for a person on this decision alone: the issuer signs on the issuance decision.
# entrypoint: true
credential := object.union(
	{
		"allowed": count(_credential_only_refusals) == 0,
		"reasons": _credential_only_reasons,
		"purpose": _purpose_name(input),
		"lifetime_seconds": _lifetime(input, _config.purposes),
	},
	_certificate_of(input, _credential_only_refusals, ""),
)

_admission_refusals := _who_refusals(_user) | _refused_at_admission

_admission_reasons := sort(_admission_refusals) if count(_admission_refusals) > 0

else := [_admitted]

_issuance_refusals := (_who_refusals(_requester) | _refused_at_issuance) | _admin_binding_refusals

# What admission and issuance both check: the credential, the recorded requester, the
# cluster, and the SubjectAccessReview made as subject.
_who_refusals(subject) := union({
	_credential_refusals(_request, _config),
	_refused_for_requester,
	_cluster_refusals,
	_authorization_refusals(subject),
	_identity_refusals(subject, object.get(_config.purposes, _purpose_name(_request), {})),
})

_issuance_reasons := sort(_issuance_refusals) if count(_issuance_refusals) > 0

else := [_issuable(_request, _subject_name(_requester))]

_credential_only_refusals := _credential_refusals(input, _config)

_credential_only_reasons := sort(_credential_only_refusals) if count(_credential_only_refusals) > 0

else := [_issuable(input, "")]

default _admission_credential := {}

_admission_credential := {"credential": _credential(purpose, _username)} if {
	count(_admission_refusals) == 0
	purpose := _config.purposes[_request.purpose]
}

default _admission_event := {}

# A dry run writes no Event (ADR 0124); a missing dry_run is not a dry run, so the
# Event is then written.
_admission_event := {"event": {
	"type": purpose.event.type,
	"reason": purpose.event.reason,
	"message": sprintf("%s was requested by %s (lifetime %s)", [credential, _named(_username), lifetime]),
}} if {
	count(_admission_refusals) == 0
	not input.dry_run == true
	purpose := _config.purposes[_request.purpose]
	credential := _credential_text(_credential(purpose, _username))
	lifetime := _duration(_lifetime(_request, _config.purposes))
}

# What to sign, and the binding to make first, only when nothing refuses it.
default _certificate_of(_, _, _) := {}

_certificate_of(request, refusals, username) := {"certificate": certificate} if {
	count(refusals) == 0
	certificate := _certificate(_config.purposes[request.purpose], username)
}

default _admin_binding_of(_) := {}

_admin_binding_of(refusals) := {"admin_binding": _admin_binding} if count(refusals) == 0

# METADATA
# title: Admitted
# description: Every check passed; the message names the requester, the grant and the credential.
# custom:
#   code: IchorCredentialAdmitted
_admitted := {
	"code": "IchorCredentialAdmitted",
	"message": sprintf("user %q may %s: %s with lifetime %s is admitted", [
		_username,
		_grant_text(purpose.authorization, _cluster, _namespace),
		_credential_text(_credential(purpose, _username)),
		_duration(_lifetime(_request, _config.purposes)),
	]),
} if {
	purpose := _config.purposes[_request.purpose]
}

# METADATA
# title: Issuable
# description: Every check passed again; the message names the credential and its lifetime.
# custom:
#   code: IchorCredentialIssuable
_issuable(request, username) := {
	"code": "IchorCredentialIssuable",
	"message": sprintf(
		"%s with lifetime %s may be signed",
		[_credential_text(_credential(purpose, username)), _duration(_lifetime(request, _config.purposes))],
	),
} if {
	purpose := _config.purposes[request.purpose]
}

# The checks of the credential itself, made at admission and again before signing. The
# request is an argument because the webhook sends it under input.request and the
# controller sends it alone.
_credential_refusals(request, config) := union({
	_purpose_unknown(request, config.purposes),
	_lifetime_too_long(request, config.purposes),
	_lifetime_not_positive(request),
	_lifetime_not_whole_seconds(request),
	_public_key_invalid(request),
	_public_key_not_allowed(request, lib_keys.algorithms),
	_grant_not_allowed(request, config),
})

# METADATA
# title: Unknown purpose
# description: |
#   The purpose is not a row of the table, so nothing says what could be signed for it.
#   Checked at admission and again before signing.
# custom:
#   code: PurposeUnknown
_purpose_unknown(request, purposes) := {reason |
	# Through _purpose_name, so that a missing purpose is unknown too: OPA evaluates a
	# reference inside a key before the `not`, and a missing one would skip the check.
	not purposes[_purpose_name(request)]
	reason := {
		"code": "PurposeUnknown",
		"message": sprintf("purpose %q is not one of %s", [_purpose_name(request), concat(", ", object.keys(purposes))]),
	}
}

# METADATA
# title: Lifetime not positive
# description: |
#   A lifetime of zero or less would sign a certificate that is already expired. Checked at
#   admission and again before signing.
# custom:
#   code: LifetimeNotPositive
_lifetime_not_positive(request) := {reason |
	is_number(request.ttl_seconds)
	request.ttl_seconds <= 0
	reason := {
		"code": "LifetimeNotPositive",
		"message": sprintf("the requested lifetime of %v seconds is not positive", [request.ttl_seconds]),
	}
}

# METADATA
# title: Lifetime not whole seconds
# description: |
#   A certificate's validity is counted in whole seconds, so a fraction (or anything that is
#   not a number) is refused rather than rounded. Checked at admission and again before
#   signing.
# custom:
#   code: LifetimeNotWholeSeconds
_lifetime_not_whole_seconds(request) := {reason |
	request.ttl_seconds != null
	not _whole_number(request.ttl_seconds)
	reason := {
		"code": "LifetimeNotWholeSeconds",
		"message": sprintf("the requested lifetime %v is not a whole number of seconds", [request.ttl_seconds]),
	}
}

# METADATA
# title: Public key unreadable
# description: |
#   spec.publicKey is missing or is not a PEM PUBLIC KEY block that parses. Checked at
#   admission and again before signing.
# custom:
#   code: PublicKeyInvalid
_public_key_invalid(request) := {reason |
	not request.public_key.parsed == true
	reason := {
		"code": "PublicKeyInvalid",
		"message": sprintf(
			"spec.publicKey does not parse as a PEM PUBLIC KEY block: %s",
			[_key_error(object.get(request, "public_key", {}))],
		),
	}
}

# METADATA
# title: Public key type not allowed
# description: |
#   The key must be one of the table of policy/ichor/lib/keys: Ed25519 (what ichor cluster
#   talosconfig and the UI generate, as ADR 0124 says), ECDSA on P-256 or P-384, or RSA of
#   2048 to 8192 bits (Go's TLS refuses to use a larger RSA key, and checking a signature
#   with one costs seconds). ECDSA and RSA are kept for keys that live in a hardware token (PIV
#   cards hold those, and few hold Ed25519). Weaker keys, and other curves, are refused.
#   Checked at admission and again before signing.
# custom:
#   code: PublicKeyNotAllowed
_public_key_not_allowed(request, algorithms) := {reason |
	request.public_key.parsed == true
	not lib_keys.allowed(request.public_key, algorithms)
	reason := {
		"code": "PublicKeyNotAllowed",
		"message": sprintf(
			"public key %q is not allowed; allowed are %s",
			[lib_keys.text(request.public_key), lib_keys.algorithms_text(algorithms)],
		),
	}
}

# METADATA
# title: Kubernetes credential for a cluster other than Ichor's own
# description: |
#   The purpose is a Kubernetes credential and the cluster is not the one Ichor runs in: it
#   judges another API server (spec.kubeconfigRef), or the operator did not name it as a cluster
#   whose machines are the nodes of the API server Ichor runs in (--local-clusters, the chart
#   value manager.localClusters). Kubernetes credentials are issued only for that cluster, where
#   the admin binding that makes them revocable is kept and checked. Checked at admission and
#   again before signing.
# custom:
#   code: ClusterNotLocal
_cluster_refusals contains reason if {
	_config.purposes[_request.purpose].kind == "kubernetes"
	input.cluster.exists == true
	_not_local
	reason := {
		"code": "ClusterNotLocal",
		"message": sprintf("%s; Kubernetes credentials are issued only for the cluster Ichor runs in", [_not_local_text]),
	}
}

# METADATA
# title: Cluster not found
# description: |
#   The TalosCluster named by spec.clusterName does not exist in the request's namespace.
#   Checked at admission and again before signing.
# custom:
#   code: ClusterNotFound
_cluster_refusals contains reason if {
	not input.cluster.exists == true
	reason := {
		"code": "ClusterNotFound",
		"message": sprintf("TalosCluster %q does not exist in namespace %q", [_cluster, _namespace]),
	}
}

# Either fact says it: Go names a cluster local only without a kubeconfigRef, and the rule
# does not lean on that.
_not_local if not input.cluster.local == true

_not_local if not input.cluster.kubeconfig_ref == false

_not_local_text := sprintf("TalosCluster %q judges another API server (spec.kubeconfigRef)", [_cluster]) if {
	not input.cluster.kubeconfig_ref == false
} else := sprintf(
	"TalosCluster %q is not named as a cluster of the API server Ichor runs in (%s)",
	[_cluster, "--local-clusters, chart value manager.localClusters"],
)

default _purpose_name(_) := ""

_purpose_name(request) := request.purpose if is_string(request.purpose)

# The effective lifetime: the requested one, else the purpose's default. Zero when neither
# is known (an unknown purpose without a ttl, or a ttl that is not a number).
_lifetime(request, purposes) := request.ttl_seconds if {
	is_number(request.ttl_seconds)
} else := purposes[request.purpose].default_lifetime_seconds if {
	not _ttl_given(request)
} else := 0

# null is how Go may write an unset spec.ttl.
_ttl_given(request) if request.ttl_seconds != null

_whole_number(value) if {
	is_number(value)
	value == floor(value)
}

_certificate(purpose, _) := {"kind": "talos", "talos_role": purpose.talos_role} if {
	purpose.kind == "talos"
}

# The credential check knows no requester: the common name and a binding's group are known
# only at issuance, and nothing is signed on the check.
_certificate(purpose, "") := {"kind": "kubernetes", "groups": object.get(purpose, "groups", [])} if {
	purpose.kind == "kubernetes"
}

_certificate(purpose, username) := {
	"kind": "kubernetes",
	"groups": array.concat(object.get(purpose, "groups", []), _binding_groups(purpose)),
	"common_name": _person_identity(purpose, username),
} if {
	purpose.kind == "kubernetes"
	username != ""
}

# What a person is handed, as the admission record pins it and issuance compares it (see
# CredentialNotAdmitted): the Talos role, or the certificate's common name, its fixed groups
# and the role the person's own group is bound to. The binding's name (its nonce) is drawn
# at issuance and is not part of it; the person is, through the common name.
_credential(purpose, _) := {"kind": "talos", "credential": purpose.credential, "talos_role": purpose.talos_role} if {
	purpose.kind == "talos"
}

_credential(purpose, username) := object.union_n([
	{"kind": "kubernetes", "credential": purpose.credential, "groups": object.get(purpose, "groups", [])},
	{"common_name": identity | identity := _person_identity(purpose, username)},
	{"bound_to": role | role := _config.person_identity.binding_roles[purpose.identity]},
]) if {
	purpose.kind == "kubernetes"
}

# The person's own group, for a purpose whose identity is bound by a binding of its own.
_binding_groups(purpose) := [_admin_binding.group] if {
	_config.person_identity.binding_roles[purpose.identity]
} else := []
