package ichor.lib.csr_test

import data.ichor.lib.csr

_prefix := "system:node:"

_o(value) := {"oid": "2.5.4.10", "name": "O", "value": value}

_cn(value) := {"oid": "2.5.4.3", "name": "CN", "value": value}

_request(subject) := {"subject": subject}

# --- common_names, organizations ---

test_common_names_and_organizations_keep_the_subject_order if {
	request := _request([
		_cn("system:node:worker-2"),
		_o("system:nodes"),
		{"oid": "2.5.4.11", "name": "OU", "value": "talos"},
		_cn("system:node:worker-1"),
		_o("ops"),
	])
	csr.common_names(request) == ["system:node:worker-2", "system:node:worker-1"]
	csr.organizations(request) == ["system:nodes", "ops"]
}

test_attributes_are_found_by_oid_not_by_name if {
	request := _request([
		{"oid": "2.5.4.3", "name": "", "value": "system:node:worker-1"},
		{"oid": "2.5.4.11", "name": "CN", "value": "not a common name"},
		{"oid": "2.5.4.10", "name": "", "value": "system:nodes"},
	])
	csr.common_names(request) == ["system:node:worker-1"]
	csr.organizations(request) == ["system:nodes"]
}

test_a_repeated_value_is_kept if {
	csr.organizations(_request([_o("system:nodes"), _o("system:nodes")])) == ["system:nodes", "system:nodes"]
}

test_no_subject_has_no_names if {
	csr.common_names({"parsed": false}) == []
	csr.organizations(_request([])) == []
}

# --- node_name ---

test_node_name_is_the_common_name_without_the_prefix if {
	csr.node_name(_request([_o("system:nodes"), _cn("system:node:worker-1")]), _prefix) == "worker-1"
}

test_node_name_trims_the_prefix_once if {
	csr.node_name(_request([_cn("system:node:system:node:worker-1")]), _prefix) == "system:node:worker-1"
}

test_common_name_that_is_only_the_prefix_names_no_node if {
	csr.node_name(_request([_cn("system:node:")]), _prefix) == ""
}

test_common_name_without_the_prefix_names_no_node if {
	csr.node_name(_request([_cn("worker-1")]), _prefix) == ""
	csr.node_name(_request([_cn("System:Node:worker-1")]), _prefix) == ""
	csr.node_name(_request([_cn(" system:node:worker-1")]), _prefix) == ""
}

test_no_common_name_names_no_node if {
	csr.node_name(_request([_o("system:nodes")]), _prefix) == ""
	csr.node_name({"parsed": false}, _prefix) == ""
}

test_two_common_names_name_no_node if {
	csr.node_name(_request([_cn("system:node:worker-1"), _cn("system:node:worker-1")]), _prefix) == ""
}

test_empty_common_name_names_no_node_even_with_an_empty_prefix if {
	csr.node_name(_request([_cn("")]), "") == ""
	csr.node_name(_request([_cn("worker-1")]), "") == "worker-1"
}

test_common_name_that_is_not_a_string_names_no_node if {
	csr.node_name(_request([_cn(1)]), _prefix) == ""
}

# --- attribute_label ---

test_attribute_is_labelled_by_its_name if csr.attribute_label(_o("system:nodes")) == "O"

test_attribute_without_a_name_is_labelled_by_its_oid if {
	csr.attribute_label({"oid": "1.2.3.4", "name": "", "value": "system:masters"}) == "1.2.3.4"
}

# --- usages_allowed ---

_sets := {
	"without_key_encipherment": ["digital signature", "server auth"],
	"with_key_encipherment": [
		"digital signature",
		"key encipherment",
		"server auth",
	],
}

test_usages_equal_to_a_set_in_any_order_are_allowed if {
	csr.usages_allowed(["server auth", "digital signature"], _sets)
	csr.usages_allowed(["server auth", "key encipherment", "digital signature"], _sets)
}

test_allowed_sets_may_be_an_array if {
	csr.usages_allowed(["client auth"], [["server auth"], ["client auth"]])
}

test_usage_more_or_less_is_not_allowed if {
	not csr.usages_allowed(["digital signature", "server auth", "client auth"], _sets)
	not csr.usages_allowed(["server auth"], _sets)
	not csr.usages_allowed(["key encipherment", "server auth"], _sets)
}

test_repeated_usage_is_not_allowed if {
	# The same distinct usages as an allowed set, one repeated: a set comparison alone would accept it.
	not csr.usages_allowed(["digital signature", "server auth", "server auth"], _sets)
}

test_no_usages_are_not_allowed if not csr.usages_allowed([], _sets)

test_no_allowed_sets_allow_nothing if not csr.usages_allowed([], {})

# --- malformed ---

test_a_single_certificate_request_block_is_well_formed if {
	csr.malformed({"parsed": true, "pem": {"blocks": 1, "types": ["CERTIFICATE REQUEST"], "headers": 3}}) == set()
}

test_every_pem_problem_is_reported if {
	csr.malformed({"parsed": true, "pem": {"blocks": 3, "types": ["NEW CERTIFICATE REQUEST", "X", "Y"]}}) == {
		"is a PEM block of type \"NEW CERTIFICATE REQUEST\"; kube-controller-manager signs only a CERTIFICATE REQUEST block",
		"holds 3 PEM blocks; the signer reads the first only, and a reader of the object may see another",
	}
}

test_a_request_that_does_not_parse_is_reported_with_its_error if {
	unparsed := {"parsed": false, "parse_error": "asn1: structure error"}
	csr.malformed(unparsed) == {"does not parse as a certificate request: asn1: structure error"}
	csr.malformed({}) == {"does not parse as a certificate request: the input holds no parse error (no request was given)"}
}
