package ichor.lib.keys_test

import data.ichor.lib.keys

_table := keys.algorithms

test_the_keys_kubelets_and_people_use_are_allowed if {
	keys.allowed({"algorithm": "ECDSA", "curve": "P-256", "bits": 256}, _table)
	keys.allowed({"algorithm": "ECDSA", "curve": "P-384", "bits": 384}, _table)
	keys.allowed({"algorithm": "RSA", "bits": 2048}, _table)
	keys.allowed({"algorithm": "RSA", "bits": 8192}, _table)
	keys.allowed({"algorithm": "Ed25519", "bits": 256}, _table)
}

test_weak_or_unknown_keys_are_not if {
	not keys.allowed({"algorithm": "RSA", "bits": 1024}, _table)
	not keys.allowed({"algorithm": "RSA", "bits": 2047}, _table)
	not keys.allowed({"algorithm": "RSA", "bits": 16384}, _table)
	not keys.allowed({"algorithm": "ECDSA", "curve": "P-224", "bits": 224}, _table)
	not keys.allowed({"algorithm": "ECDSA", "curve": "P-521", "bits": 521}, _table)
	not keys.allowed({"algorithm": "ECDH", "curve": "X25519"}, _table)
	not keys.allowed({"algorithm": "DSA", "bits": 2048}, _table)
	not keys.allowed({"algorithm": "RSA", "bits": "2048"}, _table)
	not keys.allowed({}, _table)
}

test_every_allowed_algorithm_limits_its_curve_or_its_size if {
	_muddled(_table) == set()
}

test_the_table_check_catches_a_curve_with_a_size_and_an_unknown_limit if {
	_muddled({
		"ECDSA": {"curves": ["P-256"], "min_bits": 256},
		"RSA": {"min_bits": 2048, "max_bytes": 1024},
		"Ed25519": {},
	}) == {"ECDSA", "RSA"}
}

test_rsa_keys_are_bounded_on_both_sides if {
	_table.RSA == {"min_bits": 2048, "max_bits": 8192}
}

test_keys_are_named_for_a_person if {
	keys.text({"algorithm": "RSA", "bits": 1024}) == "RSA 1024-bit"
	keys.text({"algorithm": "ECDSA", "curve": "P-224", "bits": 224}) == "ECDSA P-224 224-bit"
	keys.text({"algorithm": "Ed25519"}) == "Ed25519"
}

test_the_table_is_named_for_a_person if {
	keys.algorithms_text(_table) == "ECDSA on curve P-256 or P-384, Ed25519, RSA of 2048 to 8192 bits"
	keys.algorithms_text({"RSA": {"min_bits": 2048}}) == "RSA of at least 2048 bits"
}

_muddled(algorithms) := {name |
	some name, rule in algorithms
	_muddled_rule(rule)
}

_muddled_rule(rule) if object.keys(rule) - {"curves", "min_bits", "max_bits"} != set()

_muddled_rule(rule) if {
	rule.curves
	object.keys(rule) & {"min_bits", "max_bits"} != set()
}

# No table allows less than the floor (review 215): RSA under 2048 bits, or an ECDSA curve
# under 256 bits, stays refused whatever a bundle's data says.
test_no_table_allows_a_key_under_the_floor if {
	loose := {"RSA": {"min_bits": 512}, "ECDSA": {"curves": ["P-224", "P-256"]}}
	every key in [{"algorithm": "RSA", "bits": 1024}, {"algorithm": "ECDSA", "curve": "P-224", "bits": 224}] {
		not keys.allowed(key, loose)
	}
}

test_a_loose_table_still_allows_what_the_floor_allows if {
	keys.allowed({"algorithm": "RSA", "bits": 2048}, {"RSA": {"min_bits": 512}})
}
