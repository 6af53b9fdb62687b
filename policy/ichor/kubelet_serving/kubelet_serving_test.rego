package ichor.kubelet_serving_test

import data.ichor.kubelet_serving

# A request that every check accepts: worker-1 asking for its Nodename and two of its addresses.
_good := {
	"csr": {
		"name": "csr-good",
		"signer_name": "kubernetes.io/kubelet-serving",
		"username": "system:node:worker-1",
		"uid": "2f1d6d1c",
		"groups": ["system:nodes", "system:authenticated"],
		"extra": {},
		"usages": ["digital signature", "server auth"],
		"request": {
			"pem": {"blocks": 1, "types": ["CERTIFICATE REQUEST"], "headers": 0},
			"parsed": true,
			"parse_error": "",
			"signature_valid": true,
			"signature_error": "",
			"signature_algorithm": "ECDSA-SHA256",
			"subject": [
				{"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
				{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
			],
			"subject_alt_names": [
				{"type": "dns", "value": "worker-1"},
				{"type": "ip", "value": "10.5.0.2"},
			],
			"extensions": [{"oid": "2.5.29.17", "critical": false}],
			"public_key": {"algorithm": "ECDSA", "curve": "P-256", "bits": 256},
		},
	},
	"machine": {"name": "worker-1", "namespace": "default", "cluster": "demo"},
	"machine_candidates": 1,
	"node": {
		"readable": true,
		"error": "",
		"nodename": "worker-1",
		"hostname": "worker-1.lab",
		"addresses": ["10.5.0.2", "10.6.0.2", "fd00::2"],
	},
}

_decide(patch) := decision if {
	decision := kubelet_serving.decision with input as json.patch(_good, patch)
}

_codes(patch) := [reason.code | some reason in _decide(patch).reasons]

_set(path, value) := [{"op": "replace", "path": path, "value": value}]

_sans(sans) := _set("/csr/request/subject_alt_names", sans)

_add_attribute(oid, name, value) := [{
	"op": "add",
	"path": "/csr/request/subject/-",
	"value": {"oid": oid, "name": name, "value": value},
}]

test_good_request_is_approved_naming_the_node if {
	d := _decide([])
	d.action == "approve"
	d.node == "worker-1"
	d.reasons == [{
		"code": "IchorKubeletServing",
		"message": concat("", [
			`kubelet serving certificate for node "worker-1" (machine "worker-1") `,
			"matches its identity read from the Talos API",
		]),
	}]
}

test_rsa_key_is_approved if {
	_decide(_set("/csr/request/public_key", {"algorithm": "RSA", "bits": 2048})).action == "approve"
}

test_ed25519_key_is_approved if {
	_decide(_set("/csr/request/public_key", {"algorithm": "Ed25519", "bits": 256})).action == "approve"
}

test_usages_with_key_encipherment_are_approved if {
	_decide(_set("/csr/usages", ["key encipherment", "server auth", "digital signature"])).action == "approve"
}

test_usages_without_key_encipherment_are_approved if {
	_decide(_set("/csr/usages", ["server auth", "digital signature"])).action == "approve"
}

test_ipv6_address_is_approved if {
	_decide(_sans([{"type": "ip", "value": "fd00::2"}])).action == "approve"
}

test_several_addresses_and_both_names_are_approved if {
	_decide(_sans([
		{"type": "dns", "value": "worker-1"},
		{"type": "dns", "value": "worker-1.lab"},
		{"type": "ip", "value": "10.5.0.2"},
		{"type": "ip", "value": "10.6.0.2"},
		{"type": "ip", "value": "fd00::2"},
	])).action == "approve"
}

test_expiration_at_the_cap_is_approved if {
	_decide([{"op": "add", "path": "/csr/expiration_seconds", "value": 31536000}]).action == "approve"
}

test_other_signer_gets_no_decision if {
	not _decide(_set("/csr/signer_name", "kubernetes.io/kube-apiserver-client-kubelet"))
}

test_unparseable_request_is_denied if {
	d := _decide([
		{"op": "replace", "path": "/csr/request", "value": {
			"parsed": false, "parse_error": "no PEM block found",
			"signature_valid": false, "signature_error": "", "subject": [],
			"subject_alt_names": [], "extensions": [],
		}},
		{"op": "remove", "path": "/machine"},
	])
	d.action == "deny"
	d.reasons == [{
		"code": "MalformedRequest",
		"message": "spec.request does not parse as a certificate request: no PEM block found",
	}]
	d.node == ""
}

# An input without a request (or with one Go would never build) is not approved: each
# reason still has its message, so no check is skipped for want of one.
test_input_without_a_request_is_denied if {
	d := _decide([{"op": "remove", "path": "/csr/request"}])
	d.action == "deny"
	[r.code | some r in d.reasons] == ["MalformedRequest"]
	endswith(d.reasons[0].message, ": the input holds no parse error (no request was given)")
}

test_unverified_signature_without_its_error_is_denied if {
	d := _decide([
		{"op": "replace", "path": "/csr/request/signature_valid", "value": false},
		{"op": "remove", "path": "/csr/request/signature_error"},
	])
	d.action == "deny"
	[r.code | some r in d.reasons] == ["InvalidSignature"]
	endswith(d.reasons[0].message, "does not verify with its public key: the input holds no signature error")
}

# ADR 0125: a request for a node name no managed machine has is never denied, whatever
# else is wrong with it; it may be another approver's.
test_invalid_signature_is_pending_for_unknown_machine if {
	d := _decide([
		{"op": "replace", "path": "/csr/request/signature_valid", "value": false},
		{"op": "replace", "path": "/csr/request/signature_error", "value": "crypto/ecdsa: verification error"},
		{"op": "remove", "path": "/machine"},
	])
	d.action == "pending"
	[r.code | some r in d.reasons] == ["MachineUnknown"]
}

test_a_flood_for_an_unknown_machine_is_pending if {
	d := _decide([
		{"op": "add", "path": "/requests", "value": {"from_requester": 9, "newer_from_requester": 8}},
		{"op": "remove", "path": "/machine"},
	])
	d.action == "pending"
	[r.code | some r in d.reasons] == ["MachineUnknown"]
}

test_a_second_pem_block_is_pending_for_unknown_machine if {
	d := _decide([
		{"op": "replace", "path": "/csr/request/pem/blocks", "value": 2},
		{"op": "remove", "path": "/machine"},
	])
	d.action == "pending"
	[r.code | some r in d.reasons] == ["MachineUnknown"]
}

test_no_rejection_for_unknown_machine if {
	not kubelet_serving.rejection with input as json.patch(_good, [
		{"op": "replace", "path": "/csr/request/signature_valid", "value": false},
		{"op": "add", "path": "/requests", "value": {"from_requester": 9, "newer_from_requester": 8}},
		{"op": "remove", "path": "/machine"},
	])
}

test_invalid_signature_is_denied_for_known_machine_even_when_the_node_is_unreadable if {
	d := _decide([
		{"op": "replace", "path": "/csr/request/signature_valid", "value": false},
		{"op": "replace", "path": "/csr/request/signature_error", "value": "crypto/ecdsa: verification error"},
		{"op": "replace", "path": "/node", "value": {"readable": false, "error": "timeout"}},
	])
	d.action == "deny"
	[r.code | some r in d.reasons] == ["InvalidSignature"]
}

test_unknown_machine_is_pending if {
	d := _decide([{"op": "remove", "path": "/machine"}])
	d.action == "pending"
	d.reasons == [{
		"code": "MachineUnknown",
		"message": `no managed machine has node name "worker-1"; left pending for another approver or a person`,
	}]
}

test_unknown_machine_is_pending_even_when_the_request_is_wrong if {
	d := _decide([
		{"op": "remove", "path": "/machine"},
		{"op": "replace", "path": "/csr/usages", "value": ["client auth"]},
	])
	d.action == "pending"
}

test_ambiguous_node_name_is_pending if {
	d := _decide([{"op": "add", "path": "/machine_candidates", "value": 2}])
	d.action == "pending"
	d.reasons == [{
		"code": "MachineAmbiguous",
		"message": `2 managed machines answer to node name "worker-1"; left pending until only one does`,
	}]
}

test_unreadable_node_is_pending_with_the_error if {
	d := _decide(_set("/node", {"readable": false, "error": "dial tcp 10.5.0.2:50000: connection refused"}))
	d.action == "pending"
	d.reasons == [{
		"code": "NodeUnreadable",
		"message": concat(": ", [
			`the identity of node "worker-1" could not be read from the Talos API`,
			"dial tcp 10.5.0.2:50000: connection refused",
		]),
	}]
}

test_node_not_read_is_pending if {
	d := _decide([{"op": "remove", "path": "/node"}])
	d.action == "pending"
	d.reasons[0].message == `the identity of node "worker-1" could not be read from the Talos API: it was not read`
}

test_nodename_disagreeing_with_talos_is_pending if {
	d := _decide(_set("/node/nodename", "worker-2"))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["NodenameMismatch"]
}

test_wrong_username_is_denied if {
	_codes(_set("/csr/username", "system:node:worker-2")) == ["UsernameMismatch"]
}

test_missing_nodes_group_is_denied if {
	_codes(_set("/csr/groups", ["system:authenticated"])) == ["GroupMissing"]
}

test_extra_organization_is_denied if {
	_codes(_add_attribute("2.5.4.10", "O", "system:masters")) == ["SubjectMismatch"]
}

test_organizational_unit_is_denied if {
	d := _decide(_add_attribute("2.5.4.11", "OU", "ops"))
	d.reasons == [{
		"code": "SubjectMismatch",
		"message": concat(", ", [
			"the subject is O=system:nodes, CN=system:node:worker-1, OU=ops",
			"not exactly CN=system:node:<name>, O=system:nodes",
		]),
	}]
}

test_unnamed_attribute_is_denied_and_shown_by_oid if {
	d := _decide(_add_attribute("1.2.3.4", "", "x"))
	startswith(d.reasons[0].message, "the subject is O=system:nodes, CN=system:node:worker-1, 1.2.3.4=x, not exactly")
}

test_second_common_name_is_pending_since_no_node_is_named if {
	# Two common names name no node: the controller finds no machine for it.
	d := _decide([
		_add_attribute("2.5.4.3", "CN", "system:node:worker-2")[0],
		{"op": "remove", "path": "/machine"},
	])
	d.action == "pending"
	d.node == ""
}

test_second_common_name_is_denied_for_a_known_machine if {
	# Two common names name no node, so Talos's Nodename cannot disagree with
	# one: the subject is judged, and denied.
	codes := _codes([
		{"op": "replace", "path": "/csr/request/subject/0/value", "value": "system:node:worker-2"},
		{"op": "replace", "path": "/csr/request/subject/0/oid", "value": "2.5.4.3"},
	])
	"SubjectMismatch" in codes
	not "NodenameMismatch" in codes
}

test_wrong_organization_is_denied if {
	_codes(_set("/csr/request/subject/0/value", "system:bootstrappers")) == ["SubjectMismatch"]
}

test_common_name_without_prefix_is_denied if {
	d := _decide([{"op": "replace", "path": "/csr/request/subject/1/value", "value": "worker-1"}])
	d.action == "deny"
	codes := [r.code | some r in d.reasons]
	"SubjectMismatch" in codes
	"UsernameMismatch" in codes
}

test_common_name_that_is_only_the_prefix_names_no_node if {
	# CN=system:node: names no node (as for Go's csrinput.NodeName), even with the matching
	# username: the decision names no node, Talos's Nodename cannot disagree with one, and
	# the subject is denied.
	d := _decide(array.concat(
		_set("/csr/request/subject/1/value", "system:node:"),
		_set("/csr/username", "system:node:"),
	))
	d.action == "deny"
	d.node == ""
	d.reasons == [{
		"code": "SubjectMismatch",
		"message": concat("", [
			"the subject is O=system:nodes, CN=system:node:, ",
			"not exactly CN=system:node:<name>, O=system:nodes",
		]),
	}]
}

test_input_without_a_request_still_names_no_node if {
	# Go always sends input.csr.request; without one the decision still has a string for node.
	d := _decide([{"op": "remove", "path": "/csr/request"}])
	d.action == "deny"
	d.node == ""
}

test_email_name_is_denied if {
	sans := [{"type": "dns", "value": "worker-1"}, {"type": "email", "value": "root@worker-1"}]
	_codes(_sans(sans)) == ["SANTypeForbidden"]
}

test_uri_name_is_denied if {
	d := _decide(_sans([{"type": "uri", "value": "spiffe://cluster/worker-1"}]))
	d.reasons == [{
		"code": "SANTypeForbidden",
		"message": concat("", [
			`subject alternative name "spiffe://cluster/worker-1" of type uri is not allowed; `,
			"only DNS names and IP addresses are",
		]),
	}]
}

test_other_name_type_is_denied if {
	sans := [{"type": "ip", "value": "10.5.0.2"}, {"type": "other_name", "value": "a003060129"}]
	_codes(_sans(sans)) == ["SANTypeForbidden"]
}

test_no_name_is_denied if {
	_codes(_sans([])) == ["SANMissing"]
}

test_foreign_dns_name_is_denied if {
	d := _decide(_sans([{"type": "dns", "value": "kubernetes.default"}]))
	d.reasons == [{
		"code": "DNSNameNotNode",
		"message": concat("", [
			`DNS name "kubernetes.default" is neither the node's Nodename "worker-1" `,
			`nor its hostname "worker-1.lab"`,
		]),
	}]
}

test_empty_dns_name_never_matches_an_empty_hostname if {
	codes := _codes([
		{"op": "replace", "path": "/csr/request/subject_alt_names", "value": [{"type": "dns", "value": ""}]},
		{"op": "replace", "path": "/node/hostname", "value": ""},
	])
	codes == ["DNSNameNotNode"]
}

test_another_nodes_ip_is_denied if {
	d := _decide(_sans([{"type": "dns", "value": "worker-1"}, {"type": "ip", "value": "10.5.0.3"}]))
	d.action == "deny"
	d.reasons == [{
		"code": "IPNotNode",
		"message": `IP address 10.5.0.3 is not one of the node's addresses ["10.5.0.2", "10.6.0.2", "fd00::2"]`,
	}]
}

test_foreign_ipv6_address_is_denied if {
	_codes(_sans([{"type": "ip", "value": "fd00::3"}])) == ["IPNotNode"]
}

test_client_auth_usage_is_denied if {
	_codes(_set("/csr/usages", ["digital signature", "server auth", "client auth"])) == ["UsagesNotAllowed"]
}

test_missing_digital_signature_is_denied if {
	d := _decide(_set("/csr/usages", ["server auth"]))
	d.reasons == [{
		"code": "UsagesNotAllowed",
		"message": concat("", [
			`usages ["server auth"] are not one of the allowed sets `,
			`[["digital signature", "key encipherment", "server auth"], ["digital signature", "server auth"]]`,
		]),
	}]
}

test_repeated_usage_is_denied if {
	# An allowed set with one usage repeated: as a set it is allowed, so
	# only the count refuses it.
	_codes(_set("/csr/usages", ["digital signature", "server auth", "server auth"])) == ["UsagesNotAllowed"]
}

test_key_encipherment_alone_with_server_auth_is_denied if {
	_codes(_set("/csr/usages", ["key encipherment", "server auth"])) == ["UsagesNotAllowed"]
}

test_extra_extension_is_denied if {
	d := _decide([{"op": "add", "path": "/csr/request/extensions/-", "value": {"oid": "2.5.29.19", "critical": true}}])
	d.reasons == [{
		"code": "ExtensionForbidden",
		"message": "requested extension 2.5.29.19 is not allowed; only subjectAltName is",
	}]
}

test_expiration_above_the_cap_is_denied if {
	d := _decide([{"op": "add", "path": "/csr/expiration_seconds", "value": 31536001}])
	d.reasons == [{
		"code": "ExpirationTooLong",
		"message": "expirationSeconds 31536001 exceeds the cap of 31536000",
	}]
}

test_every_failing_check_is_reported_sorted if {
	_codes([
		{"op": "replace", "path": "/csr/usages", "value": ["client auth"]},
		{"op": "replace", "path": "/csr/groups", "value": []},
		{"op": "add", "path": "/csr/request/subject_alt_names/-", "value": {"type": "ip", "value": "192.0.2.1"}},
	]) == ["GroupMissing", "IPNotNode", "UsagesNotAllowed"]
}

test_thousands_of_foreign_names_give_a_bounded_decision if {
	# A node asking for ten thousand names it does not have: ten reasons of each code,
	# and one that counts the rest, so the condition, the Event and the log stay small.
	ips := [{"type": "ip", "value": sprintf("10.9.%d.%d", [floor(n / 250), n % 250])} | some n in numbers.range(0, 9999)]
	d := _decide(_sans(array.concat([{"type": "dns", "value": "evil.example"}], ips)))
	d.action == "deny"
	count(d.reasons) == 12
	ip_codes := [code | some _ in numbers.range(1, 11); code := "IPNotNode"]
	[r.code | some r in d.reasons] == array.concat(["DNSNameNotNode"], ip_codes)
	d.reasons[11].message == "9990 more IPNotNode reasons are not listed (10000 in all)"
}

# A weak key is denied, whatever the names say: no identity makes it sound.
test_weak_keys_are_denied if {
	every key in [
		{"algorithm": "RSA", "bits": 1024},
		{"algorithm": "ECDSA", "curve": "P-224", "bits": 224},
		{"algorithm": "RSA", "bits": 16384},
	] {
		d := _decide(_set("/csr/request/public_key", key))
		d.action == "deny"
		[r.code | some r in d.reasons] == ["PublicKeyNotAllowed"]
		contains(d.reasons[0].message, "is not allowed; allowed are ECDSA on curve P-256 or P-384")
	}
}

test_a_weak_key_message_names_the_key if {
	d := _decide(_set("/csr/request/public_key", {"algorithm": "RSA", "bits": 1024}))
	startswith(d.reasons[0].message, `public key "RSA 1024-bit" is not allowed`)
}

# The signer signs the first PEM block, and only a CERTIFICATE REQUEST: anything else is
# denied at once, whatever the node's identity.
test_a_new_certificate_request_block_is_malformed if {
	d := _decide(_set("/csr/request/pem/types", ["NEW CERTIFICATE REQUEST"]))
	d.action == "deny"
	[r.code | some r in d.reasons] == ["MalformedRequest"]
	startswith(d.reasons[0].message, "spec.request is a PEM block of type \"NEW CERTIFICATE REQUEST\"")
}

test_pem_headers_do_not_change_the_request if {
	_decide(_set("/csr/request/pem/headers", 1)).action == "approve"
}

test_a_second_pem_block_is_malformed if {
	d := _decide(_set("/csr/request/pem/blocks", 2))
	d.action == "deny"
	[r.code | some r in d.reasons] == ["MalformedRequest"]
}
