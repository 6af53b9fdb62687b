package system.log_test

import data.system.log

_event(extra) := {"input": {"csr": {"name": "csr-1", "extra": extra}}}

test_unlisted_extra_values_are_redacted_and_listed_ones_kept if {
	masks := log.mask with input as _event({
		"authentication.kubernetes.io/credential-id": ["X509SHA256=abc"],
		"oidc.example.com/email": ["alice@example.com", "alice@corp.example"],
	})
	masks == {{"op": "upsert", "path": "/input/csr/extra", "value": {
		"authentication.kubernetes.io/credential-id": ["X509SHA256=abc"],
		"oidc.example.com/email": ["**REDACTED**", "**REDACTED**"],
	}}}
}

test_requester_extra_of_an_admission_is_redacted if {
	extra := {"oidc.example.com/email": ["alice@example.com"]}
	masks := log.mask with input as {"input": {"user": {"username": "ichor:alice", "extra": extra}}}
	masks == {{"op": "upsert", "path": "/input/user/extra", "value": {"oidc.example.com/email": ["**REDACTED**"]}}}
}

test_recorded_requester_extra_is_redacted_like_the_users if {
	extra := {"oidc.example.com/email": ["alice@example.com"]}
	masks := log.mask with input as {"input": {"user": {"extra": extra}, "requester": {"extra": extra}}}
	masks == {
		{"op": "upsert", "path": "/input/user/extra", "value": {"oidc.example.com/email": ["**REDACTED**"]}},
		{"op": "upsert", "path": "/input/requester/extra", "value": {"oidc.example.com/email": ["**REDACTED**"]}},
	}
}

test_listed_extra_only_is_left_alone if {
	count(log.mask) == 0 with input as _event({"authentication.kubernetes.io/node-name": ["worker-1"]})
}

test_no_extra_is_left_alone if {
	count(log.mask) == 0 with input as {"input": {"csr": {"name": "csr-1"}}}
}

test_other_inputs_are_left_alone if {
	count(log.mask) == 0 with input as {"input": {"user": "alice"}}
}

_names(n) := [{"type": "ip", "value": sprintf("10.9.%d.%d", [floor(i / 250), i % 250])} | some i in numbers.range(1, n)]

test_ten_thousand_names_are_cut_to_a_hundred_and_said_so if {
	masks := log.mask with input as {"input": {"csr": {"request": {"subject_alt_names": _names(10000)}}}}
	count(masks) == 2
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.request.subject_alt_names": 10000}} in masks
	some cut in masks
	cut.path == "/input/csr/request/subject_alt_names"
	count(cut.value) == 100
	cut.value[0] == {"type": "ip", "value": "10.9.0.1"}
}

test_a_long_name_is_cut_with_its_length if {
	long := concat("", [x | some _ in numbers.range(1, 600); x := "a"])
	sans := [{"type": "dns", "value": long}]
	masks := log.mask with input as {"input": {"csr": {"request": {"subject_alt_names": sans}}}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.request.subject_alt_names": 1}} in masks
	some cut in masks
	cut.path == "/input/csr/request/subject_alt_names"
	cut.value[0].type == "dns"
	endswith(cut.value[0].value, "... (600 bytes)")
	startswith(cut.value[0].value, substring(long, 0, 512))
}

test_long_lists_of_strings_are_cut_too if {
	groups := [sprintf("group-%d", [i]) | some i in numbers.range(1, 150)]
	usage := concat("", [x | some _ in numbers.range(1, 513); x := "u"])
	masks := log.mask with input as {"input": {"csr": {"groups": groups, "usages": [usage]}}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.groups": 150, "csr.usages": 1}} in masks
	some cut in masks
	cut.path == "/input/csr/groups"
	count(cut.value) == 100
}

test_long_reason_lists_and_messages_of_the_result_are_cut if {
	reasons := [{"code": "X", "message": sprintf("%d", [i])} | some i in numbers.range(1, 60)]
	masks := log.mask with input as {"input": {}, "result": {"action": "deny", "reasons": reasons}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {"result.reasons": 60}} in masks
	count([c | some c in masks; c.path == "/result/reasons"; count(c.value) == 50]) == 1

	long := concat("", [x | some _ in numbers.range(1, 513); x := "b"])
	one := log.mask with input as {"input": {}, "result": {"reasons": [{"code": "Y", "message": long}]}}
	count([c | some c in one; c.path == "/result/reasons"; endswith(c.value[0].message, "... (513 bytes)")]) == 1
}

# The densest list JSON can hold: one character an item. Just over max_logged_items, it is
# cut, although its JSON is far shorter than max_logged_value_length.
test_a_list_of_one_character_items_just_over_the_cap_is_cut if {
	digits := [0 | some _ in numbers.range(1, 101)]
	masks := log.mask with input as _groups(digits)
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.groups": 101}} in masks
	count([c | some c in masks; c.path == "/input/csr/groups"; count(c.value) == 100]) == 1

	four := log.mask with input as _groups([0, 0, 0, 0]) with log.config as _three_items
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.groups": 4}} in four
	count(log.mask) == 0 with input as _groups([0, 0, 0]) with log.config as _three_items
}

_groups(groups) := {"input": {"csr": {"groups": groups}}}

# A max_logged_items that is not a number lets the mask skip no list: a long string in one is
# still cut.
test_a_broken_item_cap_still_cuts_a_long_string if {
	long := concat("", [x | some _ in numbers.range(1, 513); x := "g"])
	broken := object.union(log.config, {"max_logged_items": "a hundred"})
	masks := log.mask with input as _groups(["system:nodes", long]) with log.config as broken
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.groups": 2}} in masks
}

_three_items := object.union(log.config, {"max_logged_items": 3})

test_small_lists_are_left_alone if {
	count(log.mask) == 0 with input as {"input": {"csr": {"request": {"subject_alt_names": _names(100)}}}}
	count(log.mask) == 0 with input as {"input": {"node": {"addresses": ["10.5.0.2"]}}, "result": {"reasons": []}}
}

# An approval's entry as the manager logs it, every capped list and string of the kubelet
# serving input present and short: nothing is cut. It is also what `opa test --bench` times
# for the mask, which runs on every logged decision.
test_an_approvals_entry_is_left_alone if {
	count(log.mask) == 0 with input as _approval_entry
}

_approval_entry := {
	"decision_id": "4f9b0c1e-0d7e-4c55-9c1a-0e2b7f1f6a10",
	"path": "ichor/kubelet_serving/decision",
	"input": {
		"csr": {
			"name": "csr-1", "signer_name": "kubernetes.io/kubelet-serving", "uid": "",
			"username": "system:node:worker-1", "groups": ["system:nodes", "system:authenticated"], "extra": {},
			"usages": ["digital signature", "server auth"],
			"request": {
				"pem": {"blocks": 1, "types": ["CERTIFICATE REQUEST"], "headers": 0},
				"parsed": true, "parse_error": "",
				"signature_valid": true, "signature_error": "", "signature_algorithm": "ECDSA-SHA256",
				"subject": [
					{"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
					{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
				],
				"subject_alt_names": [
					{"type": "dns", "value": "worker-1"},
					{"type": "ip", "value": "10.5.0.2"},
					{"type": "ip", "value": "fd00::2"},
				],
				"extensions": [{"oid": "2.5.29.17", "critical": false}],
				"public_key": {"algorithm": "ECDSA", "bits": 256, "curve": "P-256"},
			},
		},
		"machine": {"name": "worker-1", "namespace": "default", "cluster": "demo"},
		"machine_candidates": 0,
		"node": {
			"readable": true, "error": "", "nodename": "worker-1", "hostname": "worker-1",
			"addresses": ["10.5.0.2", "fd00::2"],
		},
		"requests": {"from_requester": 1, "undecided": 1, "machines": 3},
	},
	"result": {"action": "approve", "node": "worker-1", "reasons": [{
		"code": "IchorKubeletServing",
		"message": concat(" ", [
			"kubelet serving certificate for node \"worker-1\" (machine \"worker-1\")",
			"matches its identity read from the Talos API",
		]),
	}]},
}

test_an_audited_certificate_with_ten_thousand_names_is_cut_to_a_hundred if {
	masks := log.mask with input as {"input": {"certificate": {"subject_alt_names": _names(10000)}}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {"certificate.subject_alt_names": 10000}} in masks
	some cut in masks
	cut.path == "/input/certificate/subject_alt_names"
	count(cut.value) == 100
}

# A tenant's kubeconfig with a thousand keys: the fields of its facts are cut like a CSR's names.
test_a_kubeconfig_with_a_thousand_fields_is_cut_to_a_hundred if {
	fields := [{"path": sprintf("users[%d].name", [i]), "field": "users[].name"} | some i in numbers.range(1, 1000)]
	masks := log.mask with input as {"input": {"kubeconfig": {"fields": fields, "unknown_fields": []}}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {"kubeconfig.fields": 1000}} in masks
	some cut in masks
	cut.path == "/input/kubeconfig/fields"
	count(cut.value) == 100
}

# A hostile kubelet's certificate with an issuer DN of 250 KB, and long errors quoting it: each
# free-text string is cut with its length and listed in log_truncated; the short ones are kept.
test_an_audited_certificates_long_strings_are_cut if {
	issuer := concat("", ["CN=", concat("", [x | some _ in numbers.range(1, 250000); x := "i"])])
	verify := concat("", [x | some _ in numbers.range(1, 600); x := "v"])
	node_error := concat("", [x | some _ in numbers.range(1, 513); x := "n"])
	masks := log.mask with input as {"input": {
		"certificate": {"issuer": issuer, "serial": "1a2b", "verify_error": verify, "error": ""},
		"node": {"error": node_error},
	}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {
		"certificate.issuer": 250003,
		"certificate.verify_error": 600,
		"node.error": 513,
	}} in masks
	_values_at(masks, "/input/certificate/issuer") == [sprintf("%s... (250003 bytes)", [substring(issuer, 0, 512)])]
	_values_at(masks, "/input/certificate/verify_error") == [sprintf("%s... (600 bytes)", [substring(verify, 0, 512)])]
	count(_values_at(masks, "/input/node/error")) == 1
	_values_at(masks, "/input/certificate/serial") == []
	count(masks) == 4
}

# The review of 2026-12-05: the names a requester chooses (a CSR's name, up to what the API
# server stores; a tenant's API server sends any) were logged whole with every decision, again
# at each look: each is cut and listed.
test_a_requests_long_names_are_cut if {
	long := concat("", [x | some _ in numbers.range(1, 100000); x := "n"])
	masks := log.mask with input as {
		"input": {
			"csr": {"name": long, "username": long, "uid": long, "signer_name": "kubernetes.io/kubelet-serving"},
			"binding": {"name": long},
		},
		"result": {"action": "pending", "reasons": []},
	}
	{"op": "upsert", "path": "/input/log_truncated", "value": {
		"csr.name": 100000,
		"csr.username": 100000,
		"csr.uid": 100000,
		"binding.name": 100000,
	}} in masks
	cut := sprintf("%s... (100000 bytes)", [substring(long, 0, 512)])
	_values_at(masks, "/input/csr/name") == [cut]
	_values_at(masks, "/input/binding/name") == [cut]
	count(masks) == 5
}

_values_at(masks, path) := [m.value | some m in masks; m.path == path]

test_short_certificate_strings_are_left_alone if {
	count(log.mask) == 0 with input as {"input": {"certificate": {"issuer": "CN=kubernetes", "san_error": "x"}}}
}

# The record of an applied decision (system/applied) holds none of the paths the mask reads.
test_the_applied_record_is_left_alone if {
	count(log.mask) == 0 with input as {
		"path": "system/applied/record",
		"input": {"decision_id": "d-1", "object": "csr/csr-1", "action": "approve"},
		"result": {"applied": "d-1", "object": "csr/csr-1", "action": "approve"},
	}
}

# A capped path holding null, or a value of another type, cuts nothing: only a list or a
# string is cut.
test_capped_paths_of_another_type_are_left_alone if {
	long := concat("", [x | some _ in numbers.range(1, 600); x := "a"])
	count(log.mask) == 0 with input as {
		"input": {
			"csr": {"usages": null, "groups": long},
			"certificate": {"issuer": null, "serial": [long]},
			"node": false,
		},
		"result": {"reasons": null},
	}
}

test_a_persons_condition_message_and_long_username_are_cut if {
	long := concat("", [x | some _ in numbers.range(1, 600); x := "m"])
	conditions := [{"type": "Approved", "status": "True", "reason": "X", "message": long}]
	masks := log.mask with input as {"input": {
		"act": "csr_decision",
		"user": {"username": long},
		"certificate_request": {"conditions": conditions},
	}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {
		"certificate_request.conditions": 1,
		"user.username": 600,
	}} in masks
	some cut in masks
	cut.path == "/input/certificate_request/conditions"
	endswith(cut.value[0].message, "... (600 bytes)")
}

test_a_requester_padded_with_copies_of_its_own_values_is_cut_to_a_hundred if {
	email := concat("", [x | some _ in numbers.range(1, 600); x := "e"])
	masks := log.mask with input as {"input": {"requester": {
		"username": "ichor:alice",
		"groups": ["system:authenticated" | some _ in numbers.range(1, 1000)],
		"extra": {
			"authentication.kubernetes.io/credential-id": ["X509SHA256=abc" | some _ in numbers.range(1, 1000)],
			"oidc.example.com/email": [email],
		},
	}}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {
		"requester.groups": 1000,
		"requester.extra.authentication.kubernetes.io/credential-id": 1000,
		"requester.extra.oidc.example.com/email": 1,
	}} in masks
	some extra in masks
	extra.path == "/input/requester/extra"
	count(extra.value["authentication.kubernetes.io/credential-id"]) == 100
	extra.value["authentication.kubernetes.io/credential-id"][99] == "X509SHA256=abc"
	extra.value["oidc.example.com/email"] == ["**REDACTED**"]
	some groups in masks
	groups.path == "/input/requester/groups"
	count(groups.value) == 100
}

# The SubjectAccessReview a credential decision logs repeats the requester's name and groups,
# which are cut under requester and user: they are cut here too, with the authorizer's words
# (review 255 F5: an identity of thousands of groups made entries of hundreds of KiB).
test_the_access_review_of_a_credential_decision_is_cut_like_its_requester if {
	long := concat("", [x | some _ in numbers.range(1, 600); x := "r"])
	masks := log.mask with input as {"input": {"authorization": {
		"user": long,
		"uid": long,
		"groups": ["system:authenticated" | some _ in numbers.range(1, 1000)],
		"verb": "issue",
		"allowed": false,
		"reason": long,
		"evaluation_error": long,
	}}}
	{"op": "upsert", "path": "/input/log_truncated", "value": {
		"authorization.groups": 1000,
		"authorization.user": 600,
		"authorization.uid": 600,
		"authorization.reason": 600,
		"authorization.evaluation_error": 600,
	}} in masks
	count(_values_at(masks, "/input/authorization/groups")[0]) == 100
	_values_at(masks, "/input/authorization/reason") == [sprintf("%s... (600 bytes)", [substring(long, 0, 512)])]
	count(masks) == 6
}

test_a_long_listed_extra_value_is_cut if {
	long := concat("", [x | some _ in numbers.range(1, 600); x := "n"])
	masks := log.mask with input as _event({"authentication.kubernetes.io/node-name": [long]})
	truncated := {"csr.extra.authentication.kubernetes.io/node-name": 1}
	{"op": "upsert", "path": "/input/log_truncated", "value": truncated} in masks
	some extra in masks
	extra.path == "/input/csr/extra"
	endswith(extra.value["authentication.kubernetes.io/node-name"][0], "... (600 bytes)")
}

# Every path of data.json's capped tables is cut where the table names it,
# read from the table itself: a path written in another shape (not under its
# holder, or a bare string) would cut nothing, without a word.
test_every_capped_list_of_the_table_is_cut if {
	config := log.config
	every holder, rests in config.capped_lists {
		every rest in rests {
			_cut_at(array.concat([holder], rest), numbers.range(1, 101), 101)
		}
	}
}

test_every_capped_string_of_the_table_is_cut if {
	long := concat("", [x | some _ in numbers.range(1, 513); x := "a"])
	config := log.config
	every holder, rests in config.capped_strings {
		every rest in rests {
			_cut_at(array.concat([holder], rest), long, 513)
		}
	}
}

# Whether an entry holding value at path (and nothing else) is cut there,
# and says how long it was.
_cut_at(path, value, length) if {
	parents := [{"op": "add", "path": concat("/", array.concat([""], array.slice(path, 0, i))), "value": {}} |
		some i in numbers.range(1, count(path) - 1)
	]
	leaf := {"op": "add", "path": concat("/", array.concat([""], path)), "value": value}
	entry := {"input": json.patch({}, array.concat(parents, [leaf]))}
	masks := log.mask with input as entry
	{"op": "upsert", "path": "/input/log_truncated", "value": {concat(".", path): length}} in masks
	some cut in masks
	cut.path == concat("/", array.concat(["", "input"], path))
	cut.value != value
}
