package ichor.lib.reasons_test

import data.ichor.lib.reasons

_reason(code, n) := {"code": code, "message": sprintf("item %03d", [n])}

test_few_reasons_are_all_listed_sorted if {
	sorted := [_reason("A", 1), _reason("A", 2), _reason("B", 1)]
	reasons.capped({_reason("B", 1), _reason("A", 2), _reason("A", 1)}, 3) == sorted
}

test_more_than_the_limit_of_one_code_are_counted_after_it if {
	many := {_reason("IPNotNode", n) | some n in numbers.range(1, 25)}
	got := reasons.capped(many | {_reason("DNSNameNotNode", 1)}, 3)
	got == [
		_reason("DNSNameNotNode", 1),
		_reason("IPNotNode", 1), _reason("IPNotNode", 2), _reason("IPNotNode", 3),
		{"code": "IPNotNode", "message": "22 more IPNotNode reasons are not listed (25 in all)"},
	]
}

test_a_code_sorts_before_a_message if {
	reasons.capped({{"code": "B", "message": "a"}, {"code": "A", "message": "z"}}, 5) == [
		{"code": "A", "message": "z"},
		{"code": "B", "message": "a"},
	]
}

test_more_reasons_than_the_limit_none_of_a_code_over_it_are_all_listed_sorted if {
	sorted := [_reason("A", 1), _reason("A", 2), _reason("B", 1)]
	reasons.capped({_reason("B", 1), _reason("A", 2), _reason("A", 1)}, 2) == sorted
}

# A limit that is not a number is never taken for a high one (numbers sort before strings):
# the reasons do not come back as if within it. The engine's strict builtin errors fail the
# decision instead; without them (opa test), no reason is left, which Go refuses too.
test_a_limit_that_is_not_a_number_is_not_taken_for_a_high_one if {
	reasons.capped({_reason("A", 1)}, "10") != [_reason("A", 1)]
}

test_exactly_the_limit_is_not_counted if {
	count(reasons.capped({_reason("A", 1), _reason("A", 2)}, 2)) == 2
}

test_no_reasons_are_none if {
	reasons.capped(set(), 10) == []
}
