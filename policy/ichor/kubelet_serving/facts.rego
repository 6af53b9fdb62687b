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

_sans := lib_csr.subject_alt_names(object.get(_request, "subject_alt_names", null))

# The machine the request's node name found: an object (check-csr's machine may have no
# name). Anything else (null, a string) is no machine, so that the request is left pending
# as one no machine has, rather than left without a decision, as a message naming a missing
# machine would leave it.
_machine := input.machine if is_object(input.machine)

_machine_name := object.get(_machine, "name", "")
