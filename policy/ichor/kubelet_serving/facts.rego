package ichor.kubelet_serving

import data.ichor.lib.csr as lib_csr

# Go always gives every fact, but a hand-made input (opa eval, a test case, a log from an
# older build) may lack one or hold it as another type. A check whose condition or message
# reads a missing fact is undefined (even under not: its references are evaluated first),
# so it reports nothing, and a request with nothing reported is approved (review 210). So
# each fact a check reads is read with what its absence means (object.get: no requester,
# no groups, no usages, no key; no names), a name that is not a {"type", "value"} object
# is of no allowed type, and flags are tested against the boolean true (null and "yes" are
# truthy to a bare reference).
_username := object.get(input.csr, "username", "")

_sans := lib_csr.list(object.get(_request, "subject_alt_names", null))

# Groups that are not a list are none: a string's "system:nodes" is not a group list's.
default _groups := []

_groups := groups if {
	groups := object.get(input.csr, "groups", [])
	is_array(groups)
}

# Whether spec.expirationSeconds is above the cap: a number above it, or anything else but
# none (null): a boolean orders below every number.
_expiration_too_long if input.csr.expiration_seconds > _config.max_expiration_seconds

_expiration_too_long if {
	seconds := input.csr.expiration_seconds
	seconds != null
	not is_number(seconds)
}

# The machine the request's node name found: an object (check-csr's machine may have no
# name). Anything else (null, a string) is no machine, so that the request is left pending
# as one no machine has, rather than left without a decision, as a message naming a missing
# machine would leave it.
_machine := input.machine if is_object(input.machine)

_machine_name := object.get(_machine, "name", "")

# A count of input.requests; zero when Go gave none (check-csr, replay of older logs) or
# null. One that is not a number is no count (review 213): the counts that hold a request
# back (undecided, from_requester, newer_from_requester) read as past every limit, the
# machines that explain them as none.
_count(name) := value if {
	value := object.get(input, ["requests", name], 0)
	is_number(value)
} else := 0 if {
	object.get(input, ["requests", name], 0) == null
} else := 0 if {
	name == "machines"
} else := 1000000000

# How many machines answer to the node name: one when Go gave none (or null), and more
# than one when what it holds is not a number, which cannot tell them apart.
default _machine_candidates := 2

_machine_candidates := candidates if {
	candidates := object.get(input, "machine_candidates", 1)
	is_number(candidates)
} else := 1 if {
	input.machine_candidates == null
}
