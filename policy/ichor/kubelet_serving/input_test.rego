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

# A name that is not a {"type", "value"} object is a name of no allowed type.
test_names_not_written_as_names_are_refused if {
	every sans in [["worker-1"], [{"value": "worker-1"}], "worker-1", {"type": "dns", "value": "worker-1"}] {
		d := _decide(_sans(sans))
		d.action == "deny"
		"SANTypeForbidden" in {r.code | some r in d.reasons}
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
