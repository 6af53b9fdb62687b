# METADATA
# title: Kubelet client certificates
# description: |
#   Decides certificate signing requests of the signer
#   kubernetes.io/kube-apiserver-client-kubelet the way kube-controller-manager's CSR
#   approver (pkg/controller/certificates/approver/sarapprove.go) does, so that the
#   decision is logged and replayable like every other one.
#
#   Two recognizers say what a request is. node-client: the request parses and its
#   signature verifies, the subject's organizations are exactly [system:nodes], it has
#   one common name system:node:<name>, no subject alternative name of any type, and its
#   usages are exactly one of the sets in data (compared as lists of the same length, so
#   an extra or repeated usage does not pass). self-node-client: node-client, and
#   spec.username is the common name (a node renewing its own certificate).
#
#   Recognizing a request is not authorizing it. Go performs, as the requester (user,
#   uid, groups and extra of the CSR spec), the SubjectAccessReviews "create
#   certificatesigningrequests/selfnodeclient" and "create
#   certificatesigningrequests/nodeclient" in certificates.k8s.io, and gives their results
#   as input.authorization. As in sarapprove, a self-node-client request whose
#   selfnodeclient permission is allowed is approved as selfnodeclient; otherwise a
#   node-client request (self or not) whose nodeclient permission is allowed is approved
#   as nodeclient.
#
#   This rule never denies: a request that is not recognized, or recognized but not
#   authorized, is left pending with every reason why, for a person or another approver.
#   Regardless of the recognizers and of data, a subject with an organization other than
#   system:nodes, or carrying system:masters, is never approved. With
#   require_managed_machine in data, the node must also be a managed machine.
#
#   Input: input.csr (the facts the CSR carries, built by Go from the object),
#   input.authorization ({"selfnodeclient": review, "nodeclient": review}, each
#   {"allowed", "reason", "evaluation_error"}) and input.machine (the TalosMachine with
#   the node name, absent if none).
package ichor.kubelet_client

import data.ichor.lib.csr as lib_csr
import data.ichor.lib.keys as lib_keys
import data.ichor.lib.reasons as lib_reasons

# The tables of data.json, beside this file. They sit under "config" because the
# package's own rules share the path data.ichor.kubelet_client.
_config := data.ichor.kubelet_client.config

_request := input.csr.request

# Go always gives every fact, but a hand-made input (opa eval, a test case, a log from an
# older build) may lack one or hold it as another type. A check over a missing fact is
# undefined: it reports nothing, and a request with nothing reported is recognized (review
# 210). So the facts a message names are read with object.get, flags are tested against the
# boolean true (null and "yes" are truthy to a bare reference), and a missing requester is
# no one, whom no review allows.
_username := object.get(input.csr, "username", "")

# The machine the node name found: an object; anything else (null, a string) is none.
_machine := input.machine if is_object(input.machine)

# METADATA
# title: Kubelet client decision
# description: |
#   The decision for one kube-apiserver-client-kubelet CSR: {"action": "approve"|"pending",
#   "reasons": [{"code", "message"}], "node": name, "kind": "selfnodeclient"|"nodeclient"|""}.
#   "kind" is the kind the request is approved as, or would be but for the guard, the key
#   table or the managed-machine requirement; else the most specific kind it was recognized
#   as; else "".
#   Undefined for any other signer, so a request this rule does not govern is never
#   decided by it.
# entrypoint: true
decision := _decide if input.csr.signer_name == _config.signer_name

# Every reason is one of pending: nothing here is ever denied.
_blocking := (((unrecognized | unauthorized) | privileged) | unmanaged) | restricted

_decide := _verdict("approve", {approved}) if {
	count(_blocking) == 0
	_authorized_kind
} else := _verdict("pending", _blocking)

_verdict(action, reasons) := {
	"action": action,
	"reasons": lib_reasons.capped(reasons, _config.max_reasons_per_code),
	"node": lib_csr.logged_node(_node_name),
	"kind": _kind,
}

# METADATA
# title: Approved
# description: Recognized and authorized; the message names the node, the kind and the permission.
# custom:
#   code: IchorKubeletClient
approved := {
	"code": "IchorKubeletClient",
	"message": sprintf(
		"kubelet client certificate for node %q approved as %s: %q may create %s",
		[_node_name, _authorized_kind, _username, _config.kinds[_authorized_kind].subresource],
	),
}

# METADATA
# title: Unparseable request
# description: |
#   spec.request is not exactly what kube-controller-manager signs, so it recognizes nothing
#   in it either: its approver and signer read the first PEM block, which must be a PKCS#10
#   request of type CERTIFICATE REQUEST (not NEW CERTIFICATE REQUEST; its headers change
#   nothing), and this rule also refuses a further block (lib/csr's malformed). The subject
#   checks are not reported for a request that does not parse, since there is no subject.
# custom:
#   code: MalformedRequest
unrecognized contains reason if {
	some problem in lib_csr.malformed(object.get(input, ["csr", "request"], {}))
	reason := {
		"code": "MalformedRequest",
		"message": concat(" ", ["not recognized: spec.request", problem]),
	}
}

# METADATA
# title: Invalid signature
# description: The request is not signed by the key it carries, so whoever made it may not hold that key.
# custom:
#   code: InvalidSignature
unrecognized contains reason if {
	_request.parsed == true
	not _request.signature_valid == true
	reason := {
		"code": "InvalidSignature",
		"message": sprintf(
			"not recognized: the request's signature does not verify with its public key: %s",
			[_signature_error],
		),
	}
}

# METADATA
# title: Organization is not system:nodes
# description: The subject's organizations must be exactly [system:nodes], one O attribute with that value.
# custom:
#   code: OrganizationNotNodes
unrecognized contains reason if {
	_request.parsed == true
	organizations := lib_csr.organizations(_request)
	organizations != [_config.node_organization]
	reason := {
		"code": "OrganizationNotNodes",
		"message": sprintf(
			"%s: the subject's organizations are %v, not exactly [%q]",
			[_not_node_client, organizations, _config.node_organization],
		),
	}
}

# METADATA
# title: Common name is not a node's
# description: The subject must have exactly one common name, system:node:<name> with a non-empty name.
# custom:
#   code: CommonNameNotNode
unrecognized contains reason if {
	_request.parsed == true
	_node_name == ""
	reason := {
		"code": "CommonNameNotNode",
		"message": sprintf(
			"%s: the subject's common names are %v, not exactly one %s<name>",
			[_not_node_client, lib_csr.common_names(_request), _config.node_user_prefix],
		),
	}
}

# METADATA
# title: Subject alternative name present
# description: |
#   A node client certificate names the node only in its subject: a DNS name, IP address,
#   email address, URI or a name of any other type makes the request unrecognized.
# custom:
#   code: SANPresent
unrecognized contains reason if {
	some san in lib_csr.list(object.get(_request, "subject_alt_names", null))
	reason := {
		"code": "SANPresent",
		"message": sprintf(
			"%s: it has the subject alternative name %q of type %s, and a node client certificate has none",
			[_not_node_client, lib_csr.name_text(san, "value"), lib_csr.name_text(san, "type")],
		),
	}
}

# METADATA
# title: Usages not allowed
# description: |
#   The usages must be exactly one of the sets in data: {client auth, digital signature,
#   key encipherment}, which a kubelet with an RSA key requests, or {client auth, digital
#   signature}, which a kubelet with an ECDSA or Ed25519 key (the kubelet's default)
#   requests. A usage more, less or repeated does not match.
# custom:
#   code: UsagesNotAllowed
unrecognized contains reason if {
	not lib_csr.usages_allowed(object.get(input.csr, "usages", []), _config.allowed_usage_sets)
	reason := {
		"code": "UsagesNotAllowed",
		"message": sprintf(
			"%s: usages %v are not one of the sets %v",
			[_not_node_client, object.get(input.csr, "usages", []), [usages | some usages in _config.allowed_usage_sets]],
		),
	}
}

# METADATA
# title: Public key type not allowed
# description: |
#   The request's key must be one of the table of policy/ichor/lib/keys, the one table of
#   sound keys every rule reads: ECDSA on P-256 or P-384 (what the kubelet makes by default),
#   RSA of 2048 to 8192 bits, or Ed25519. kube-controller-manager recognizes and approves any
#   key; this rule recognizes the request as kube-controller-manager does, and leaves one for
#   a weak key pending for a person, its kind said (so that the operator is told, as of any
#   recognized request left pending: review 238 F1).
# custom:
#   code: PublicKeyNotAllowed
restricted contains reason if {
	_request.parsed == true
	not lib_keys.allowed(object.get(_request, "public_key", {}), lib_keys.algorithms)
	reason := {
		"code": "PublicKeyNotAllowed",
		"message": sprintf(
			"public key %q is not allowed; allowed are %s",
			[lib_keys.text(object.get(_request, "public_key", {})), lib_keys.algorithms_text(lib_keys.algorithms)],
		),
	}
}

# METADATA
# title: Self node client not authorized
# description: |
#   Recognized as selfnodeclient, but the requester may not create
#   certificatesigningrequests/selfnodeclient, and the nodeclient permission did not
#   approve it either.
# custom:
#   code: SelfNodeClientNotAuthorized
unauthorized contains reason if {
	_self_node_client
	not _authorized_kind
	reason := {
		"code": "SelfNodeClientNotAuthorized",
		"message": sprintf(
			"recognized as selfnodeclient, but %q may not create %s: %s",
			[_username, _config.kinds.selfnodeclient.subresource, _review("selfnodeclient")],
		),
	}
}

# METADATA
# title: Node client not authorized
# description: |
#   Recognized as nodeclient, but the requester may not create
#   certificatesigningrequests/nodeclient (and, for a self request, not
#   certificatesigningrequests/selfnodeclient either). The message says why a request is
#   not selfnodeclient when it is not.
# custom:
#   code: NodeClientNotAuthorized
unauthorized contains reason if {
	_node_client
	not _authorized_kind
	reason := {
		"code": "NodeClientNotAuthorized",
		"message": sprintf(
			"recognized as nodeclient%s, but %q may not create %s: %s",
			[_not_self_note, _username, _config.kinds.nodeclient.subresource, _review("nodeclient")],
		),
	}
}

# METADATA
# title: Privileged subject
# description: |
#   A guard that holds whatever the recognizers and data say: a subject with an
#   organization other than system:nodes, any attribute with the value system:masters, or
#   one whose OID or value is not text, is never approved. The organization is the group the
#   certificate authenticates as, and system:masters bypasses all authorization.
# custom:
#   code: PrivilegedSubject
privileged contains reason if {
	some attr in lib_csr.list(object.get(_request, "subject", null))
	_privileged_attribute(attr)
	reason := {
		"code": "PrivilegedSubject",
		"message": sprintf(
			"the subject carries %s=%s; %s",
			[lib_csr.attribute_label(attr), lib_csr.name_text(attr, "value"), _privileged_note],
		),
	}
}

# METADATA
# title: Unknown machine
# description: |
#   With require_managed_machine on in data, the node must belong to a managed TalosMachine.
#   Off by default, as kube-controller-manager does not ask. The request may belong to a node
#   Ichor does not manage, so it is left for a person or another approver.
# custom:
#   code: MachineUnknown
unmanaged contains reason if {
	_config.require_managed_machine == true
	not _machine
	reason := {
		"code": "MachineUnknown",
		"message": sprintf(
			"no managed machine has node name %q, and data requires one; left pending for another approver or a person",
			[_node_name],
		),
	}
}

_not_node_client := "not recognized as a node client certificate"

_privileged_note := concat(" ", [
	"a kubelet client certificate with an organization other than system:nodes,",
	"or with system:masters, is never approved",
])

# node-client holds exactly when no recognition check failed, so that a request is
# never recognized without the checks that the reasons report.
_node_client if count(unrecognized) == 0

_self_node_client if {
	_node_client
	_username == lib_csr.common_names(_request)[0]
}

# sarapprove's order: the self recognizer first, then node-client.
_authorized_kind := "selfnodeclient" if {
	_self_node_client
	_authorized("selfnodeclient")
} else := "nodeclient" if {
	_node_client
	_authorized("nodeclient")
}

default _kind := ""

_kind := _authorized_kind if {
	_authorized_kind != ""
} else := "selfnodeclient" if {
	_self_node_client
} else := "nodeclient" if {
	_node_client
}

# Only a boolean true allows; anything else (false, missing, a string) does not.
_authorized(kind) if input.authorization[kind].allowed == true

_review(kind) := sprintf(
	"the SubjectAccessReview did not allow it (reason %q, evaluation error %q)",
	[object.get(review, "reason", ""), object.get(review, "evaluation_error", "")],
) if {
	review := input.authorization[kind]
} else := "no SubjectAccessReview result was given"

default _not_self_note := ""

_not_self_note := sprintf(
	" (not selfnodeclient: spec.username %q is not the common name %q)",
	[_username, lib_csr.common_names(_request)[0]],
) if {
	not _self_node_client
}

# Why the signature did not verify. Go always sets it, but an input without it (a
# hand-made input) must still produce its reason: a reason that cannot be built would let
# the request through.
default _signature_error := "the input holds no signature error"

_signature_error := _request.signature_error if is_string(_request.signature_error)

# The node name the request claims, from the subject's common name. Empty when the
# request has no such name, so that messages and logs always have a string; the default
# covers an input without a request, for which the function is undefined.
default _node_name := ""

_node_name := lib_csr.node_name(_request, _config.node_user_prefix)

# Literal on purpose, not from data: a bundle's data can be replaced, this guard cannot.
_privileged_attribute(attr) if {
	attr.oid == "2.5.4.10"
	attr.value != "system:nodes"
}

_privileged_attribute(attr) if attr.value == "system:masters"

# An attribute whose value is not text (or that is not an attribute) could hold anything:
# the guard does not read it as harmless.
_privileged_attribute(attr) if not _text_value(attr)

# An attribute without a textual OID may be an organization the recognizers do not see.
_privileged_attribute(attr) if not _text_oid(attr)

_text_value(attr) if is_string(attr.value)

_text_oid(attr) if is_string(attr.oid)
