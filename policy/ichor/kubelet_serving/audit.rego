package ichor.kubelet_serving

import data.ichor.lib.csr as lib_csr
import data.ichor.lib.reasons as lib_reasons

_certificate := input.certificate

# METADATA
# title: Kubelet serving certificate audit
# description: |
#   Judges a kubelet serving certificate in service, as the kubelet presented it in a TLS
#   handshake, against the node's identity read today from its Talos API:
#   {"status": "current"|"drifted"|"unknown", "reasons": [{"code", "message"}], "node": name}.
#   Approval is a moment; the certificate lives for a year, and the node's addresses may
#   move in that time. Its names are judged by the very checks that approve a request
#   (DNSNameNotNode, IPNotNode), so a drifted certificate is one that would not be approved
#   today.
#
#   drifted: a check failed (names no longer the node's, not issued by the cluster's CA,
#   expiring within audit_expiry_warning_days of data.json). unknown: the certificate or the
#   node could not be read, so nothing could be judged: that is not drift. Issuer and expiry
#   are judged even when the node could not be read, since they need only the certificate.
#
#   Input: input.certificate (the facts of the served leaf, built by Go: read and error,
#   subject, subject_alt_names, serial, issuer, not_before, not_after, issued_by_cluster_ca
#   and verify_error), input.node (the identity read from the Talos API, as for approval),
#   input.machine and input.now (RFC 3339; the rule does not read the clock). Undefined
#   without input.certificate.
# entrypoint: true
audit := _audit_verdict("drifted", audit_drift | audit_unknown) if {
	_certificate
	count(audit_drift) > 0
} else := _audit_verdict("unknown", audit_unknown) if {
	_certificate
	count(audit_unknown) > 0
} else := _audit_verdict("current", {audit_current}) if _certificate

_audit_verdict(status, reasons) := {
	"status": status,
	"reasons": lib_reasons.capped(reasons, _config.max_reasons_per_code),
	"node": object.get(input, ["node", "nodename"], ""),
}

# METADATA
# title: Certificate current
# description: |
#   The certificate in service names only the node's identity read today from the Talos API,
#   was issued by the cluster's CA, and does not expire within audit_expiry_warning_days.
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
#   could not be judged. Issuer and expiry are still judged; with neither failing, the status
#   is unknown.
# custom:
#   code: CertificateNodeUnreadable
audit_unknown contains reason if {
	not input.node.readable
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
#   moved after issuance), a subject for another node name, or names that do not parse. One
#   reason per name, with the message approval gives (DNSNameNotNode, IPNotNode). A client
#   that connects by the node's new address is refused; renew the certificate (delete the
#   kubelet's serving pair, or restart it) so that it asks for today's names.
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
#   its secrets bundle, which signs kubelet serving certificates): a self-signed certificate, or
#   one from another CA. A kube-apiserver that verifies kubelets refuses it.
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
# title: Certificate expires soon
# description: |
#   The certificate in service expires within audit_expiry_warning_days of data.json (30 by
#   default), or has expired. The kubelet renews before expiry by itself; one that has not is
#   stuck (its requests pending or denied, or its clock wrong).
# custom:
#   code: CertificateExpiresSoon
audit_drift contains reason if {
	_certificate.read
	left := time.parse_rfc3339_ns(_certificate.not_after) - time.parse_rfc3339_ns(input.now)
	left < ((_config.audit_expiry_warning_days * 24) * 3600) * 1000000000
	reason := {
		"code": "CertificateExpiresSoon",
		"message": sprintf(
			"the kubelet serving certificate of machine %q (serial %s) %s %s, within the %d days warned of",
			[
				input.machine.name, _certificate.serial, _expiry_verb(left),
				_certificate.not_after, _config.audit_expiry_warning_days,
			],
		),
	}
}

_expiry_verb(left) := "expired at" if left <= 0

else := "expires at"

# What the certificate names that is not the node's; judged only when both were read.
_certificate_names_not_node contains problem if {
	_certificate.read
	input.node.readable
	sans := _certificate.subject_alt_names
	some problem in (_dns_names_not_node(sans, input.node) | _ips_not_node(sans, input.node))
}

_certificate_names_not_node contains problem if {
	_certificate.read
	input.node.readable
	name := lib_csr.node_name(_certificate, _config.node_user_prefix)
	name != input.node.nodename
	problem := sprintf("its subject names node %q, but Talos reports Nodename %q", [name, input.node.nodename])
}

_certificate_names_not_node contains problem if {
	_certificate.read
	input.node.readable
	_certificate.san_error
	problem := sprintf("its subjectAltName extension does not parse: %s", [_certificate.san_error])
}
