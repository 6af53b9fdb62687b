package ichor.kubelet_serving

import data.ichor.lib.csr as lib_csr
import data.ichor.lib.reasons as lib_reasons

_certificate := input.certificate

# The certificate's names as lib/csr reads a request's: each {"type", "value"}, none for none.
_certificate_sans := lib_csr.list(object.get(_certificate, "subject_alt_names", null))

# METADATA
# title: Kubelet serving certificate audit
# description: |
#   Judges a kubelet serving certificate in service, as the kubelet presented it in a TLS
#   handshake, against the node's identity read today from its Talos API:
#   {"status": "current"|"drifted"|"unknown", "reasons": [{"code", "message"}], "node": name}.
#   Approval is a moment; the certificate lives for a year, and the node's addresses may
#   move in that time. Its names are judged by the very checks that approve a request
#   (DNSNameNotNode, IPNotNode, SANTypeForbidden), so a certificate whose names drifted names
#   what would not be approved today. Its key, its lifetime and its exact usages are not judged
#   again: only that server auth is among them.
#
#   drifted: a check failed (names no longer the node's, or names no serving certificate may
#   have; not issued by the cluster's CA; not for serving; not yet valid; expiring within
#   audit_expiry_warning_days of data.json). unknown: the certificate or the node could not be
#   read, so nothing could be judged: that is not drift. What needs only the certificate (its
#   issuer, usages, validity, and the types of its names) is judged even when the node could not
#   be read. A drifted verdict lists what drifted first, then what could not be judged: its first
#   reason, which the machine's condition and Event are named by, is a drift.
#
#   Input: input.certificate (the facts of the served leaf, built by Go: read and error,
#   subject, subject_alt_names, san_error, serial, issuer, ext_key_usages, not_before and
#   not_after in RFC 3339 for messages, not_before_unix and not_after_unix in Unix seconds,
#   issued_by_cluster_ca and verify_error), input.node (the identity read from the Talos API,
#   as for approval), input.machine, input.now (RFC 3339, for messages) and input.now_unix
#   (Unix seconds). The rule does not read the clock, and parses no time: it computes with the
#   Unix seconds, so that a certificate valid until 9999 (RFC 5280's "no expiry") is judged like
#   any other. Undefined without input.certificate.
# entrypoint: true
audit := _audit_verdict("drifted", array.concat(_capped(audit_drift), _capped(audit_unknown))) if {
	_certificate
	count(audit_drift) > 0
} else := _audit_verdict("unknown", _capped(audit_unknown)) if {
	_certificate
	count(audit_unknown) > 0
} else := _audit_verdict("current", _capped({audit_current})) if _certificate

_audit_verdict(status, reasons) := {
	"status": status,
	"reasons": reasons,
	"node": object.get(input, ["node", "nodename"], ""),
}

_capped(reasons) := lib_reasons.capped(reasons, _config.max_reasons_per_code)

# METADATA
# title: Certificate current
# description: |
#   The certificate in service names only the node's identity read today from the Talos API,
#   was issued by the cluster's CA, is for serving (server auth), is valid at the audit's time,
#   and does not expire within audit_expiry_warning_days.
# custom:
#   code: CertificateCurrent
audit_current := {
	"code": "CertificateCurrent",
	"message": sprintf(
		"the kubelet serving certificate of machine %q (serial %s) names only the node's identity, %s, expiring %s",
		[input.machine.name, _certificate.serial, "was issued by the cluster's CA", _certificate.not_after],
	),
}

# METADATA
# title: Certificate unreadable
# description: |
#   The kubelet did not present a certificate (it refused the connection, did not answer within
#   the timeout, or the handshake failed). Nothing could be judged: the status is unknown, not
#   drifted, and the audit asks again next time.
# custom:
#   code: CertificateUnreadable
audit_unknown contains reason if {
	not _certificate.read
	reason := {
		"code": "CertificateUnreadable",
		"message": sprintf(
			"the kubelet serving certificate of machine %q could not be read at %s: %s",
			[input.machine.name, _certificate.address, _certificate.error],
		),
	}
}

# METADATA
# title: Node identity unreadable during the audit
# description: |
#   The node's identity could not be read from the Talos API, so the certificate's names
#   could not be judged. What needs only the certificate (its issuer, usages, validity and the
#   types of its names) is still judged; with none of it failing, the status is unknown.
# custom:
#   code: CertificateNodeUnreadable
audit_unknown contains reason if {
	not input.node.readable == true
	reason := {
		"code": "CertificateNodeUnreadable",
		"message": sprintf(
			"the identity of machine %q could not be read from the Talos API, so its certificate's names were not judged: %s",
			[input.machine.name, _node_error],
		),
	}
}

# METADATA
# title: Certificate names no longer the node's
# description: |
#   The certificate in service names what is not the node's today: a DNS name that is neither
#   its Nodename nor its hostname, an IP address Talos no longer gives the kubelet (an address
#   moved after issuance), a subject for another node name; or names no serving certificate may
#   have: a subject that is not exactly CN=system:node:<name>, O=system:nodes (SubjectMismatch
#   at approval), a name of a type approval forbids (a URI, an email address, another type), no
#   DNS name or IP address at all, or names that do not parse. One reason per name, with the
#   message approval gives (DNSNameNotNode, IPNotNode, SANTypeForbidden). The subject's shape, the
#   types and the parse are judged without the node; the rest only when the node was read. A client that connects by the
#   node's new address is refused; renew the certificate (delete the kubelet's serving pair, or
#   restart it) so that it asks for today's names.
# custom:
#   code: CertificateNamesNotNode
audit_drift contains reason if {
	some problem in _certificate_names_not_node
	reason := {
		"code": "CertificateNamesNotNode",
		"message": sprintf(
			"the kubelet serving certificate of machine %q (serial %s) names what is no longer the node's: %s",
			[input.machine.name, _certificate.serial, problem],
		),
	}
}

# METADATA
# title: Certificate not issued by the cluster's CA
# description: |
#   The chain the kubelet served does not verify against the cluster's Kubernetes CA (the one in
#   its secrets bundle, which signs kubelet serving certificates, and during a CA rotation the
#   previous bundle's beside it, as approval records them): a self-signed certificate, or one
#   from another CA. A kube-apiserver that verifies kubelets refuses it.
# custom:
#   code: CertificateNotIssuedByClusterCA
audit_drift contains reason if {
	_certificate.read
	not _certificate.issued_by_cluster_ca
	reason := {
		"code": "CertificateNotIssuedByClusterCA",
		"message": sprintf(
			"the kubelet serving certificate of machine %q (serial %s, issuer %q) was not issued by the cluster's CA: %s",
			[input.machine.name, _certificate.serial, _certificate.issuer, _certificate.verify_error],
		),
	}
}

# METADATA
# title: Certificate not for serving
# description: |
#   The certificate in service does not carry the extended key usage server auth, which every
#   certificate the kubelet serving signer issues has (approval allows no usage set without it):
#   a client certificate of the node (client auth only, with the same subject and the same CA),
#   or a certificate without the extension. It is not what approval let the kubelet serve, and a
#   client that checks usages refuses it.
# custom:
#   code: CertificateNotForServing
audit_drift contains reason if {
	_certificate.read
	usages := object.get(_certificate, "ext_key_usages", [])
	not _config.audit_serving_ext_key_usage in usages
	reason := {
		"code": "CertificateNotForServing",
		"message": sprintf(
			"the kubelet serving certificate of machine %q (serial %s) is not for serving: %s %v do not include %q",
			[
				input.machine.name, _certificate.serial, "its extended key usages",
				usages, _config.audit_serving_ext_key_usage,
			],
		),
	}
}

# METADATA
# title: Certificate not yet valid
# description: |
#   The certificate in service is valid only from a time after the audit's: a client refuses
#   it until then. The signer backdates what it issues, so the clock of the signer, or of the
#   machine the audit runs on, is wrong, or the certificate was not made by the signer.
# custom:
#   code: CertificateNotYetValid
audit_drift contains reason if {
	_certificate.read
	input.now_unix < _certificate.not_before_unix
	reason := {
		"code": "CertificateNotYetValid",
		"message": sprintf(
			"the kubelet serving certificate of machine %q (serial %s) is valid only from %s, after the audit's time %s",
			[input.machine.name, _certificate.serial, _certificate.not_before, input.now],
		),
	}
}

# METADATA
# title: Certificate expires soon
# description: |
#   The certificate in service expires within audit_expiry_warning_days of data.json (30 by
#   default), or has expired. The kubelet renews before expiry by itself; one that has not is
#   stuck (its requests pending or denied, or its clock wrong).
# custom:
#   code: CertificateExpiresSoon
audit_drift contains reason if {
	_certificate.read
	_seconds_left < (_config.audit_expiry_warning_days * 24) * 3600
	reason := {
		"code": "CertificateExpiresSoon",
		"message": sprintf(
			"the kubelet serving certificate of machine %q (serial %s) %s %s, within the %d days warned of",
			[
				input.machine.name, _certificate.serial, _expiry_verb(_seconds_left),
				_certificate.not_after, _config.audit_expiry_warning_days,
			],
		),
	}
}

# Seconds from the audit to the certificate's end, in integers: no time is parsed. An input
# without them (hand-made, or logged before they were facts) counts as expired: it fails closed.
default _seconds_left := 0

_seconds_left := _certificate.not_after_unix - input.now_unix if {
	is_number(_certificate.not_after_unix)
	is_number(input.now_unix)
}

_expiry_verb(left) := "expired at" if left <= 0

else := "expires at"

# What the certificate names that is not the node's; judged only when both were read.
# The subject's shape needs no node: judged even when the node could not be read.
_certificate_names_not_node contains problem if {
	_certificate.read
	not _subject_is_node_of(_certificate)
	problem := sprintf(
		"its subject is %s, not exactly CN=system:node:<name>, O=%s",
		[_subject_text_of(_certificate), _config.node_group],
	)
}

_certificate_names_not_node contains problem if {
	_certificate.read
	input.node.readable == true
	some problem in (_dns_names_not_node(_certificate_sans, input.node) | _ips_not_node(_certificate_sans, input.node))
}

_certificate_names_not_node contains problem if {
	_certificate.read
	input.node.readable == true
	name := lib_csr.node_name(_certificate, _config.node_user_prefix)
	nodename := object.get(input.node, "nodename", "")
	name != nodename
	problem := sprintf("its subject names node %q, but Talos reports Nodename %q", [name, nodename])
}

# Names no serving certificate may have, judged without the node: a type approval forbids
# (SANTypeForbidden's check), none of the types it allows, or names that do not parse.
_certificate_names_not_node contains problem if {
	_certificate.read
	some problem in _sans_of_forbidden_type(_certificate_sans)
}

_certificate_names_not_node contains problem if {
	_certificate.read
	not _certificate.san_error
	_sans_missing([san | some san in _certificate_sans; _config.allowed_san_types[san.type]])
	problem := "it has no DNS name or IP address, and a serving certificate must name the node by them"
}

_certificate_names_not_node contains problem if {
	_certificate.read
	_certificate.san_error
	problem := sprintf("its subjectAltName extension does not parse: %s", [_certificate.san_error])
}
