package ichor.kubelet_serving_test

# A hand-made input (opa eval, a test case, a log from an older build) may lack a fact Go
# always gives. Each missing or ill-typed fact makes the check that needs it refuse, with
# its message: a check over an undefined fact would report nothing, and a request with
# nothing reported is approved (review 210).

_remove(path) := [{"op": "remove", "path": path}]

test_a_missing_fact_of_the_request_is_refused_by_its_check if {
	every path, code in {
		"/csr/username": "UsernameMismatch",
		"/csr/groups": "GroupMissing",
		"/csr/usages": "UsagesNotAllowed",
		"/csr/request/subject_alt_names": "SANMissing",
		"/csr/request/public_key": "PublicKeyNotAllowed",
	} {
		d := _decide(_remove(path))
		d.action == "deny"
		[r.code | some r in d.reasons] == [code]
		d.reasons[0].message != ""
	}
}

test_a_null_fact_of_the_request_is_refused_by_its_check if {
	every path, code in {
		"/csr/username": "UsernameMismatch",
		"/csr/groups": "GroupMissing",
		"/csr/usages": "UsagesNotAllowed",
		"/csr/request/subject_alt_names": "SANMissing",
		"/csr/request/public_key": "PublicKeyNotAllowed",
	} {
		[r.code | some r in _decide(_set(path, null)).reasons] == [code]
	}
}

# Only the boolean true is true: null, a string or a number is not a parsed request, a
# verified signature or a read node.
test_a_fact_that_is_not_the_boolean_true_is_not_true if {
	every value in [null, "true", 1, {}] {
		"MalformedRequest" in _codes(_set("/csr/request/parsed", value))
		_codes(_set("/csr/request/signature_valid", value)) == ["InvalidSignature"]
		d := _decide(_set("/node/readable", value))
		d.action == "pending"
		[r.code | some r in d.reasons] == ["NodeUnreadable"]
	}
}

# A name that is not a {"type", "value"} object is a name of no allowed type, and a name
# without a value is no name of the node's.
test_names_not_written_as_names_are_refused if {
	every sans in [["worker-1"], [{"value": "worker-1"}], "worker-1", [7]] {
		d := _decide(_sans(sans))
		d.action == "deny"
		"SANTypeForbidden" in {r.code | some r in d.reasons}
	}
	every type, code in {"dns": "DNSNameNotNode", "ip": "IPNotNode"} {
		_codes(_sans([{"type": type}])) == [code]
		_codes(_sans([{"type": "dns", "value": "worker-1"}, {"type": type, "valu": "evil.example.com"}])) == [code]
	}
}

# Names that are not a list are read as a list of them: a lone name object is that name.
test_a_lone_name_is_read_as_a_list_of_it if {
	_decide(_sans({"type": "dns", "value": "worker-1"})).action == "approve"
	_codes(_sans({"type": "dns", "value": "evil.example.com"})) == ["DNSNameNotNode"]
}

# Extensions, groups, usages and the subject are read the same way, and what is not what
# Go gives is refused: an extension without an OID, groups or usages that are not a list
# (an object's values are not its items), a subject that is not a list of attributes, a
# lifetime that is not a number, a PEM type that is not text.
test_extensions_of_the_wrong_shape_are_refused if {
	every extensions in [["2.5.29.19"], [{"critical": true}], {"oid": "1.2.3.4"}, "x"] {
		_codes(_set("/csr/request/extensions", extensions)) == ["ExtensionForbidden"]
	}
}

test_groups_or_usages_that_are_not_lists_are_refused if {
	every path, code in {"/csr/groups": "GroupMissing", "/csr/usages": "UsagesNotAllowed"} {
		_codes(_set(path, {"a": "system:nodes", "b": "digital signature", "c": "server auth"})) == [code]
	}
}

test_groups_as_a_string_are_none if {
	_codes(_set("/csr/groups", "system:nodes")) == ["GroupMissing"]
}

test_a_subject_that_is_not_a_list_is_refused if {
	"SubjectMismatch" in _codes(_set("/csr/request/subject", {
		"a": {"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
		"b": {"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
	}))
}

test_a_lifetime_or_pem_type_of_the_wrong_type_is_refused if {
	every seconds in [true, false, "3600", {}] {
		_codes([{"op": "add", "path": "/csr/expiration_seconds", "value": seconds}]) == ["ExpirationTooLong"]
	}
	every types in ["NEW CERTIFICATE REQUEST", [5]] {
		_codes(_set("/csr/request/pem/types", types)) == ["MalformedRequest"]
	}
}

test_a_name_that_is_not_text_is_read_as_text if {
	_codes(_sans([{"type": "dns", "value": 7}])) == ["DNSNameNotNode"]
}

# A node read without one of its facts has none of it: its Nodename disagrees, and its
# names and addresses match nothing.
test_a_node_read_without_a_fact_has_none_of_it if {
	d := _decide(_remove("/node/nodename"))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["NodenameMismatch"]
	contains(d.reasons[0].message, `but Talos reports Nodename ""`)
}

test_a_node_read_without_a_hostname_has_only_its_nodename if {
	without := _remove("/node/hostname")
	_codes(array.concat(without, _sans([{"type": "dns", "value": "worker-1.lab"}]))) == ["DNSNameNotNode"]
	_decide(array.concat(without, _sans([{"type": "dns", "value": "worker-1"}]))).action == "approve"
}

test_a_node_read_without_addresses_has_none if {
	every patch in [_remove("/node/addresses"), _set("/node/addresses", null)] {
		_codes(patch) == ["IPNotNode"]
	}
}

# What is not a machine object is no machine: the request is left pending as one no managed
# machine has, never left without a decision.
test_a_machine_that_is_not_an_object_is_no_machine if {
	every machine in [null, "worker-1", 7] {
		d := _decide(_set("/machine", machine))
		d.action == "pending"
		[r.code | some r in d.reasons] == ["MachineUnknown"]
	}
}

# A machine without a name (check-csr's, given no --machine) is still decided.
test_a_machine_without_a_name_is_decided if {
	d := _decide(_set("/machine", {}))
	d.action == "approve"
	endswith(d.reasons[0].message, `(machine "") matches its identity read from the Talos API`)
}

# A node fact that is not text is no name or address of the node's, and a name without a
# value matches none (review 213).
test_a_node_fact_that_is_not_text_matches_nothing if {
	every patch, code in {
		array.concat(_set("/node/hostname", null), _sans([{"type": "dns"}])): "DNSNameNotNode",
		array.concat(_set("/node/hostname", 5), _sans([{"type": "dns", "value": 5}])): "DNSNameNotNode",
		array.concat(_set("/node/addresses", ["10.5.0.2", null]), _sans([{"type": "ip"}])): "IPNotNode",
	} {
		_codes(patch) == [code]
	}
}

# Counts that are not numbers are no counts: those that hold a request back read as past
# every limit, the machines that explain them as none, the candidates as several.
test_counts_that_are_not_numbers_hold_the_request_back if {
	every requests, code in {
		{"undecided": 1000, "machines": "1"}: "TooManyPendingRequests",
		{"undecided": true, "machines": 1}: "TooManyPendingRequests",
		{"newer_from_requester": true}: "TooManyRequests",
	} {
		code in _codes([{"op": "add", "path": "/requests", "value": requests}])
	}
	every candidates in [true, "2"] {
		_codes(_set("/machine_candidates", candidates)) == ["MachineAmbiguous"]
	}
}

test_null_counts_are_none if {
	counts := {"newer_from_requester": null, "undecided": null}
	_decide([{"op": "add", "path": "/requests", "value": counts}]).action == "approve"
	_decide(_set("/machine_candidates", null)).action == "approve"
}
