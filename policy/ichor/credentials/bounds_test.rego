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
	config := _table_with([{"op": "add", "path": "/purposes/kubeconfig-admin/groups", "value": ["system:masters"]}])
	d := _admit_purpose("kubeconfig-admin", []) with credentials.config as config
	_codes(d) == ["GroupNotAllowed"]
	d.reasons[0].message == concat("", [
		`purpose "kubeconfig-admin" would carry the group system:masters, `,
		"which only the break-glass kubeconfig-super-admin may",
	])
	issued := _issue_purpose("kubeconfig-admin", []) with credentials.config as config
	_codes(issued) == ["GroupNotAllowed"]
}

test_the_break_glass_kubeconfig_keeps_system_masters if {
	_admit_purpose("kubeconfig-super-admin", []).allowed
}
