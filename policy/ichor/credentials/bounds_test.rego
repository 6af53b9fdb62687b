package ichor.credentials_test

import data.ichor.credentials

# The source documents' bounds hold whatever a bundle's table says (review 210): a table
# with a longer cap, or an admin purpose carrying system:masters, signs nothing beyond them.

# The shipped table with changes applied, as another bundle might have it.
_table_with(patch) := json.patch(credentials.config, patch)

test_no_table_makes_an_admin_kubeconfig_live_past_a_year if {
	config := _table_with([{
		"op": "replace",
		"path": "/purposes/kubeconfig-admin/max_lifetime_seconds",
		"value": 2 * _one_year,
	}])
	admitted := _admit_purpose("kubeconfig-admin", _ttl(_one_year)) with credentials.config as config
	admitted.allowed
	d := _admit_purpose("kubeconfig-admin", _ttl(2 * _one_year)) with credentials.config as config
	_codes(d) == ["LifetimeTooLong"]
	contains(d.reasons[0].message, "is above the cap of 8760h0m0s")
	issued := _issue_purpose("kubeconfig-admin", _issue_ttl(2 * _one_year)) with credentials.config as config
	_codes(issued) == ["LifetimeTooLong"]
}

test_a_table_without_a_cap_is_capped_at_a_year if {
	config := _table_with([{"op": "remove", "path": "/purposes/kubeconfig-admin/max_lifetime_seconds"}])
	d := _admit_purpose("kubeconfig-admin", _ttl(_one_year + 1)) with credentials.config as config
	_codes(d) == ["LifetimeTooLong"]
}

test_no_table_makes_a_talosconfig_reader_live_past_twelve_hours if {
	config := _table_with([{"op": "replace", "path": "/purposes/talosconfig-reader/max_lifetime_seconds", "value": 86400}])
	admitted := _admit(_ttl(43200)) with credentials.config as config
	admitted.allowed
	d := _admit(_ttl(43201)) with credentials.config as config
	_codes(d) == ["LifetimeTooLong"]
	contains(d.reasons[0].message, "is above the cap of 12h0m0s")
}

test_no_table_gives_an_admin_kubeconfig_system_masters if {
	every groups in [["system:masters"], "system:masters"] {
		config := _table_with([{"op": "add", "path": "/purposes/kubeconfig-admin/groups", "value": groups}])
		d := _admit_purpose("kubeconfig-admin", []) with credentials.config as config
		"GrantNotAllowed" in _codes(d)
		issued := _issue_purpose("kubeconfig-admin", []) with credentials.config as config
		"GrantNotAllowed" in _codes(issued)
	}
}

test_the_grant_not_allowed_says_what_and_why if {
	config := _table_with([{"op": "add", "path": "/purposes/kubeconfig-admin/groups", "value": ["system:masters"]}])
	d := _admit_purpose("kubeconfig-admin", []) with credentials.config as config
	d.reasons[0].message == concat("", [
		`purpose "kubeconfig-admin" would carry the group system:masters, `,
		"which only the break-glass kubeconfig-super-admin may",
	])
}

test_no_table_makes_an_ichor_call_identity_live_past_fifteen_minutes if {
	every purpose in ["node-reader", "support-bundle", "etcd-snapshot", "packet-capture"] {
		config := _table_with([{
			"op": "replace",
			"path": sprintf("/purposes/%s/max_lifetime_seconds", [purpose]),
			"value": _one_year,
		}])
		d := _admit_purpose(purpose, _ttl(901)) with credentials.config as config
		_codes(d) == ["LifetimeTooLong"]
	}
}

# A cap that is not a number caps at nothing: "100" would otherwise order above the bound.
test_a_cap_that_is_not_a_number_admits_nothing if {
	every cap in ["100", [], {}] {
		config := _table_with([{"op": "replace", "path": "/purposes/talosconfig-reader/max_lifetime_seconds", "value": cap}])
		d := _admit(_ttl(60)) with credentials.config as config
		_codes(d) == ["LifetimeTooLong"]
	}
}

test_no_table_makes_a_talosconfig_reader_more_than_os_reader if {
	every patch in [
		[{"op": "replace", "path": "/purposes/talosconfig-reader/talos_role", "value": "os:admin"}],
		[{"op": "replace", "path": "/purposes/talosconfig-reader/authorization/verb", "value": "get"}],
		[{"op": "replace", "path": "/purposes/talosconfig-reader/authorization/subresource", "value": "status"}],
	] {
		d := _admit([]) with credentials.config as _table_with(patch)
		"GrantNotAllowed" in _codes(d)
	}
}

# The break-glass kubeconfig is granted by its own permission, whatever the table says:
# another would hand system:masters to whoever holds that one.
test_no_table_grants_the_break_glass_kubeconfig_by_another_permission if {
	config := _table_with([{
		"op": "replace",
		"path": "/purposes/kubeconfig-super-admin/authorization/subresource",
		"value": "talosconfig-reader",
	}])
	d := _admit_purpose("kubeconfig-super-admin", []) with credentials.config as config
	"GrantNotAllowed" in _codes(d)
}

test_the_break_glass_kubeconfig_keeps_system_masters if {
	_admit_purpose("kubeconfig-super-admin", []).allowed
}

# Each purpose is granted by its own permission and grants its own credential, whatever the
# table says: re-pointed, an os:admin talosconfig for a year went to whoever may download a
# talosconfig-reader (review 213).
test_no_table_repoints_or_widens_a_purpose if {
	every purpose, change in {
		"credentials-talos": ["authorization/subresource", "talosconfig-reader"],
		"kubeconfig-admin": ["identity", "super-admin"],
		"etcd-snapshot": ["talos_role", "os:admin"],
	} {
		patch := {"op": "replace", "path": sprintf("/purposes/%s/%s", [purpose, change[0]]), "value": change[1]}
		d := _admit_purpose(purpose, []) with credentials.config as _table_with([patch])
		"GrantNotAllowed" in _codes(d)
	}
}

test_no_table_offers_an_ichor_call_identity_to_people if {
	config := _table_with([{"op": "replace", "path": "/purposes/packet-capture/for_people", "value": true}])
	d := _admit_purpose("packet-capture", []) with credentials.config as config
	"GrantNotAllowed" in _codes(d)
}

# Who is a ServiceAccount, the groups of the Kubernetes credentials and the prefix that names
# their person are fixed too (review 214): a table that took any user for a ServiceAccount
# handed a person packet-capture's os:operator; one that named admins system:node:... in
# system:nodes made a credential the Node authorizer accepts after its binding is deleted.
test_no_table_widens_who_is_a_service_account if {
	config := _table_with([{"op": "replace", "path": "/component_requester/username_pattern", "value": "^.*$"}])
	d := _admit_purpose("packet-capture", []) with credentials.config as config
	"GrantNotAllowed" in _codes(d)
}

test_no_table_gives_the_kubernetes_credentials_other_groups_or_names if {
	every case in [
		["kubeconfig-admin", {"op": "add", "path": "/purposes/kubeconfig-admin/groups", "value": ["ichor:operators"]}],
		["kubeconfig-super-admin", {"op": "replace", "path": "/purposes/kubeconfig-super-admin/groups", "value": []}],
		["kubeconfig-admin", {"op": "replace", "path": "/person_identity/prefixes/admin", "value": "system:node:"}],
	] {
		d := _admit_purpose(case[0], []) with credentials.config as _table_with([case[1]])
		"GrantNotAllowed" in _codes(d)
	}
}

test_a_purpose_the_api_does_not_have_is_not_granted if {
	config := _table_with([{"op": "add", "path": "/purposes/talos-admin", "value": object.union(
		_purposes["talosconfig-reader"],
		{"talos_role": "os:admin"},
	)}])
	d := _admit([{"op": "replace", "path": "/request/purpose", "value": "talos-admin"}]) with credentials.config as config
	"GrantNotAllowed" in _codes(d)
}

# Review 215: a one-digit digest gave two people one identity and one binding; an identity on
# a Talos purpose asked for an admin binding.
test_no_table_shortens_the_digest_that_names_a_person if {
	every length in [1, 0, "36"] {
		config := _table_with([{"op": "replace", "path": "/person_identity/hash_length", "value": length}])
		d := _admit_purpose("kubeconfig-admin", []) with credentials.config as config
		"GrantNotAllowed" in _codes(d)
	}
}

# Review 239 F1: a table that kept longer names plain named a person otherwise than
# `ichor cluster admins revoke`, which reads the rule built into the binary.
test_no_table_changes_which_names_are_kept_plain if {
	every length in [64, 8, null] {
		config := _table_with([{"op": "replace", "path": "/person_identity/plain_max_length", "value": length}])
		d := _admit_purpose("kubeconfig-admin", []) with credentials.config as config
		"GrantNotAllowed" in _codes(d)
	}
}

test_no_table_gives_a_talos_purpose_an_identity if {
	config := _table_with([{"op": "add", "path": "/purposes/talosconfig-reader/identity", "value": "admin"}])
	d := _admit([]) with credentials.config as config
	"GrantNotAllowed" in _codes(d)
}
