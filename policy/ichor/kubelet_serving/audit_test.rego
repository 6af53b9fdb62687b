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
		"public_key": {"algorithm": "ECDSA", "curve": "P-256", "bits": 256},
		"issued_by_cluster_ca": true,
		"verify_error": "",
	},
	"now": "2026-06-01T00:00:00Z",
}

_audit(patch) := result if {
	result := kubelet_serving.audit with input as json.patch(_in_service, patch)
}

_audit_codes(patch) := [reason.code | some reason in _audit(patch).reasons]

_audit_set(path, value) := [{"op": "replace", "path": path, "value": value}]

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
	a := _audit(_audit_set("/now", "2026-12-15T00:00:00Z"))
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
	_audit(_audit_set("/now", "2026-12-01T00:00:00Z")).status == "current"
}

test_expired_is_drift if {
	a := _audit(_audit_set("/now", "2027-02-01T00:00:00Z"))
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
	_audit_codes(patch) == ["CertificateNodeUnreadable", "CertificateNotIssuedByClusterCA"]
}

test_every_failing_check_is_reported_and_capped if {
	sans := [{"type": "ip", "value": sprintf("10.9.0.%d", [i])} | some i in numbers.range(1, 30)]
	patch := [
		{"op": "replace", "path": "/certificate/subject_alt_names", "value": sans},
		{"op": "replace", "path": "/certificate/issued_by_cluster_ca", "value": false},
		{"op": "replace", "path": "/now", "value": "2026-12-20T00:00:00Z"},
	]
	a := _audit(patch)
	a.status == "drifted"
	count(a.reasons) == 13
	{code | some code in _audit_codes(patch)} == {
		"CertificateExpiresSoon", "CertificateNamesNotNode",
		"CertificateNotIssuedByClusterCA",
	}
}
