# The invariants of the purpose table in data.json: an edit that breaks one fails here,
# before any request is judged by it. Where a check is a set of offenders, a test also
# breaks a copy of the table to prove the check catches it.
package ichor.credentials_test

test_purposes_are_exactly_the_crd_enum if {
	object.keys(_purposes) == {
		"talosconfig-reader", "node-reader", "support-bundle", "etcd-snapshot",
		"packet-capture", "credentials-talos", "kubeconfig-admin", "kubeconfig-super-admin",
	}
}

test_no_purpose_for_people_hands_os_operator_or_os_admin_but_credentials_talos if {
	_people_with_node_power(_purposes) == {"credentials-talos"}
}

test_the_people_check_catches_an_os_operator_talosconfig if {
	broken := json.patch(_purposes, [{"op": "replace", "path": "/talosconfig-reader/talos_role", "value": "os:operator"}])
	_people_with_node_power(broken) == {"credentials-talos", "talosconfig-reader"}
}

_people_with_node_power(purposes) := {name |
	some name, purpose in purposes
	purpose.for_people
	purpose.talos_role in {"os:operator", "os:admin"}
}

test_only_kubeconfig_super_admin_is_system_masters if {
	_system_masters(_purposes) == {"kubeconfig-super-admin"}
}

test_the_system_masters_check_catches_an_admin_kubeconfig_in_it if {
	broken := json.patch(_purposes, [{"op": "add", "path": "/kubeconfig-admin/groups", "value": ["system:masters"]}])
	_system_masters(broken) == {"kubeconfig-admin", "kubeconfig-super-admin"}
}

_system_masters(purposes) := {name |
	some name, purpose in purposes
	"system:masters" in object.get(purpose, "groups", [])
}

test_kubeconfig_admin_has_no_fixed_group_only_its_persons_binding if {
	not _purposes["kubeconfig-admin"].groups
	_purposes["kubeconfig-admin"].identity == "admin"
	_person_identity_config.binding_roles == {"admin": "cluster-admin"}
}

test_every_default_is_positive_and_within_its_cap if {
	every purpose in _purposes {
		is_number(purpose.default_lifetime_seconds)
		purpose.default_lifetime_seconds > 0
		purpose.default_lifetime_seconds <= purpose.max_lifetime_seconds
	}
}

test_no_cap_is_above_one_year if {
	every purpose in _purposes {
		purpose.max_lifetime_seconds <= _one_year
	}
}

test_talosconfig_reader_is_one_hour_capped_at_twelve if {
	_purposes["talosconfig-reader"].default_lifetime_seconds == 3600
	_purposes["talosconfig-reader"].max_lifetime_seconds == 43200
}

test_components_live_ten_to_fifteen_minutes if {
	every purpose in _purposes {
		_ten_to_fifteen_minutes(purpose)
	}
}

_ten_to_fifteen_minutes(purpose) if purpose.for_people

_ten_to_fifteen_minutes(purpose) if {
	not purpose.for_people
	purpose.default_lifetime_seconds >= 600
	purpose.max_lifetime_seconds <= 900
}

test_break_glass_is_short_and_a_warning if {
	every name in _system_masters(_purposes) {
		_purposes[name].max_lifetime_seconds <= 3600
		_purposes[name].event.type == "Warning"
	}
}

test_every_purpose_has_an_authorization_and_an_event if {
	every name, purpose in _purposes {
		object.keys(purpose.authorization) == {"verb", "group", "resource", "subresource"}
		purpose.authorization.group == "ichor.dev"
		purpose.authorization.resource == "talosclusters"
		purpose.authorization.subresource != ""
		purpose.event.type in {"Normal", "Warning"}
		purpose.event.reason != ""
		_requirements(name).event == purpose.event
	}
}

test_people_download_and_components_issue if {
	every purpose in _purposes {
		purpose.authorization.verb == {true: "download", false: "issue"}[purpose.for_people]
	}
}

test_no_two_purposes_share_a_subresource_or_an_event_reason if {
	count({purpose.authorization.subresource | some purpose in _purposes}) == count(_purposes)
	count({purpose.event.reason | some purpose in _purposes}) == count(_purposes)
}

test_every_certificate_is_one_talos_role_or_kubernetes_groups if {
	every purpose in _purposes {
		_certificate_well_formed(purpose)
	}
}

_certificate_well_formed(purpose) if {
	purpose.kind == "talos"
	purpose.talos_role in {"os:reader", "os:etcd:backup", "os:operator", "os:admin"}
	not purpose.groups
	not purpose.common_name
}

# A Kubernetes credential names its person (identity.rego): no fixed common name, and its
# power comes from fixed groups or from the person's own binding.
_certificate_well_formed(purpose) if {
	purpose.kind == "kubernetes"
	not purpose.talos_role
	not purpose.common_name
	_person_identity_config.prefixes[purpose.identity]
	count(object.get(purpose, "groups", [])) + count({1 | _person_identity_config.binding_roles[purpose.identity]}) > 0
}

_person_identity_config := _config.person_identity
