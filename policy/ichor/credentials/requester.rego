# Who asks: the recorded requester, and the SubjectAccessReview made as them, at admission
# (as the authenticated user) and again before signing (as spec.requester).
package ichor.credentials

# METADATA
# title: Requester unknown
# description: |
#   spec.requester names no user. `ichor cluster` fills it in from a SelfSubjectReview; a
#   request made by an older client, or stored before requesters were recorded, carries
#   none, so nobody could be re-authorized before signing. Checked at admission and again
#   before signing.
# custom:
#   code: RequesterUnknown
_refused_for_requester contains reason if {
	_subject_name(_requester) == ""
	reason := {
		"code": "RequesterUnknown",
		"message": concat("", [
			"spec.requester names no user, so who asked cannot be checked: ",
			"ask again with `ichor cluster`, which records the requester",
		]),
	}
}

# The checks of who asks: the SubjectAccessReview Go made must be the one the purpose
# requires, as subject, and must allow. At admission the subject is the authenticated user;
# at issuance, the recorded requester.
_authorization_refusals(subject) := _authorization_mismatch(subject) | _not_authorized(subject)

# METADATA
# title: SubjectAccessReview for the wrong grant
# description: |
#   The SubjectAccessReview Go made is not the one the purpose requires: as the requester
#   (user and groups), for the purpose's verb, group, resource and subresource, on the
#   cluster's name and namespace; or none was made. Its answer says nothing about this
#   request (one made as the controller would always pass), so it is refused. Checked at
#   admission (as the user who creates the request) and before signing (as the recorded
#   requester).
# custom:
#   code: AuthorizationMismatch
_authorization_mismatch(subject) := {reason |
	required := _sar_required(subject)
	_sar_made != required
	reason := {
		"code": "AuthorizationMismatch",
		"message": sprintf(
			"the SubjectAccessReview asked whether %s, not whether %s",
			[_sar_text(_sar_made), _sar_text(required)],
		),
	}
}

# METADATA
# title: Not authorized
# description: |
#   The requester does not hold the purpose's verb on its subresource for this cluster (for
#   talosconfig-reader: download on talosclusters/talosconfig-reader). The message names the
#   verb and subresource, with the authorizer's reason. Checked at admission and again right
#   before signing, so a grant removed in between stops the issuance.
# custom:
#   code: NotAuthorized
_not_authorized(subject) := {reason |
	required := _sar_required(subject)
	_sar_made == required
	not input.authorization.allowed == true
	reason := {
		"code": "NotAuthorized",
		"message": _with_details(
			sprintf("user %q may not %s", [_subject_name(subject), _grant_text(required, _cluster, _namespace)]),
			_sar_details(_authorization),
		),
	}
}

default _user := {}

_user := input.user if is_object(input.user)

default _requester := {}

_requester := input.requester if is_object(input.requester)

default _subject_name(_) := ""

_subject_name(subject) := subject.username if is_string(subject.username)

_username := _subject_name(_user)

# Who a subject is, as an authorizer sees them: groups and the values of extra are sets.
_identity(subject) := {
	"username": _subject_name(subject),
	"uid": _string_or_empty(object.get(subject, "uid", "")),
	"groups": {group | some group in _list_or_empty(object.get(subject, "groups", []))},
	"extra": {key: {value | some value in _list_or_empty(values)} |
		some key, values in _object_or_empty(object.get(subject, "extra", {}))
	},
}

# How many values a subject's lists hold, which its _identity's sets do not say.
_counts(subject) := {
	"groups": count(_list_or_empty(object.get(subject, "groups", []))),
	"extra": {key: count(_list_or_empty(values)) |
		some key, values in _object_or_empty(object.get(subject, "extra", {}))
	},
}

_string_or_empty(value) := value if is_string(value)

else := ""

_list_or_empty(value) := value if is_array(value)

else := []

_object_or_empty(value) := value if is_object(value)

else := {}

_cluster := object.get(_request, "cluster", "")

_namespace := object.get(_request, "namespace", "")

# Anything but an object is no review: it equals no required one.
default _authorization := {}

_authorization := input.authorization if is_object(input.authorization)

_sar_fields := ["verb", "group", "resource", "subresource", "namespace", "name", "user"]

# Absent fields are empty, so that a review with a field missing never equals the
# required one. Groups are compared as sets: their order means nothing to an authorizer.
_sar_made := object.union(
	{key: object.get(_authorization, key, "") | some key in _sar_fields},
	{"groups": {group | some group in object.get(_authorization, "groups", [])}},
)

# The grant the purpose requires on this cluster; the review must be made as the subject.
_grant_required := object.union(
	_config.purposes[_request.purpose].authorization,
	{"namespace": _namespace, "name": _cluster},
)

_sar_required(subject) := object.union(
	_grant_required,
	{"user": _subject_name(subject), "groups": _identity(subject).groups},
)
