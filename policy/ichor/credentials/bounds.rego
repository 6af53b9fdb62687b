package ichor.credentials

# METADATA
# title: Lifetime above the cap
# description: |
#   The lifetime (spec.ttl, else the purpose's default) is longer than the purpose's cap. It
#   is refused, never shortened, so that nobody holds a credential that lives other than they
#   asked. The default is checked too, so a table whose default exceeds its cap signs nothing.
#   The cap is the table's (one that is not a number caps at nothing), and never above the
#   source documents' whatever the table says: 12 hours for a talosconfig-reader, 15 minutes
#   for the identities of one Ichor call (node-reader, support-bundle, etcd-snapshot,
#   packet-capture; ADR 0124), a year for any credential (KEP-4214). Checked at admission and
#   again before signing.
# custom:
#   code: LifetimeTooLong
_lifetime_too_long(request, purposes) := {reason |
	bound := _lifetime_bound(request.purpose)
	limit := min([_table_cap(purposes[request.purpose], bound), bound])
	lifetime := _lifetime(request, purposes)
	lifetime > limit
	reason := {
		"code": "LifetimeTooLong",
		"message": sprintf(
			"the lifetime %s is above the cap of %s for purpose %q; it is refused, not shortened",
			[_duration(lifetime), _duration(limit), request.purpose],
		),
	}
}

# The table's cap; the bound when it has none, and nothing when it is not a number (a
# string orders above every number, and would have left the bound alone).
_table_cap(purpose, bound) := cap if {
	cap := object.get(purpose, "max_lifetime_seconds", bound)
	is_number(cap)
} else := 0

# The caps the source documents set. Literal on purpose, not from data: a bundle's data can
# be replaced, these bounds cannot (review 210: a table with a two-year cap signed for two
# years; review 212: one with a year for packet-capture, os:operator, signed a year).
_lifetime_bound(purpose) := 43200 if {
	purpose == "talosconfig-reader"
} else := 900 if {
	purpose in {"node-reader", "support-bundle", "etcd-snapshot", "packet-capture"}
} else := 31536000

# METADATA
# title: Grant not allowed
# description: |
#   The table's purpose would grant what it may not, whatever the table says: system:masters,
#   which authorization never checks and no RBAC can revoke, in any credential but the
#   break-glass kubeconfig (kubeconfig-super-admin, KEP-4214: the admin kubeconfig is bound to
#   a group RBAC can revoke); groups that are not a list; another kind, Talos role or identity
#   than the purpose's (a talosconfig-reader is Talos os:reader, ADR 0124; Ichor offers a
#   person no os:operator talosconfig); a purpose granted by another permission than its own
#   (the verb on its own subresource of talosclusters: another would hand the credential to
#   whoever holds that one); one of the identities of one Ichor call (node-reader,
#   support-bundle, etcd-snapshot, packet-capture) offered to people, or to requesters other
#   than ServiceAccounts; an admin kubeconfig with groups of its own or the break-glass one
#   with others than system:masters, or either naming its person under another prefix than
#   Ichor's (a certificate named system:node:... is a node's) or by a shorter digest (two
#   people would share one identity); or a purpose the
#   TalosCredentialRequest API does not have. Literal on purpose, not from data, as the
#   lifetime's bounds; the table keeps what is the operator's (defaults, caps below the
#   bounds, the role an admin's binding grants, descriptions, Events). Checked at admission
#   and again before signing.
# custom:
#   code: GrantNotAllowed
_grant_not_allowed(request, config) := {reason |
	purpose := config.purposes[request.purpose]
	some problem in (_grant_problems(request.purpose, purpose) | _table_problems(request.purpose, config))
	reason := {
		"code": "GrantNotAllowed",
		"message": sprintf("purpose %q would %s", [request.purpose, problem]),
	}
}

_grant_problems(name, purpose) := (({problem |
	name != "kubeconfig-super-admin"
	"system:masters" in _groups_of(purpose)
	problem := "carry the group system:masters, which only the break-glass kubeconfig-super-admin may"
} | {problem |
	not is_array(object.get(purpose, "groups", []))
	problem := sprintf("carry the groups %v, which are not a list", [purpose.groups])
}) | {problem |
	want := _fixed_grants[name]

	# Every key of a grant, not only the purpose's own: an identity on a Talos purpose would
	# ask for an admin binding (review 215).
	got := object.filter(purpose, ["kind", "talos_role", "identity", "authorization"])
	got != want
	problem := sprintf("grant %v, where its grant is %v", [got, want])
}) | {problem |
	name in _one_call_identities
	object.get(purpose, "for_people", false) != false
	problem := "be offered to people, and it is an identity of one Ichor call"
}

# What the table says around the purposes that the source documents fix too, a function a
# part (each within Regal's external-reference bound).
_table_problems(name, config) := union({
	_purpose_problems(name),
	_requester_problems(name, config),
	_groups_problems(name, config),
	_prefix_problems(name, config),
	_hash_problems(name, config),
})

_purpose_problems(name) := {problem |
	not _fixed_grants[name]
	problem := "be issued, and the TalosCredentialRequest API has no such purpose"
}

_requester_problems(name, config) := {problem |
	name in _one_call_identities
	got := object.filter(object.get(config, "component_requester", {}), ["username_pattern", "group"])
	got != _ichor_service_accounts
	problem := sprintf(
		"be issued to the requesters %v, and it is issued to ServiceAccounts only (%v)",
		[got, _ichor_service_accounts],
	)
}

_groups_problems(name, config) := {problem |
	want := _fixed_groups[name]
	got := object.get(config.purposes[name], "groups", [])
	got != want
	problem := sprintf("carry the groups %v, where it carries %v", [got, want])
}

_prefix_problems(name, config) := {problem |
	identity := _fixed_grants[name].identity
	got := object.get(config, ["person_identity", "prefixes", identity], null)
	want := _person_prefixes[identity]
	got != want
	problem := sprintf("name its person under the prefix %v, where Ichor's is %q", [got, want])
}

# The digits of a person's name's digest in a Kubernetes credential: fewer would let two
# people share one identity, one binding and one revocation (review 215: one digit did).
# And the longest name kept plain: `ichor cluster admins revoke` names a person with the
# rule built into the binary, so a table that kept longer names plain gave a person
# bindings under two names, and a revocation that found one of them said it was done
# (review 239 F1).
_hash_problems(name, config) := {problem |
	name in {"kubeconfig-admin", "kubeconfig-super-admin"}
	some field, want in {"hash_length": 36, "plain_max_length": 36}
	got := object.get(config, ["person_identity", field], null)
	got != want
	problem := sprintf("name its person by %v (%s), where Ichor's is %v", [got, field, want])
}

# Who the identities of one Ichor call are issued to: a ServiceAccount.
_ichor_service_accounts := {
	"username_pattern": `^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`,
	"group": "system:serviceaccounts",
}

# The groups of the Kubernetes purposes: the admin's own binding group is added at issuance.
_fixed_groups := {"kubeconfig-admin": [], "kubeconfig-super-admin": ["system:masters"]}

_person_prefixes := {"admin": "ichor-admin:", "super-admin": "ichor-super-admin:"}

_groups_of(purpose) := groups if {
	groups := object.get(purpose, "groups", [])
	is_array(groups)
} else := [purpose.groups]

_one_call_identities := {"node-reader", "support-bundle", "etcd-snapshot", "packet-capture"}

# What each purpose grants, and by which permission (the verb on its own subresource of
# talosclusters). Written out whole: a value built by calls is built again in every decision
# (0.1 ms of the admission decision's 0.78 in the engine), a literal is not.
_fixed_grants := {
	"talosconfig-reader": {
		"kind": "talos", "talos_role": "os:reader",
		"authorization": {
			"verb": "download", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "talosconfig-reader",
		},
	},
	"node-reader": {
		"kind": "talos", "talos_role": "os:reader",
		"authorization": {
			"verb": "issue", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "node-reader",
		},
	},
	"support-bundle": {
		"kind": "talos", "talos_role": "os:reader",
		"authorization": {
			"verb": "issue", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "support-bundle",
		},
	},
	"etcd-snapshot": {
		"kind": "talos", "talos_role": "os:etcd:backup",
		"authorization": {
			"verb": "issue", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "etcd-snapshot",
		},
	},
	"packet-capture": {
		"kind": "talos", "talos_role": "os:operator",
		"authorization": {
			"verb": "issue", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "packet-capture",
		},
	},
	"credentials-talos": {
		"kind": "talos", "talos_role": "os:admin",
		"authorization": {
			"verb": "download", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "credentials",
		},
	},
	"kubeconfig-admin": {
		"kind": "kubernetes", "identity": "admin",
		"authorization": {
			"verb": "download", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "kubeconfig-admin",
		},
	},
	"kubeconfig-super-admin": {
		"kind": "kubernetes", "identity": "super-admin",
		"authorization": {
			"verb": "download", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "kubeconfig-super-admin",
		},
	},
}
