# METADATA
# title: Kubelet serving certificates
# description: |
#   Decides certificate signing requests of the signer kubernetes.io/kubelet-serving (ADR
#   0125). A request is approved only when it asks for exactly the node's own identity as
#   the Talos API reports it: the Nodename or hostname as DNS names and the kubelet's node
#   IPs as IP addresses. Neither the request's names nor the Node object are identity.
#
#   Precedence, and why: a parsed request for a node name no machine of an enabled cluster
#   has stays pending, never denied (ADR 0125): it may be another approver's, and pending is
#   reversible. One that does not parse, or for a managed machine is malformed, badly signed
#   or from a requester with too many newer requests, is denied at once: no identity could
#   make it approvable. Otherwise a node whose identity could not be read leaves it pending.
#   Only then are the remaining checks applied, every failing one reported, sorted by code.
#   A request that passes them all is still left pending while the API server holds more
#   undecided requests than its machines explain: a flood is for a person to look at.
#
#   Input: input.csr (the facts the CSR carries, built by Go from the object), input.machine
#   (the TalosMachine with that node name, absent if none), input.node (the identity read
#   from the Talos API, absent if not read) and input.requests (counts Go takes from its
#   cache: from_requester, the requester's undecided kubelet serving requests, this one
#   included; newer_from_requester, how many of its requests, decided or not, are newer;
#   undecided, those whose requester is the node a machine of the clusters judging this API
#   server answers to, and unknown, every other, each requester's counted up to the limits'
#   max_undecided_per_requester; machines, those clusters' machines; absent counts are 0).
package ichor.kubelet_serving

import data.ichor.lib.csr as lib_csr
import data.ichor.lib.keys as lib_keys
import data.ichor.lib.reasons as lib_reasons

# The tables of data.json, beside this file, under "config": the rules share the path.
_config := data.ichor.kubelet_serving.config

_request := input.csr.request

# METADATA
# title: Kubelet serving decision
# description: |
#   The decision for one kubelet-serving CSR: {"action": "approve"|"deny"|"pending",
#   "reasons": [{"code", "message"}], "node": name}. Undefined for any other signer,
#   so a request this rule does not govern is never decided by it.
# entrypoint: true
decision := _decide if input.csr.signer_name == _config.signer_name

_decide := _verdict("pending", pending) if {
	not _machine
	_request.parsed == true
}

else := _verdict("deny", rejected) if count(rejected) > 0

else := _verdict("pending", pending) if count(pending) > 0

else := _verdict("deny", deny) if count(deny) > 0

else := _verdict("pending", withheld) if count(withheld) > 0

else := _verdict("approve", {approved})

# METADATA
# title: Kubelet serving limits
# description: |
#   What Go needs from the tables before it counts: {"max_undecided_per_requester": n,
#   "node_user_prefix": p}. Go counts each requester's undecided requests up to n, so that
#   one node's flood, which the rule denies beyond n, does not make the API server look
#   flooded to every other node; into input.requests.undecided when the requester is p
#   followed by the request's node name and a machine answers to that name, into
#   input.requests.unknown otherwise. Of a requester with more than n, those for its own
#   node name are counted first: the count of undecided is the highest its requests allow.
# entrypoint: true
limits := {
	"max_undecided_per_requester": _config.max_undecided_per_requester,
	"node_user_prefix": _config.node_user_prefix,
}

# METADATA
# title: Kubelet serving rejection
# description: |
#   The decision, for a managed machine, when it is a rejection no identity could change
#   ({"action": "deny", ...} as the decision has it); undefined otherwise. Go asks it before
#   it reads the node over the Talos API when the requester has several undecided requests,
#   so that a flood from one node credential costs no Talos read.
# entrypoint: true
rejection := _verdict("deny", rejected) if {
	input.csr.signer_name == _config.signer_name
	_machine
	count(rejected) > 0
}

_verdict(action, reasons) := {
	"action": action,
	"reasons": lib_reasons.capped(reasons, _config.max_reasons_per_code),
	"node": lib_csr.logged_node(_node_name),
}

# METADATA
# title: Approved
# description: Every check passed; the message names the node.
# custom:
#   code: IchorKubeletServing
approved := {
	"code": "IchorKubeletServing",
	"message": sprintf(
		"kubelet serving certificate for node %q (machine %q) matches its identity read from the Talos API",
		[_node_name, _machine_name],
	),
}

# METADATA
# title: Unparseable request
# description: |
#   spec.request is not exactly what the signer signs: the first PEM block must be a
#   PKCS#10 request of type CERTIFICATE REQUEST, and the only block (lib/csr's malformed).
# custom:
#   code: MalformedRequest
rejected contains reason if {
	some problem in lib_csr.malformed(object.get(input, ["csr", "request"], {}))
	reason := {"code": "MalformedRequest", "message": concat(" ", ["spec.request", problem])}
}

# METADATA
# title: Invalid signature
# description: The request is not signed by the key it carries, so whoever made it may not hold that key.
# custom:
#   code: InvalidSignature
rejected contains reason if {
	_request.parsed == true
	not _request.signature_valid == true
	reason := {
		"code": "InvalidSignature",
		"message": sprintf(
			"the request's signature does not verify with its public key: %s",
			[_signature_error],
		),
	}
}

# METADATA
# title: Too many requests from the requester
# description: |
#   The requester (a node's credential) has made at least data.json's
#   max_undecided_per_requester kubelet serving requests newer than this one, decided or
#   not (counting the decided ones too makes the verdict independent of the order the
#   requests are judged in). The oldest are denied and the newest kept: a kubelet's certificate
#   manager waits on the request it made last and abandons an older one, so a kubelet that
#   asked again keeps its chance, while a credential that creates requests without end
#   gets a bounded number of them decided, each denied before its node is read.
# custom:
#   code: TooManyRequests
rejected contains reason if {
	newer := _count("newer_from_requester")
	newer >= _config.max_undecided_per_requester
	reason := {
		"code": "TooManyRequests",
		"message": sprintf(
			"%s has %d undecided kubelet serving requests and %d newer than this one; %s",
			[
				_username, _count("from_requester"), newer,
				sprintf("only the newest %d are decided", [_config.max_undecided_per_requester]),
			],
		),
	}
}

# METADATA
# title: Too many undecided requests
# description: |
#   The API server holds more undecided requests that Ichor could approve (those of a node
#   a machine judging it answers to) than its machines explain: more than
#   max_undecided_per_machine per machine, and more than min_undecided_allowance in all.
#   Nothing is approved until a person has looked (the condition KubeletServingRequests,
#   the metric ichor_kubelet_serving_flood_guard); requests that fail a check are still
#   denied. Requests for names no machine has (input.requests.unknown) do not count: a
#   bootstrap token gets a node identity for any name, and such names must not hold up a
#   real node. Each is left pending (MachineUnknown) with one decision.
# custom:
#   code: TooManyPendingRequests
withheld contains reason if {
	limit := max([_config.min_undecided_allowance, _config.max_undecided_per_machine * _count("machines")])
	_count("undecided") > limit
	reason := {
		"code": "TooManyPendingRequests",
		"message": sprintf(
			"%d kubelet serving requests are undecided, more than the %d that %d machines explain; %s",
			[_count("undecided"), limit, _count("machines"), "none is approved until a person looks"],
		),
	}
}

# METADATA
# title: Unknown machine
# description: |
#   No machine of an enabled cluster has this node name: the request may be a node's Ichor
#   does not manage, or precede its machine's status, so it is left for a person or another
#   approver, never denied, whatever else is wrong with it.
# custom:
#   code: MachineUnknown
pending contains reason if {
	not _machine
	reason := {
		"code": "MachineUnknown",
		"message": sprintf(
			"no managed machine has node name %q; left pending for another approver or a person",
			[_node_name],
		),
	}
}

# METADATA
# title: Several machines have the node name
# description: |
#   More than one managed machine, of the clusters judging this API server, answers to the
#   request's node name. Which node asks cannot be told, so the request stays pending until
#   the names are unique again.
# custom:
#   code: MachineAmbiguous
pending contains reason if {
	_machine_candidates > 1
	reason := {
		"code": "MachineAmbiguous",
		"message": sprintf(
			"%v managed machines answer to node name %q; left pending until only one does",
			[input.machine_candidates, _node_name],
		),
	}
}

# METADATA
# title: Node identity unreadable
# description: |
#   The node's identity could not be read from the Talos API. The rule fails closed: the
#   request stays pending and is decided again once the node answers.
# custom:
#   code: NodeUnreadable
pending contains reason if {
	_machine
	not input.node.readable == true
	reason := {
		"code": "NodeUnreadable",
		"message": sprintf(
			"the identity of node %q could not be read from the Talos API: %s",
			[_node_name, _node_error],
		),
	}
}

# METADATA
# title: Node name disagrees with Talos
# description: |
#   The machine found for the request's node name reports another Nodename over the Talos
#   API. The machine's recorded name is stale or wrong; the request stays pending until
#   the two agree, rather than being judged against the wrong node.
# custom:
#   code: NodenameMismatch
pending contains reason if {
	input.node.readable == true
	_node_name != ""
	nodename := object.get(input.node, "nodename", "")
	nodename != _node_name
	reason := {
		"code": "NodenameMismatch",
		"message": sprintf(
			"machine %q was found for node name %q but Talos reports Nodename %q",
			[_machine_name, _node_name, nodename],
		),
	}
}

# METADATA
# title: Requester is not the node
# description: spec.username must be system:node:<name>, with <name> the common name of the request.
# custom:
#   code: UsernameMismatch
deny contains reason if {
	_username != concat("", [_config.node_user_prefix, _node_name])
	reason := {
		"code": "UsernameMismatch",
		"message": sprintf(
			"requested by %q, not by %q",
			[_username, concat("", [_config.node_user_prefix, _node_name])],
		),
	}
}

# METADATA
# title: Requester is not in the nodes group
# description: spec.groups must contain system:nodes.
# custom:
#   code: GroupMissing
deny contains reason if {
	not _config.node_group in _groups
	reason := {
		"code": "GroupMissing",
		"message": sprintf(
			"the requester's groups %v do not include %q",
			[object.get(input.csr, "groups", []), _config.node_group],
		),
	}
}

# METADATA
# title: Subject is not the node's
# description: |
#   The subject must be exactly CN=system:node:<name>, O=system:nodes: one common name with
#   the node prefix, one organization, and no other attribute.
# custom:
#   code: SubjectMismatch
deny contains reason if {
	not _subject_is_node
	reason := {
		"code": "SubjectMismatch",
		"message": sprintf(
			"the subject is %s, not exactly CN=system:node:<name>, O=%s",
			[_subject_text, _config.node_group],
		),
	}
}

# METADATA
# title: Forbidden name type
# description: Only DNS names and IP addresses may be requested; an email address, URI or other name type is refused.
# custom:
#   code: SANTypeForbidden
deny contains reason if {
	some message in _sans_of_forbidden_type(_sans)
	reason := {"code": "SANTypeForbidden", "message": message}
}

# METADATA
# title: No names
# description: A serving certificate must name the node; a request without any subject alternative name is refused.
# custom:
#   code: SANMissing
deny contains reason if {
	_sans_missing(_sans)
	reason := {
		"code": "SANMissing",
		"message": "the request has no subject alternative name; it must name the node's DNS names or IP addresses",
	}
}

# METADATA
# title: DNS name is not the node's
# description: Every DNS name must be the node's Nodename or its hostname, as read from the Talos API.
# custom:
#   code: DNSNameNotNode
deny contains reason if {
	some message in _dns_names_not_node(_sans, input.node)
	reason := {"code": "DNSNameNotNode", "message": message}
}

# METADATA
# title: IP address is not the node's
# description: Every IP address must be one of the addresses Talos gives the kubelet (the NodeIP resource "kubelet").
# custom:
#   code: IPNotNode
deny contains reason if {
	some message in _ips_not_node(_sans, input.node)
	reason := {"code": "IPNotNode", "message": message}
}

# METADATA
# title: Usages not allowed
# description: |
#   The usages must be exactly {digital signature, server auth} or exactly
#   {digital signature, key encipherment, server auth}: the two sets the signer permits.
# custom:
#   code: UsagesNotAllowed
deny contains reason if {
	not lib_csr.usages_allowed(object.get(input.csr, "usages", []), _config.allowed_usage_sets)
	reason := {
		"code": "UsagesNotAllowed",
		"message": sprintf(
			"usages %v are not one of the allowed sets %v",
			[object.get(input.csr, "usages", []), [usages | some usages in _config.allowed_usage_sets]],
		),
	}
}

# METADATA
# title: Public key type not allowed
# description: |
#   The request's key must be one of the table of policy/ichor/lib/keys, the one table of
#   sound keys every rule reads: ECDSA on P-256 or P-384 (what the kubelet makes by default),
#   RSA of 2048 to 8192 bits, or Ed25519. A certificate lives for up to a year; one for a key
#   that can be factored or whose curve is weak is refused, whatever it names.
# custom:
#   code: PublicKeyNotAllowed
deny contains reason if {
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
# title: Extension not allowed
# description: The request may carry no extension other than subjectAltName.
# custom:
#   code: ExtensionForbidden
deny contains reason if {
	extensions := lib_csr.list(object.get(_request, "extensions", null))

	# An extension without an OID (or not an object) is none of the allowed: a lookup of its
	# missing OID under not would skip it.
	allowed := {ext | some ext in extensions; _config.allowed_extensions[ext.oid]}
	some ext in extensions
	not ext in allowed
	reason := {
		"code": "ExtensionForbidden",
		"message": sprintf(
			"requested extension %s is not allowed; only subjectAltName is",
			[lib_csr.name_text(ext, "oid")],
		),
	}
}

# METADATA
# title: Lifetime too long
# description: spec.expirationSeconds may not exceed the cap in data (max_expiration_seconds, one year by default).
# custom:
#   code: ExpirationTooLong
deny contains reason if {
	_expiration_too_long
	reason := {
		"code": "ExpirationTooLong",
		"message": sprintf(
			"expirationSeconds %v exceeds the cap of %d",
			[input.csr.expiration_seconds, _config.max_expiration_seconds],
		),
	}
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

default _node_error := "it was not read"

_node_error := input.node.error if input.node.error != ""

_subject_is_node if _subject_is_node_of(_request)

# Exactly CN=system:node:<name>, O=system:nodes: a request's subject, or a certificate's in service.
_subject_is_node_of(named) if {
	count(named.subject) == 2
	lib_csr.node_name(named, _config.node_user_prefix) != ""
	lib_csr.organizations(named) == [_config.node_group]
}

_subject_text := _subject_text_of(_request)

_subject_text_of(named) := concat(", ", [sprintf("%s=%s", [lib_csr.attribute_label(attr), attr.value]) |
	some attr in named.subject
])
