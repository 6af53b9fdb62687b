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
