# METADATA
# title: Reasons
# description: |
#   What the decision rules share about their reasons. A rule reports every failing check,
#   one reason per offending item (a subject alternative name, a usage), sorted by code and
#   message. A hostile request can carry thousands of items; its decision must still be a
#   bounded object, since it lands on the CSR's condition, in an Event and in the decision
#   log. So at most a limit of reasons of one code are listed, and one more reason of that
#   code says how many were left out. Which limit is each rule's data.json's
#   max_reasons_per_code.
package ichor.lib.reasons

# METADATA
# title: Capped reasons
# description: |
#   The reasons, sorted by code and message, with at most limit of each code, followed for
#   each code that had more by one reason of that code counting what was left out.
capped(reasons, limit) := sort(reasons) if {
	# No more reasons in all than the limit: none of a code can be over it, and a
	# reason ({"code", "message"}) sorts by its code, then its message. The usual case
	# (an approval has one reason) costs no grouping by code. A limit that is not a
	# number (a broken data.json) takes the way below, which fails the decision.
	is_number(limit)
	count(reasons) <= limit
}

else := [reason |
	some code in sort({r.code | some r in reasons})
	some reason in _capped_code(reasons, code, limit)
]

_capped_code(reasons, code, limit) := kept if {
	listed := sort([r | some r in reasons; r.code == code])
	kept := array.slice(listed, 0, limit)
	count(listed) <= limit
} else := array.concat(
	array.slice(listed, 0, limit),
	[{
		"code": code,
		"message": sprintf("%d more %s reasons are not listed (%d in all)", [count(listed) - limit, code, count(listed)]),
	}],
) if {
	listed := sort([r | some r in reasons; r.code == code])
}
