# Whose a Kubernetes credential is: the person's admin identity, derived from the recorded
# requester, and the ClusterRoleBinding that gives an admin kubeconfig its power (issue 23,
# KEP-4214: "for each new User ... create a new ClusterRoleBinding").
#
# The identity is a prefix per kind of credential ("ichor-admin:", "ichor-super-admin:"),
# then either "u:" and the username itself, when it is short (at most plain_max_length
# characters) and made only of ASCII letters, digits and . _ @ : - (starting and ending with
# a letter or digit), or else "h:" and the first hash_length hex digits of the SHA-256 of the
# username's UTF-8 bytes. The two forms differ in their first character after the prefix, so
# no plain name equals a hashed one; a plain name is the username itself, so two people's
# never meet; a hashed one would need a SHA-256 collision in 144 bits. Nothing a username
# holds can make the identity start with "system:" or with another person's identity.
#
# An admin kubeconfig's group is its person's binding's name: the identity, ":" and a nonce
# of ten lowercase letters or digits, drawn when the binding is made. A new binding is a new
# group, so a certificate whose binding was deleted (revoked) stays powerless when its
# person later gets a new one.
package ichor.credentials

# The person's identity for the purpose, from the username; undefined for a purpose without
# one or an empty username.
_person_identity(purpose, username) := concat("", [
	_config.person_identity.prefixes[purpose.identity],
	_identity_part(username),
]) if {
	is_string(username)
	username != ""
}

_identity_part(username) := concat("", ["u:", username]) if {
	count(username) <= _config.person_identity.plain_max_length
	regex.match(`^[A-Za-z0-9]([A-Za-z0-9._@:-]*[A-Za-z0-9])?$`, username)
} else := concat("", ["h:", substring(crypto.sha256(username), 0, _config.person_identity.hash_length)])

# What the requester's name allows of the purpose.
_identity_refusals(subject, purpose) := _reserved_refusals(subject, purpose) | _component_refusals(subject, purpose)

# METADATA
# title: Username reserved
# description: |
#   A credential that names its person (kubeconfig-admin, kubeconfig-super-admin) is not
#   issued to a username that starts with one of person_identity.reserved_prefixes: "system:"
#   (Kubernetes' own users: nodes, service accounts, components, which are not people) and
#   the prefixes of Ichor's certificate identities ("ichor-admin:", "ichor-super-admin:",
#   "ichor-credential:"), so the API server's audit log never shows a person under a name
#   that reads as another credential's. Checked at admission and again before signing.
# custom:
#   code: UsernameReserved
_reserved_refusals(subject, purpose) := {reason |
	purpose.identity
	username := _subject_name(subject)
	some prefix in _config.person_identity.reserved_prefixes
	startswith(username, prefix)
	reason := {
		"code": "UsernameReserved",
		"message": sprintf(
			"user %q may not be issued a %s: names starting with %q are reserved (%s)",
			[username, purpose.credential, prefix, concat(", ", _config.person_identity.reserved_prefixes)],
		),
	}
}

# METADATA
# title: Purpose not for people
# description: |
#   A purpose for one of Ichor's own calls (node-reader, support-bundle, etcd-snapshot,
#   packet-capture: any purpose whose for_people is not true in data.json) is issued only to
#   a ServiceAccount (component_requester: its username's form, and its group), never to a
#   person or to a node (ADR 0124: "nothing hands them to a person", "Ichor offers no
#   os:operator talosconfig"). Its verb, issue, is meant for Ichor's own ServiceAccounts;
#   without this a person granted it by a custom or wildcard role would take an os:operator
#   or os:etcd:backup certificate away. Which ServiceAccounts hold issue stays RBAC's to say
#   (and whoever may impersonate one acts as it), within the namespaces Go names
#   (settings.component_namespaces: the manager's own, or those of --component-namespaces):
#   a person who may make a ServiceAccount, bind it issue and take its token elsewhere (a
#   namespace's admin) does not take those certificates through it. Checked at admission
#   and again before signing.
# custom:
#   code: PurposeNotForPeople
_component_refusals(subject, purpose) := {reason |
	purpose.kind
	not purpose.for_people == true
	not _service_account(subject)
	reason := {
		"code": "PurposeNotForPeople",
		"message": sprintf(
			"user %q may not be issued an %s %s: it is issued to a ServiceAccount of Ichor's only%s, never to a person",
			[
				_subject_name(subject), object.get(purpose, "talos_role", "Ichor"), purpose.credential,
				_component_namespaces_said,
			],
		),
	}
}

_service_account(subject) if {
	name := _subject_name(subject)
	regex.match(_config.component_requester.username_pattern, name)
	_config.component_requester.group in _identity(subject).groups
	_in_component_namespace(name)
}

# The namespaces of Ichor's own ServiceAccounts, as Go names them; none named (a hand-made
# input, the CLI's own check, a manager before them), any. A value that is not a list of
# names, one at least, names none.
_component_namespaces_named if object.get(input, ["settings", "component_namespaces"], null) != null

_in_component_namespace(_) if not _component_namespaces_named

_in_component_namespace(name) if {
	_component_namespaces_listed
	split(name, ":")[2] in input.settings.component_namespaces
}

_component_namespaces_said := "" if not _component_namespaces_named

_component_namespaces_said := sprintf(" (of namespace %s)", [concat(", ", input.settings.component_namespaces)]) if {
	_component_namespaces_listed
}

_component_namespaces_said := " (of no namespace: settings.component_namespaces names none)" if {
	_component_namespaces_named
	not _component_namespaces_listed
}

_component_namespaces_listed if {
	is_array(input.settings.component_namespaces)
	count(input.settings.component_namespaces) > 0
	every n in input.settings.component_namespaces {
		is_string(n)
	}
}

# The bindings of the input, as Go listed them (Ichor's label), that are this identity's:
# the identity, ":" and a nonce, to the role the purpose binds. A longer name that merely
# starts with the identity is another person's (their plain username goes on after ours).
# A binding of that name to another role is nobody's: whoever may create a binding may bind
# a role whose permissions they hold without `bind`, so such a binding carries no power its
# maker lacked, and counting it would let them refuse the person at will. Only holders of
# `bind` on the purpose's role (cluster-admin) can make one that counts.
_bindings_of(identity, role) := [binding |
	some binding in _list_or_empty(object.get(_admin_facts, "bindings", []))
	is_string(binding.name)
	startswith(binding.name, concat("", [identity, ":"]))
	regex.match(_config.person_identity.nonce_pattern, substring(binding.name, count(identity) + 1, -1))
	binding.role_ref == _role_ref(role)
]

_role_ref(role) := {"api_group": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}

default _admin_facts := {}

_admin_facts := input.admin_identity if is_object(input.admin_identity)

# What an intact binding of the identity holds: the built-in cluster-admin role, and its own
# group (the binding's name) as the only subject.
_intact(binding, role) if {
	binding.role_ref == _role_ref(role)
	binding.subjects == [{"api_group": "rbac.authorization.k8s.io", "kind": "Group", "name": binding.name}]
}

# METADATA
# title: Admin binding altered
# description: |
#   The person already has an Ichor admin binding (named after their identity, to
#   cluster-admin) that no longer grants cluster-admin to its own group alone: someone who
#   holds `bind` on cluster-admin changed its subjects. Ichor neither reuses nor repairs it,
#   since either would hand power to what was added; revoke it (`ichor cluster admins revoke
#   USER`) and ask again. A binding of that name to another role is not the person's and is
#   ignored (anyone who may create bindings could make one). Checked before signing.
# custom:
#   code: AdminBindingAltered
_admin_binding_refusals contains reason if {
	some binding in _bindings_of(_requester_identity, _binding_role)
	not _intact(binding, _binding_role)
	reason := {
		"code": "AdminBindingAltered",
		"message": sprintf(
			concat("", [
				"the ClusterRoleBinding %q of %q no longer grants exactly %s to its own group; ",
				"revoke it with `ichor cluster admins revoke %s` and ask again",
			]),
			[binding.name, _subject_name(_requester), _binding_role, _subject_name(_requester)],
		),
	}
}

# METADATA
# title: Admin binding nonce invalid
# description: |
#   The person has no binding yet and the nonce Go drew for a new one is not ten lowercase
#   letters or digits, so the binding's name would not be the identity's alone. A bug or a
#   tampered input, never a person's doing; nothing is signed. Checked before signing.
# custom:
#   code: AdminBindingNonceInvalid
_admin_binding_refusals contains reason if {
	count(_bindings_of(_requester_identity, _binding_role)) == 0
	not _nonce_valid
	reason := {
		"code": "AdminBindingNonceInvalid",
		"message": sprintf(
			"the nonce %v for a new admin binding is not ten lowercase letters or digits",
			[object.get(_admin_facts, "nonce", null)],
		),
	}
}

_nonce_valid if regex.match(_config.person_identity.nonce_pattern, _admin_facts.nonce)

# Only for a purpose whose identity has a binding (admin), and a requester with a name.
_requester_identity := identity if {
	_binding_role
	identity := _person_identity(_config.purposes[_request.purpose], _subject_name(_requester))
}

# The role a purpose's person binding grants; undefined for a purpose without one.
_binding_role := _config.person_identity.binding_roles[_config.purposes[_request.purpose].identity]

# The binding the certificate's group is: the person's intact one if they have one (the
# first by name, if a race made two), else a new one named with the nonce.
_admin_binding := {
	"name": name,
	"group": name,
	"cluster_role": _binding_role,
	"username": _subject_name(_requester),
	"identity": _requester_identity,
	"create": count(existing) == 0,
} if {
	existing := sort([binding.name |
		some binding in _bindings_of(_requester_identity, _binding_role)
		_intact(binding, _binding_role)
	])
	name := _first_or_new(existing, concat("", [_requester_identity, ":", object.get(_admin_facts, "nonce", "")]))
}

_first_or_new(names, _) := names[0] if count(names) > 0

_first_or_new(names, new) := new if count(names) == 0
