package ichor.kubelet_client_test

import data.ichor.kubelet_client

# An input without a request (or with one Go would never build) is not approved: each
# reason still has its message, so no check is skipped for want of one.
test_input_without_a_request_is_not_approved if {
	d := _decide([{"op": "remove", "path": "/csr/request"}])
	d.action == "pending"
	"MalformedRequest" in {r.code | some r in d.reasons}
	some r in d.reasons
	r.code == "MalformedRequest"
	endswith(r.message, "does not parse as a certificate request: the input holds no parse error (no request was given)")
}

test_empty_request_is_not_approved if {
	d := _decide(_set("/csr/request", {}))
	d.action == "pending"
	"MalformedRequest" in {r.code | some r in d.reasons}
}

test_unverified_signature_without_its_error_is_not_approved if {
	d := _decide([
		{"op": "replace", "path": "/csr/request/signature_valid", "value": false},
		{"op": "remove", "path": "/csr/request/signature_error"},
	])
	d.action == "pending"
	[r.code | some r in d.reasons] == ["InvalidSignature"]
	endswith(d.reasons[0].message, "does not verify with its public key: the input holds no signature error")
}

# A weak key is never approved, whatever the subject and the permission say; the request
# is recognized as kube-controller-manager recognizes it, so that its kind is said and the
# operator told why it waits (review 238 F1).
test_weak_keys_are_recognized_and_left_pending if {
	every key in [
		{"algorithm": "RSA", "bits": 1024},
		{"algorithm": "ECDSA", "curve": "P-224", "bits": 224},
		{"algorithm": "DSA", "bits": 2048},
	] {
		d := _decide(_set("/csr/request/public_key", key))
		d.action == "pending"
		d.kind == "selfnodeclient"
		[r.code | some r in d.reasons] == ["PublicKeyNotAllowed"]
		contains(d.reasons[0].message, "is not allowed; allowed are ECDSA on curve P-256 or P-384")
	}
}

# Nor is the key of an unrecognized request: it is said beside why it is not recognized.
test_a_weak_key_is_said_beside_why_a_request_is_not_recognized if {
	d := _decide(array.concat(
		_set("/csr/request/public_key", {"algorithm": "RSA", "bits": 1024}),
		_set("/csr/usages", ["server auth"]),
	))
	d.action == "pending"
	d.kind == ""
	{r.code | some r in d.reasons} == {"PublicKeyNotAllowed", "UsagesNotAllowed"}
}

test_sound_keys_are_recognized if {
	every key in [
		{"algorithm": "RSA", "bits": 2048},
		{"algorithm": "ECDSA", "curve": "P-384", "bits": 384},
		{"algorithm": "Ed25519", "bits": 256},
	] {
		_decide(_set("/csr/request/public_key", key)).action == "approve"
	}
}

# What kube-controller-manager signs is the first PEM block, and only a CERTIFICATE
# REQUEST: its approver recognizes nothing in a NEW CERTIFICATE REQUEST (sarapprove's
# own cases), and neither does this rule.
test_a_new_certificate_request_block_is_not_recognized if {
	d := _decide(_set("/csr/request/pem/types", ["NEW CERTIFICATE REQUEST"]))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["MalformedRequest"]
	d.reasons[0].message == concat("", [
		"not recognized: spec.request is a PEM block of type \"NEW CERTIFICATE REQUEST\"; ",
		"kube-controller-manager signs only a CERTIFICATE REQUEST block",
	])
}

test_pem_headers_change_nothing if {
	_decide(_set("/csr/request/pem/headers", 2)).action == "approve"
}

test_a_second_pem_block_is_not_recognized if {
	d := _decide(_set("/csr/request/pem", {"blocks": 2, "types": ["CERTIFICATE REQUEST", "CERTIFICATE"], "headers": 0}))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["MalformedRequest"]
	startswith(d.reasons[0].message, "not recognized: spec.request holds 2 PEM blocks")
}

# A decision logged before Go described the PEM replays as it was decided.
test_an_input_without_pem_facts_is_judged_on_the_rest if {
	_decide([{"op": "remove", "path": "/csr/request/pem"}]).action == "approve"
}

# A missing or ill-typed fact makes the check that needs it fail, with its message: a check
# over an undefined fact would report nothing, and a request with nothing reported is
# recognized, or approved (review 210).
test_a_missing_fact_of_the_request_is_reported if {
	every path, code in {"/csr/usages": "UsagesNotAllowed", "/csr/request/public_key": "PublicKeyNotAllowed"} {
		d := _decide([{"op": "remove", "path": path}])
		d.action == "pending"
		[r.code | some r in d.reasons] == [code]
		d.reasons[0].message != ""
	}
}

test_a_fact_that_is_not_the_boolean_true_is_not_true if {
	every value in [null, "true", 1, {}] {
		"MalformedRequest" in {r.code | some r in _decide(_set("/csr/request/parsed", value)).reasons}
		_codes(_set("/csr/request/signature_valid", value)) == ["InvalidSignature"]
	}
}

# Without a requester nobody renews their own certificate, and the reason still says who
# may not create what.
test_a_request_without_a_requester_is_not_a_self_request if {
	d := _decide(array.concat([{"op": "remove", "path": "/csr/username"}], _allow(true, false)))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["NodeClientNotAuthorized"]
	contains(d.reasons[0].message, `but "" may not create`)
}

test_names_not_written_as_names_are_names if {
	every sans in [["worker-1"], "worker-1", {"type": "dns"}] {
		_codes(_set("/csr/request/subject_alt_names", sans)) == ["SANPresent"]
	}
}

test_null_names_are_none if {
	_decide(_set("/csr/request/subject_alt_names", null)).action == "approve"
}

test_a_machine_that_is_not_an_object_is_no_machine if {
	every machine in [null, "worker-1"] {
		codes := {r.code |
			some r in _decide([{"op": "add", "path": "/machine", "value": machine}]).reasons
		} with kubelet_client.config as _config_with({"require_managed_machine": true})
		codes == {"MachineUnknown"}
	}
}

# The guard against a privileged subject reads every attribute, named or not, and does not
# take a value that is not text for a harmless one (review 212).
test_a_privileged_attribute_without_a_name_or_as_a_list_is_not_approved if {
	every attr in [
		{"oid": "2.5.4.11", "value": "system:masters"},
		{"oid": "2.5.4.11", "name": "OU", "value": ["system:masters"]},
		"system:masters",
		{"name": "O", "value": "system:admins"},
		{"oid": ["2.5.4.10"], "name": "O", "value": "system:admins"},
	] {
		d := _decide([{"op": "add", "path": "/csr/request/subject/-", "value": attr}])
		d.action == "pending"
		"PrivilegedSubject" in {r.code | some r in d.reasons}
	}
}

test_a_subject_or_usages_of_the_wrong_shape_are_not_recognized if {
	_decide(_set("/csr/request/subject", {
		"a": {"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
		"b": {"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
	})).action == "pending"
	_codes(_set("/csr/usages", {"a": "client auth", "b": "digital signature"})) == ["UsagesNotAllowed"]
}
