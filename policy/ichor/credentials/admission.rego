# What only admission checks: the operation, and that the request names who makes it.
package ichor.credentials

# METADATA
# title: Operation not allowed
# description: |
#   Only CREATE is admitted. The spec is immutable (what admission judged is what is signed)
#   and a refused request is not retried, so anything else reaching this decision means the
#   webhook is registered for more than CREATE; it is refused rather than waved through.
#   Status updates use the status subresource, which the webhook does not match.
# custom:
#   code: OperationNotAllowed
_refused_at_admission contains reason if {
	operation := object.get(input, "operation", "")
	operation != "CREATE"
	reason := {
		"code": "OperationNotAllowed",
		"message": sprintf(
			"operation %q is not allowed: a TalosCredentialRequest is only created, never changed; ask with a new one",
			[operation],
		),
	}
}

# METADATA
# title: Requester unnamed
# description: |
#   The request carries no user name. The Event must name who asked, and a credential that
#   cannot be recorded is not issued (ADR 0124).
# custom:
#   code: RequesterUnnamed
_refused_at_admission contains reason if {
	_username == ""
	reason := {
		"code": "RequesterUnnamed",
		"message": "the request names no user, so its issuance could not be recorded",
	}
}

# METADATA
# title: Requester is not who asked
# description: |
#   spec.requester is not exactly the user who creates the request (user name, uid, groups
#   as a set of the same size, extra attributes, each key's values likewise). The
#   ValidatingAdmissionPolicy ichor-credential-requester
#   refuses this inside the API server already; the webhook refuses it too, so that a
#   request whose requester was forged is never admitted while that policy is missing.
#   The message names the fields that differ, never the values of extra.
# custom:
#   code: RequesterMismatch
_refused_at_admission contains reason if {
	_subject_name(_requester) != ""

	# The same object is the same user: the sets below are built only for two that differ
	# in something (0.1 ms of each admission, where `ichor cluster` copied the user).
	_requester != _user
	differing := [field |
		some field in ["username", "uid", "groups", "extra"]
		_differs(field)
	]
	count(differing) > 0
	reason := {
		"code": "RequesterMismatch",
		"message": sprintf(
			"spec.requester (%q) is not the user who made the request (%q): %s differ",
			[_subject_name(_requester), _subject_name(_user), concat(", ", differing)],
		),
	}
}

_differs(field) if _identity(_requester)[field] != _identity(_user)[field]

# The same sets, but one padded with copies of its own values: a megabyte of them would be a
# megabyte in every decision's log entry.
_differs(field) if _counts(_requester)[field] != _counts(_user)[field]
