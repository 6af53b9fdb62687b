# A Kubernetes credential's identity and the admin's own binding: the names derived from the
# recorded requester, hostile usernames, and the bindings Go found.
package ichor.credentials_test

import data.ichor.credentials

# The issuance of purpose to username: the requester and the review are theirs.
_issue_as(purpose, username, patch) := _issue_purpose(purpose, array.concat(
	[
		{"op": "replace", "path": "/requester/username", "value": username},
		{"op": "replace", "path": "/authorization/user", "value": username},
	],
	patch,
))

_admin_as(username) := _issue_as("kubeconfig-admin", username, [])

_hashed(username) := concat("", ["ichor-admin:h:", substring(crypto.sha256(username), 0, 36)])

# An intact binding of identity with nonce.
_binding(identity, nonce) := {
	"name": concat(":", [identity, nonce]),
	"role_ref": {"api_group": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
	"subjects": [{"api_group": "rbac.authorization.k8s.io", "kind": "Group", "name": concat(":", [identity, nonce])}],
}

_bindings(bindings) := _set("/admin_identity/bindings", bindings)

test_a_short_ascii_username_is_its_own_identity if {
	every username in ["ichor:alice", "ada@example.com", "Alice", "bob.o-neil_2", "a", "oidc:https:x"] {
		d := _admin_as(username)
		d.allowed
		d.certificate.common_name == concat("", ["ichor-admin:u:", username])
		d.certificate.groups == [concat("", ["ichor-admin:u:", username, ":k2x9p4m7qa"])]
		d.admin_binding.username == username
	}
}

test_case_matters_as_it_does_to_kubernetes if {
	_admin_as("Alice").certificate.common_name != _admin_as("alice").certificate.common_name
}

test_a_username_outside_the_allow_list_is_hashed if {
	every username in [
		"../", "../../etc/passwd", "a/b", "100%", "ichor:alice\n", "-alice", "alice-", "ichor:alice ",
		"ichor:a\u0000", "ichor:al*ce",
	] {
		d := _admin_as(username)
		d.certificate.common_name == _hashed(username)
		d.admin_binding.name == concat("", [_hashed(username), ":k2x9p4m7qa"])
		not contains(d.admin_binding.name, "/")
	}
}

test_a_unicode_look_alike_is_not_its_look_alike if {
	# Cyrillic a (U+0430), Greek omicron in "bob", a fullwidth colon.
	every username in ["ichor:\u0430lice", "ichor:b\u03bfb", "ichor\uff1aalice"] {
		d := _admin_as(username)
		d.certificate.common_name == _hashed(username)
		d.certificate.common_name != "ichor-admin:u:ichor:alice"
	}
}

test_a_look_alike_hashes_apart if {
	_hashed("ichor:\u0430lice") != _hashed("ichor:alice")
}

test_a_long_username_is_hashed_and_every_identity_is_bounded if {
	thirty := concat("", ["ichor:", _repeat("a", 30)])
	_admin_as(thirty).certificate.common_name == concat("", ["ichor-admin:u:", thirty])
	long := concat("", ["ichor:", _repeat("a", 31)])
	_admin_as(long).certificate.common_name == _hashed(long)
	huge := _repeat("x", 1000)
	d := _admin_as(huge)
	d.certificate.common_name == _hashed(huge)

	# Both forms stay within X.509's 64 characters for a common name and an organization, with
	# the nonce, and within the break-glass prefix.
	count(d.admin_binding.name) <= 61
	count(_issue_as("kubeconfig-super-admin", huge, []).certificate.common_name) <= 64
}

_repeat(s, n) := concat("", [s | some _ in numbers.range(1, n)])

test_the_two_forms_never_meet if {
	# A username that spells another's hashed part is too long to stay plain, so it is hashed
	# itself; a shorter one stays plain, behind "u:".
	spelled := substring(_hashed("../"), count("ichor-admin:"), -1)
	_admin_as(spelled).certificate.common_name == _hashed(spelled)
	_admin_as(spelled).certificate.common_name != _hashed("../")
	shorter := substring(spelled, 0, 36)
	_admin_as(shorter).certificate.common_name == concat("", ["ichor-admin:u:", shorter])
}

test_reserved_usernames_are_refused_with_no_certificate_and_no_binding if {
	every username in [
		"system:masters", "system:admin", "system:serviceaccount:ichor-system:ichor-policy",
		"system:kube-controller-manager", "ichor-admin:u:ichor:bob", "ichor-super-admin:u:ichor:bea",
		"ichor-credential:kubeconfig-super-admin", "ichor-credential:kubeconfig-admin",
	] {
		every purpose in ["kubeconfig-admin", "kubeconfig-super-admin"] {
			_codes(_issue_as(purpose, username, [])) == ["UsernameReserved"]
			not _issue_as(purpose, username, []).certificate
			not _issue_as(purpose, username, []).admin_binding
		}
	}
}

test_a_reserved_username_is_named_in_the_refusal if {
	_admin_as("system:masters").reasons == [{
		"code": "UsernameReserved",
		"message": concat("", [
			`user "system:masters" may not be issued a cluster-admin kubeconfig: names starting with "system:" `,
			"are reserved (system:, ichor-admin:, ichor-super-admin:, ichor-credential:)",
		]),
	}]
}

test_reserved_usernames_are_refused_at_admission_too if {
	admit := _admit_purpose("kubeconfig-admin", [
		{"op": "replace", "path": "/user/username", "value": "system:masters"},
		{"op": "replace", "path": "/requester/username", "value": "system:masters"},
		{"op": "replace", "path": "/authorization/user", "value": "system:masters"},
	])
	_codes(admit) == ["UsernameReserved"]
	not admit.event

	# A Talos credential does not name its person: nothing is reserved there.
	_issue_as("talosconfig-reader", "system:masters", []).allowed
}

test_an_empty_username_is_refused_with_no_identity if {
	d := _admin_as("")
	_codes(d) == ["RequesterUnknown"]
	not d.certificate
	not d.admin_binding
}

test_the_break_glass_kubeconfig_names_the_person_and_binds_nothing if {
	d := _issue_as("kubeconfig-super-admin", "ichor:bea", [])
	d.certificate.common_name == "ichor-super-admin:u:ichor:bea"
	d.certificate.groups == ["system:masters"]
	_issue_as("kubeconfig-super-admin", "../", []).certificate.common_name == concat("", [
		"ichor-super-admin:h:",
		substring(crypto.sha256("../"), 0, 36),
	])
}

test_an_intact_binding_of_the_person_is_reused if {
	d := _issue_purpose("kubeconfig-admin", _bindings([
		_binding("ichor-admin:u:ichor:bob", "aaaaaaaaaa"),
		_binding("ichor-admin:u:ichor:alice", "0123456789"),
	]))
	d.certificate.groups == ["ichor-admin:u:ichor:alice:0123456789"]
	d.admin_binding.name == "ichor-admin:u:ichor:alice:0123456789"
	d.admin_binding.create == false
}

test_two_intact_bindings_of_a_race_use_the_first_by_name if {
	d := _issue_purpose("kubeconfig-admin", _bindings([
		_binding("ichor-admin:u:ichor:alice", "zzzzzzzzzz"),
		_binding("ichor-admin:u:ichor:alice", "0000000000"),
	]))
	d.admin_binding.name == "ichor-admin:u:ichor:alice:0000000000"
}

test_another_persons_binding_that_starts_with_the_identity_is_not_theirs if {
	# ichor:alice:0123456789's identity starts with ichor:alice's; its binding is not hers.
	d := _issue_purpose("kubeconfig-admin", _bindings([
		_binding("ichor-admin:u:ichor:alice:0123456789", "aaaaaaaaaa"),
		_binding("ichor-admin:u:ichor:alicea", "aaaaaaaaaa"),
		{"name": 7},
	]))
	d.admin_binding.name == "ichor-admin:u:ichor:alice:k2x9p4m7qa"
	d.admin_binding.create == true
}

test_an_altered_binding_is_refused_not_reused_or_repaired if {
	widened := json.patch(_binding("ichor-admin:u:ichor:alice", "0123456789"), [{
		"op": "add", "path": "/subjects/-",
		"value": {"api_group": "rbac.authorization.k8s.io", "kind": "User", "name": "ichor:mallory"},
	}])
	regrouped := json.patch(
		_binding("ichor-admin:u:ichor:alice", "aaaaaaaaaa"),
		[{"op": "replace", "path": "/subjects/0/name", "value": "system:authenticated"}],
	)
	every binding in [widened, regrouped] {
		d := _issue_purpose("kubeconfig-admin", _bindings([binding]))
		not d.certificate
		not d.admin_binding
		d.reasons == [{"code": "AdminBindingAltered", "message": sprintf(
			concat("", [
				`the ClusterRoleBinding %q of "ichor:alice" no longer grants exactly cluster-admin to its own group; `,
				"revoke it with `ichor cluster admins revoke ichor:alice` and ask again",
			]),
			[binding.name],
		)}]
	}
}

# Review 2, F5: whoever may create bindings may bind a role whose permissions they hold
# without `bind`, so a binding named after a person to another role (view, or a ClusterRole
# of the same name in another kind) is nobody's. It neither refuses the person nor is reused:
# they get a new binding of their own.
test_a_binding_of_the_persons_name_to_another_role_is_ignored if {
	intact := _binding("ichor-admin:u:ichor:alice", "aaaaaaaaaa")
	every patch in [
		[{"op": "replace", "path": "/role_ref/name", "value": "view"}],
		[{"op": "replace", "path": "/role_ref/kind", "value": "Role"}],
		[{"op": "replace", "path": "/role_ref/api_group", "value": "example.com"}],
	] {
		decoy := json.patch(intact, patch)
		d := _issue_purpose("kubeconfig-admin", _bindings([decoy]))
		d.allowed
		d.admin_binding.name == "ichor-admin:u:ichor:alice:k2x9p4m7qa"
		d.admin_binding.create == true

		# Beside an intact one, the intact one is reused.
		beside := _issue_purpose("kubeconfig-admin", _bindings([
			json.patch(_binding("ichor-admin:u:ichor:alice", "0000000000"), patch),
			_binding("ichor-admin:u:ichor:alice", "1111111111"),
		]))
		beside.admin_binding.name == "ichor-admin:u:ichor:alice:1111111111"
		beside.admin_binding.group == beside.admin_binding.name
		beside.admin_binding.create == false
	}
}

test_a_new_binding_needs_a_nonce_of_ten_lowercase_letters_or_digits if {
	every nonce in ["", "short", "UPPERCASE1", "k2x9p4m7q:", "k2x9p4m7qab", 7] {
		_codes(_issue_purpose("kubeconfig-admin", _set("/admin_identity/nonce", nonce))) == ["AdminBindingNonceInvalid"]
		not _issue_purpose("kubeconfig-admin", _set("/admin_identity/nonce", nonce)).certificate
	}
}

test_admin_identity_facts_missing_or_not_an_object_are_no_nonce if {
	removed := [{"op": "remove", "path": "/admin_identity"}]
	_codes(_issue_purpose("kubeconfig-admin", removed)) == ["AdminBindingNonceInvalid"]
	_codes(_issue_purpose("kubeconfig-admin", _set("/admin_identity", "none"))) == ["AdminBindingNonceInvalid"]
}

test_with_an_intact_binding_no_nonce_is_needed if {
	_issue_purpose("kubeconfig-admin", array.concat(
		_set("/admin_identity/nonce", ""),
		_bindings([_binding("ichor-admin:u:ichor:alice", "0123456789")]),
	)).allowed
}

test_the_credential_check_names_no_person if {
	d := _check({"purpose": "kubeconfig-admin", "public_key": _reader_key})
	d.allowed
	d.certificate == {"kind": "kubernetes", "groups": []}
	d.reasons[0].message == concat("", [
		"a cluster-admin kubeconfig (O=their own group, bound to cluster-admin) ",
		"with lifetime 8760h0m0s may be signed",
	])
	not d.admin_binding
}

# Review 2, F5: the issuer looks up admin bindings only for a purpose whose credential a
# binding of its person's gives power, named after that person's identity.
test_requirements_name_the_admin_binding_only_where_one_gives_power if {
	reqs := credentials.requirements with input as {"purpose": "kubeconfig-admin", "username": "ichor:alice"}
	reqs.admin_binding == {"identity": "ichor-admin:u:ichor:alice", "cluster_role": "cluster-admin"}
	hashed := credentials.requirements with input as {"purpose": "kubeconfig-admin", "username": "../"}
	hashed.admin_binding.identity == concat("", ["ichor-admin:h:", substring(crypto.sha256("../"), 0, 36)])

	# No username (admission asks with the purpose alone), or an empty one: no lookup.
	not credentials.requirements.admin_binding with input as {"purpose": "kubeconfig-admin"}
	not credentials.requirements.admin_binding with input as {"purpose": "kubeconfig-admin", "username": ""}
	every purpose in ["talosconfig-reader", "credentials-talos", "node-reader", "kubeconfig-super-admin"] {
		not credentials.requirements.admin_binding with input as {"purpose": purpose, "username": "ichor:alice"}
	}
}

test_requester_padded_with_copies_of_its_own_values_is_refused if {
	padded_groups := ["system:authenticated", "ichor:operators", "ichor:operators"]
	d := _admit(_set("/requester/groups", padded_groups))
	d.reasons[0].message == concat("", [
		`spec.requester ("ichor:alice") is not the user who made the request ("ichor:alice"): `,
		"groups differ",
	])
	_codes(_admit([
		{"op": "replace", "path": "/user/extra", "value": {"scopes": ["a"]}},
		{"op": "replace", "path": "/requester/extra", "value": {"scopes": ["a", "a"]}},
	])) == ["RequesterMismatch"]
}

# ADR 0124: the purposes for one of Ichor's own calls are for its ServiceAccounts; nothing
# hands them to a person, even one granted their verb (issue) by a custom or wildcard role.
test_a_person_holding_issue_is_refused_ichors_own_purposes if {
	alice := [{"op": "replace", "path": path, "value": "ichor:alice"} |
		some path in ["/user/username", "/requester/username", "/authorization/user"]
	]
	_admit_purpose("packet-capture", alice).reasons[0].message == concat("", [
		`user "ichor:alice" may not be issued an os:operator identity to run one packet capture: `,
		"it is issued to a ServiceAccount of Ichor's only, never to a person",
	])
	every purpose in ["node-reader", "support-bundle", "etcd-snapshot", "packet-capture"] {
		admitted := _admit_purpose(purpose, alice)
		not admitted.allowed
		not admitted.event
		_codes(admitted) == ["PurposeNotForPeople"]
		_codes(_issue_as(purpose, "ichor:alice", [])) == ["PurposeNotForPeople"]
	}
}

# Only a ServiceAccount: its name's form, and its group. A node, a group's name taken as a
# user's, a name that merely begins alike, and a ServiceAccount's name without the group
# (an authenticator other than the API server's tokens may name anyone so) are not one.
test_only_a_service_account_is_issued_ichors_own_purposes if {
	_issue_as("node-reader", "system:serviceaccount:ichor-system:ichor-ui", []).allowed
	"PurposeNotForPeople" in _codes(_issue_as(
		"node-reader", "system:serviceaccount:ichor-system:ichor-ui",
		[{"op": "replace", "path": "/requester/groups", "value": ["system:authenticated"]}],
	))
	every username in [
		"system:node:worker-1", "system:serviceaccounts:ichor-system", "system:serviceaccountx:a:b", "",
		"system:serviceaccount:", "system:serviceaccount:a", "system:serviceaccount:a:b:c", "system:serviceaccount:A:b",
	] {
		"PurposeNotForPeople" in _codes(_issue_as("node-reader", username, []))
	}
}

# Within the namespaces Go names (the manager's own): a ServiceAccount a namespace's admin
# made elsewhere, bound issue and took the token of, is no component of Ichor's (review 254
# F4), at admission and at issuance. None named, any; an empty list, none; a value that is
# no list of names, none.
test_a_service_account_outside_ichors_namespaces_is_refused_ichors_own_purposes if {
	named := [{"op": "add", "path": "/settings/component_namespaces", "value": ["ichor-system", "ichor-ui"]}]
	_issue_as("node-reader", "system:serviceaccount:ichor-system:ichor-ui", named).allowed
	_issue_as("node-reader", "system:serviceaccount:ichor-ui:ichor-ui", named).allowed
	refused := _issue_as("node-reader", "system:serviceaccount:tenant-a:ichor-ui", named)
	_codes(refused) == ["PurposeNotForPeople"]
	refused.reasons[0].message == concat("", [
		`user "system:serviceaccount:tenant-a:ichor-ui" may not be issued an os:reader identity to read one node: `,
		"it is issued to a ServiceAccount of Ichor's only (of namespace ichor-system, ichor-ui), never to a person",
	])
	_issue_as("node-reader", "system:serviceaccount:tenant-a:ichor-ui", []).allowed

	# At admission, whose input has no settings of its own but these.
	_admit_purpose("node-reader", _admission_settings(["ichor-system"])).allowed
	_codes(_admit_purpose("node-reader", _admission_settings(["tenant-a"]))) == ["PurposeNotForPeople"]

	endswith(
		_issue_as(
			"node-reader", "system:serviceaccount:ichor-system:ichor-ui",
			[{"op": "add", "path": "/settings/component_namespaces", "value": "ichor-system"}],
		).reasons[0].message,
		"only (of no namespace: settings.component_namespaces names none), never to a person",
	)
	every value in [[], "ichor-system", {"ichor-system": true}, [1], [1, "ichor-system"]] {
		refusal := _issue_as(
			"node-reader", "system:serviceaccount:ichor-system:ichor-ui",
			[{"op": "add", "path": "/settings/component_namespaces", "value": value}],
		)
		_codes(refusal) == ["PurposeNotForPeople"]
	}
}

_admission_settings(namespaces) := [{"op": "add", "path": "/settings", "value": {"component_namespaces": namespaces}}]

# A purpose of the table that does not say it is for people is not.
test_a_purpose_that_does_not_say_it_is_for_people_is_not if {
	config := json.patch(credentials.config, [
		{"op": "remove", "path": "/purposes/talosconfig-reader/for_people"},
		{"op": "remove", "path": "/purposes/kubeconfig-admin/for_people"},
	])
	d := credentials.admission with input as _good with credentials.config as config
	_codes(d) == ["PurposeNotForPeople"]

	# A Kubernetes purpose has no Talos role for the message to name: refused all the same.
	as_alice := _purpose_patch("kubeconfig-admin", ["/user/username"])
	admin := _admit(as_alice) with credentials.config as config
	_codes(admin) == ["PurposeNotForPeople"]
	startswith(admin.reasons[0].message, `user "ichor:alice" may not be issued an Ichor cluster-admin kubeconfig:`)
}

# The request for another purpose, with the SubjectAccessReview that purpose requires passed;
# one of Ichor's own purposes asked by its ServiceAccount, as only one may.
_purpose_patch(purpose, paths) := array.concat(
	[
		{"op": "replace", "path": "/request/purpose", "value": purpose},
		{"op": "replace", "path": "/authorization/verb", "value": _purposes[purpose].authorization.verb},
		{"op": "replace", "path": "/authorization/subresource", "value": _purposes[purpose].authorization.subresource},
	],
	_as_component(purpose, paths),
)

_component := "system:serviceaccount:ichor-system:ichor-ui"

_as_component(purpose, paths) := array.concat(
	[{"op": "replace", "path": path, "value": _component} |
		some path in array.concat(paths, ["/requester/username", "/authorization/user"])
		not _purposes[purpose].for_people
	],
	[{"op": "replace", "path": path, "value": ["system:serviceaccounts", "system:authenticated"]} |
		some path in array.concat(
			[concat("", [trim_suffix(p, "/username"), "/groups"]) | some p in paths],
			["/requester/groups", "/authorization/groups"],
		)
		not _purposes[purpose].for_people
	],
)
