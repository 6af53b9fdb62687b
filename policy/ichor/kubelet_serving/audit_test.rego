package ichor.kubelet_serving_test

import data.ichor.kubelet_serving

# worker-1's certificate in service, as the kubelet served it, judged on 2026-06-01: it names
# the node's Nodename and address, the cluster's CA issued it, and it expires in seven months.
_in_service := {
	"machine": {"name": "worker-1", "namespace": "default", "cluster": "demo"},
	"node": {
		"readable": true,
		"error": "",
		"nodename": "worker-1",
		"hostname": "worker-1.lab",
		"addresses": ["10.5.0.2", "fd00::2"],
	},
	"certificate": {
		"address": "10.5.0.2:10250",
		"read": true,
		"error": "",
		"subject": [
			{"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
			{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
		],
		"subject_alt_names": [
			{"type": "dns", "value": "worker-1"},
			{"type": "ip", "value": "10.5.0.2"},
		],
		"serial": "1a2b",
		"issuer": "CN=kubernetes",
		"not_before": "2026-01-01T00:00:00Z",
		"not_after": "2027-01-01T00:00:00Z",
		"not_before_unix": 1767225600,
		"not_after_unix": 1798761600,
		"ext_key_usages": ["server auth"],
		"public_key": {"algorithm": "ECDSA", "curve": "P-256", "bits": 256},
		"issued_by_cluster_ca": true,
		"verify_error": "",
	},
	"now": "2026-06-01T00:00:00Z",
	"now_unix": 1780272000,
}

_audit(patch) := result if {
	result := kubelet_serving.audit with input as json.patch(_in_service, patch)
}

_audit_codes(patch) := [reason.code | some reason in _audit(patch).reasons]

_audit_set(path, value) := [{"op": "replace", "path": path, "value": value}]

# The audit run at another time: the RFC 3339 text for messages and the Unix seconds the rule
# computes with (the test parses the time, never the rule).
_audit_at(now) := [
	{"op": "replace", "path": "/now", "value": now},
	{"op": "replace", "path": "/now_unix", "value": time.parse_rfc3339_ns(now) / 1000000000},
]

test_current_certificate_is_current if {
	a := _audit([])
	a.status == "current"
	a.node == "worker-1"
	a.reasons == [{
		"code": "CertificateCurrent",
		"message": concat("", [
			`the kubelet serving certificate of machine "worker-1" (serial 1a2b) names only the node's identity, `,
			"was issued by the cluster's CA, expiring 2027-01-01T00:00:00Z",
		]),
	}]
}

test_no_certificate_gets_no_audit if {
	not _audit([{"op": "remove", "path": "/certificate"}])
}

test_ip_moved_after_issuance_is_drift_naming_the_ip if {
	a := _audit(_audit_set("/node/addresses", ["10.5.0.9"]))
	a.status == "drifted"
	a.reasons == [{
		"code": "CertificateNamesNotNode",
		"message": concat("", [
			`the kubelet serving certificate of machine "worker-1" (serial 1a2b) names what is no longer the node's: `,
			`IP address 10.5.0.2 is not one of the node's addresses ["10.5.0.9"]`,
		]),
	}]
}

test_dns_name_not_the_node_is_drift if {
	a := _audit(_audit_set("/certificate/subject_alt_names/0/value", "worker-9"))
	a.status == "drifted"
	_audit_codes(_audit_set("/certificate/subject_alt_names/0/value", "worker-9")) == ["CertificateNamesNotNode"]
	contains(a.reasons[0].message, `DNS name "worker-9" is neither the node's Nodename "worker-1"`)
}

test_renamed_node_is_drift if {
	a := _audit(_audit_set("/node/nodename", "worker-1.lab"))
	a.status == "drifted"
	some r in a.reasons
	contains(r.message, `its subject names node "worker-1", but Talos reports Nodename "worker-1.lab"`)
}

test_names_that_do_not_parse_are_drift if {
	a := _audit([
		{"op": "replace", "path": "/certificate/subject_alt_names", "value": []},
		{"op": "add", "path": "/certificate/san_error", "value": "not a SEQUENCE of names"},
	])
	a.status == "drifted"
	endswith(a.reasons[0].message, "its subjectAltName extension does not parse: not a SEQUENCE of names")
}

test_other_ca_is_drift if {
	a := _audit([
		{"op": "replace", "path": "/certificate/issued_by_cluster_ca", "value": false},
		{"op": "replace", "path": "/certificate/issuer", "value": "CN=worker-1@1700000000"},
		{"op": "replace", "path": "/certificate/verify_error", "value": "x509: certificate signed by unknown authority"},
	])
	a.status == "drifted"
	a.reasons == [{
		"code": "CertificateNotIssuedByClusterCA",
		"message": concat("", [
			`the kubelet serving certificate of machine "worker-1" (serial 1a2b, issuer "CN=worker-1@1700000000") `,
			"was not issued by the cluster's CA: x509: certificate signed by unknown authority",
		]),
	}]
}

test_expiring_within_the_warning_is_drift if {
	a := _audit(_audit_at("2026-12-15T00:00:00Z"))
	a.status == "drifted"
	a.reasons == [{
		"code": "CertificateExpiresSoon",
		"message": concat("", [
			`the kubelet serving certificate of machine "worker-1" (serial 1a2b) expires at `,
			"2027-01-01T00:00:00Z, within the 30 days warned of",
		]),
	}]
}

test_expiring_just_outside_the_warning_is_current if {
	_audit(_audit_at("2026-12-01T00:00:00Z")).status == "current"
}

test_expired_is_drift if {
	a := _audit(_audit_at("2027-02-01T00:00:00Z"))
	a.status == "drifted"
	contains(a.reasons[0].message, "expired at 2027-01-01T00:00:00Z")
}

test_unreadable_certificate_is_unknown_not_drift if {
	a := _audit(_audit_set("/certificate", {
		"address": "10.5.0.2:10250", "read": false,
		"error": "dial 10.5.0.2:10250: connection refused",
		"subject": [], "subject_alt_names": [],
	}))
	a.status == "unknown"
	a.reasons == [{
		"code": "CertificateUnreadable",
		"message": concat("", [
			`the kubelet serving certificate of machine "worker-1" could not be read at 10.5.0.2:10250: `,
			"dial 10.5.0.2:10250: connection refused",
		]),
	}]
}

test_unreadable_node_leaves_names_unjudged if {
	patch := [
		{"op": "replace", "path": "/node", "value": {"readable": false, "error": "connection refused", "addresses": []}},
		{"op": "replace", "path": "/certificate/subject_alt_names/1/value", "value": "10.9.9.9"},
	]
	a := _audit(patch)
	a.status == "unknown"
	_audit_codes(patch) == ["CertificateNodeUnreadable"]
	endswith(a.reasons[0].message, "so its certificate's names were not judged: connection refused")
}

test_unreadable_node_without_its_error_says_so if {
	a := _audit(_audit_set("/node", {"readable": false, "addresses": []}))
	endswith(a.reasons[0].message, ": it was not read")
}

test_unreadable_node_still_judges_the_issuer if {
	patch := [
		{"op": "replace", "path": "/node", "value": {"readable": false, "error": "timeout", "addresses": []}},
		{"op": "replace", "path": "/certificate/issued_by_cluster_ca", "value": false},
	]
	_audit(patch).status == "drifted"

	# What drifted first: the condition and the Event are named by the first reason.
	_audit_codes(patch) == ["CertificateNotIssuedByClusterCA", "CertificateNodeUnreadable"]
}

test_every_failing_check_is_reported_and_capped if {
	sans := [{"type": "ip", "value": sprintf("10.9.0.%d", [i])} | some i in numbers.range(1, 30)]
	patch := array.concat(
		[
			{"op": "replace", "path": "/certificate/subject_alt_names", "value": sans},
			{"op": "replace", "path": "/certificate/issued_by_cluster_ca", "value": false},
		],
		_audit_at("2026-12-20T00:00:00Z"),
	)
	a := _audit(patch)
	a.status == "drifted"
	count(a.reasons) == 13
	{code | some code in _audit_codes(patch)} == {
		"CertificateExpiresSoon", "CertificateNamesNotNode",
		"CertificateNotIssuedByClusterCA",
	}
}

# RFC 5280's "no expiry" (99991231235959Z) is beyond what OPA's time functions parse (2262);
# the rule computes with Unix seconds, so the certificate is current, neither expiring nor an error.
test_no_expiry_in_9999_is_current if {
	a := _audit([
		{"op": "replace", "path": "/certificate/not_after", "value": "9999-12-31T23:59:59Z"},
		{"op": "replace", "path": "/certificate/not_after_unix", "value": 253402300799},
	])
	a.status == "current"
	endswith(a.reasons[0].message, "expiring 9999-12-31T23:59:59Z")
}

# Without the Unix facts (a hand-made input, or one logged before they were facts) the rule
# fails closed: the certificate is taken as expired, never as current.
test_without_the_unix_times_the_certificate_counts_as_expired if {
	patch := [
		{"op": "remove", "path": "/certificate/not_after_unix"},
		{"op": "remove", "path": "/now_unix"},
	]
	_audit(patch).status == "drifted"
	_audit_codes(patch) == ["CertificateExpiresSoon"]
	contains(_audit(patch).reasons[0].message, "expired at 2027-01-01T00:00:00Z")
}

test_not_yet_valid_is_drift if {
	patch := array.concat(
		_audit_at("2025-12-01T00:00:00Z"),
		_audit_set("/certificate/not_before", "2026-01-01T00:00:00Z"),
	)
	a := _audit(patch)
	a.status == "drifted"
	a.reasons == [{
		"code": "CertificateNotYetValid",
		"message": concat("", [
			`the kubelet serving certificate of machine "worker-1" (serial 1a2b) is valid only from `,
			"2026-01-01T00:00:00Z, after the audit's time 2025-12-01T00:00:00Z",
		]),
	}]
}

# The node's client certificate, served in the place of its serving certificate: the same subject,
# the cluster's CA, client auth only and no names. Approval would never have let it be served.
test_client_certificate_is_not_current if {
	patch := [
		{"op": "replace", "path": "/certificate/ext_key_usages", "value": ["client auth"]},
		{"op": "replace", "path": "/certificate/subject_alt_names", "value": []},
	]
	a := _audit(patch)
	a.status == "drifted"
	a.reasons == [
		{
			"code": "CertificateNamesNotNode",
			"message": concat("", [
				`the kubelet serving certificate of machine "worker-1" (serial 1a2b) names what is no longer the node's: `,
				"it has no DNS name or IP address, and a serving certificate must name the node by them",
			]),
		},
		{
			"code": "CertificateNotForServing",
			"message": concat("", [
				`the kubelet serving certificate of machine "worker-1" (serial 1a2b) is not for serving: `,
				`its extended key usages ["client auth"] do not include "server auth"`,
			]),
		},
	]
}

test_without_extended_key_usages_is_not_for_serving if {
	_audit_codes(_audit_set("/certificate/ext_key_usages", [])) == ["CertificateNotForServing"]
	_audit_codes([{"op": "remove", "path": "/certificate/ext_key_usages"}]) == ["CertificateNotForServing"]
	_audit_codes(_audit_set("/certificate/ext_key_usages", ["any"])) == ["CertificateNotForServing"]
}

test_server_auth_among_others_is_for_serving if {
	_audit(_audit_set("/certificate/ext_key_usages", ["client auth", "server auth"])).status == "current"
}

# A name of a type approval forbids is drift with approval's own message, even when the node
# could not be read (the type needs only the certificate).
test_forbidden_name_types_are_drift if {
	sans := [
		{"type": "dns", "value": "worker-1"},
		{"type": "uri", "value": "spiffe://cluster/ns/kube-system/sa/admin"},
		{"type": "email", "value": "root@worker-1"},
		{"type": "other", "value": "1.3.6.1.4.1.311.20.2.3"},
	]
	a := _audit(_audit_set("/certificate/subject_alt_names", sans))
	a.status == "drifted"
	_audit_codes(_audit_set("/certificate/subject_alt_names", sans)) == [
		"CertificateNamesNotNode", "CertificateNamesNotNode",
		"CertificateNamesNotNode",
	]
	some r in a.reasons
	endswith(r.message, concat("", [
		`names what is no longer the node's: subject alternative name "spiffe://cluster/ns/kube-system/sa/admin" `,
		"of type uri is not allowed; only DNS names and IP addresses are",
	]))

	unread := array.concat(
		_audit_set("/certificate/subject_alt_names", sans),
		_audit_set("/node", {"readable": false, "error": "timeout", "addresses": []}),
	)
	_audit(unread).status == "drifted"
	count([c | some c in _audit_codes(unread); c == "CertificateNamesNotNode"]) == 3
}

# Only a URI: no name of an allowed type, and the URI forbidden; both said.
test_only_a_forbidden_name_is_no_node_name_too if {
	a := _audit(_audit_set("/certificate/subject_alt_names", [{"type": "uri", "value": "https://evil"}]))
	a.status == "drifted"
	count(a.reasons) == 2
	some r in a.reasons
	endswith(r.message, "it has no DNS name or IP address, and a serving certificate must name the node by them")
}

# A certificate whose subject is not exactly CN=system:node:<name>, O=system:nodes, as approval
# requires of a request: another organization, a missing one, or an extra attribute.
test_a_subject_approval_would_refuse_is_not_current if {
	subjects := [
		[
			{"oid": "2.5.4.10", "name": "O", "value": "system:masters"},
			{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
		],
		[{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"}],
		[
			{"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
			{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
			{"oid": "2.5.4.11", "name": "OU", "value": "x"},
		],
	]
	every subject in subjects {
		a := _audit(_audit_set("/certificate/subject", subject))
		a.status == "drifted"
		[r.code | some r in a.reasons] == ["CertificateNamesNotNode"]
		contains(a.reasons[0].message, "not exactly CN=system:node:<name>, O=system:nodes")
	}
}

test_the_subject_is_judged_without_the_node if {
	patch := array.concat(
		_audit_set("/certificate/subject", [{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"}]),
		_audit_set("/node", {"readable": false, "error": "connection refused"}),
	)
	"CertificateNamesNotNode" in _audit_codes(patch)
	_audit(patch).status == "drifted"
}
