package system.log_test

import data.system.log

# The review of 2026-12-06: a tenant's API server writes spec.extra as it likes, keys
# included. Only the first max_logged_items keys are kept, each cut to
# max_logged_value_length, and two keys alike in their first characters stay two.

_key(prefix, n) := concat("", [prefix, concat("", [x | some _ in numbers.range(1, n); x := "k"])])

test_a_thousand_extra_keys_are_cut_to_a_hundred_and_said_so if {
	extra := {sprintf("key-%04d", [i]): ["v"] | some i in numbers.range(1, 1000)}
	masks := log.mask with input as _event(extra)
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.extra": 1000}} in masks
	some cut in masks
	cut.path == "/input/csr/extra"
	count(cut.value) == 100
	cut.value["key-0001"] == ["**REDACTED**"]
	cut.value["key-0100"] == ["**REDACTED**"]
	not cut.value["key-0101"]
}

test_long_extra_keys_are_cut_and_stay_apart if {
	a := _key("a", 600)
	b := _key("a", 700)
	masks := log.mask with input as _event({a: ["x"], b: ["y"], "short": ["z"]})
	{"op": "upsert", "path": "/input/log_truncated", "value": {"csr.extra": 3}} in masks
	some cut in masks
	cut.path == "/input/csr/extra"
	cut.value == {
		sprintf("%s... (601 bytes, key 0)", [substring(a, 0, 512)]): ["**REDACTED**"],
		sprintf("%s... (701 bytes, key 1)", [substring(b, 0, 512)]): ["**REDACTED**"],
		"short": ["**REDACTED**"],
	}
}

test_a_long_keys_long_values_are_said_cut_under_the_key_as_logged if {
	a := _key("a", 600)
	values := [sprintf("%d", [i]) | some i in numbers.range(1, 200)]
	masks := log.mask with input as _event({a: values})
	some t in masks
	t.path == "/input/log_truncated"
	t.value == {"csr.extra": 1, sprintf("csr.extra.%s... (601 bytes, key 0)", [substring(a, 0, 512)]): 200}
}

test_a_hundred_short_keys_are_not_cut if {
	extra := {sprintf("authentication.kubernetes.io/k%03d", [i]): ["v"] | some i in numbers.range(1, 100)}
	masks := log.mask with input as _event(extra)
	count(masks) == 1
	every m in masks {
		m.path == "/input/csr/extra"
	}
}
