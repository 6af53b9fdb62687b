package ichor.rbac_test

import data.ichor.rbac

# The manifests as the chart renders them: the manager's ClusterRole (objects[1]) holds
# exactly the allowed rights on certificates.k8s.io in rules[1..3], beside rights on other
# groups that this invariant does not judge.
_good := {
	"manager_role": "ichor-manager-role",
	"kubelet_client_approver": true,
	"objects": [
		{
			"apiVersion": "v1",
			"kind": "ServiceAccount",
			"metadata": {"name": "ichor-controller-manager", "namespace": "ichor-system"},
		},
		{
			"apiVersion": "rbac.authorization.k8s.io/v1",
			"kind": "ClusterRole",
			"metadata": {"name": "ichor-manager-role"},
			"rules": [
				{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
				{
					"apiGroups": ["certificates.k8s.io"],
					"resources": ["certificatesigningrequests"],
					"verbs": ["get", "list", "watch"],
				},
				{
					"apiGroups": ["certificates.k8s.io"],
					"resources": ["certificatesigningrequests/approval"],
					"verbs": ["update"],
				},
				{
					"apiGroups": ["certificates.k8s.io"],
					"resources": ["signers"],
					"resourceNames": ["kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"],
					"verbs": ["approve"],
				},
				{
					"apiGroups": ["ichor.dev"],
					"resources": ["talosclusters", "talosmachines"],
					"verbs": ["get", "list", "watch", "update", "patch"],
				},
			],
		},
		{
			"apiVersion": "rbac.authorization.k8s.io/v1",
			"kind": "ClusterRoleBinding",
			"metadata": {"name": "ichor-manager-rolebinding"},
			"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ichor-manager-role"},
			"subjects": [{"kind": "ServiceAccount", "name": "ichor-controller-manager", "namespace": "ichor-system"}],
		},
		{
			"apiVersion": "rbac.authorization.k8s.io/v1",
			"kind": "Role",
			"metadata": {"name": "ichor-leader-election-role", "namespace": "ichor-system"},
			"rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}],
		},
	],
}

_violations(patch) := violations if {
	violations := rbac.violations with input as json.patch(_good, patch)
}

_codes(patch) := [v.code | some v in _violations(patch)]

# Replaces the manager role's rule at index i (objects[1].rules[i]).
_rule(i, rule) := [{"op": "replace", "path": sprintf("/objects/1/rules/%d", [i]), "value": rule}]

# Adds a rule to the manager role; it becomes rules[5].
_add_rule(rule) := [{"op": "add", "path": "/objects/1/rules/-", "value": rule}]

_certificates(resources, verbs) := {
	"apiGroups": ["certificates.k8s.io"],
	"resources": resources,
	"verbs": verbs,
}

_signers(names) := {
	"apiGroups": ["certificates.k8s.io"],
	"resources": ["signers"],
	"resourceNames": names,
	"verbs": ["approve"],
}

_where(i, rule) := sprintf(`ClusterRole "ichor-manager-role" (objects[1]) rules[%d] %v`, [i, rule])

_not_held(i, rule, verb, resource) := sprintf(
	"%s: grants %q on %q in certificates.k8s.io, which the manager may not hold",
	[_where(i, rule), verb, resource],
)

# --- what holds ---

test_exact_allowed_role_has_no_violations if count(_violations([])) == 0

test_narrower_role_has_no_violations if {
	count(_violations(array.concat(
		_rule(1, _certificates(["certificatesigningrequests"], ["get"])),
		_rule(3, _signers(["kubernetes.io/kubelet-serving"])),
	))) == 0
}

test_allowed_rights_split_across_rules_have_no_violations if {
	count(_violations(array.concat(
		_rule(1, _certificates(["certificatesigningrequests"], ["get", "list"])),
		_add_rule(_certificates(["certificatesigningrequests"], ["watch"])),
	))) == 0
}

test_resource_names_on_unrestricted_resources_are_fine if {
	rule := object.union(_certificates(["certificatesigningrequests"], ["get"]), {"resourceNames": ["csr-1"]})
	count(_violations(_rule(1, rule))) == 0
}

test_rule_without_verbs_grants_nothing if {
	count(_violations(_add_rule({"apiGroups": ["certificates.k8s.io"], "resources": ["signers"]}))) == 0
}

test_other_api_groups_are_not_this_invariants_business if {
	count(_violations(_add_rule({"apiGroups": ["", "apps"], "resources": ["*"], "verbs": ["*"]}))) == 0
}

test_other_cluster_roles_are_not_checked if {
	other := {
		"apiVersion": "rbac.authorization.k8s.io/v1",
		"kind": "ClusterRole",
		"metadata": {"name": "csr-signer"},
		"rules": [_certificates(["signers"], ["sign"])],
	}
	count(_violations([{"op": "add", "path": "/objects/-", "value": other}])) == 0
}

# --- each forbidden right ---

test_sign_is_caught if {
	rule := object.union(_signers(["kubernetes.io/kubelet-serving"]), {"verbs": ["approve", "sign"]})
	_violations(_rule(3, rule)) == {{
		"code": "RightNotAllowed",
		"message": sprintf(
			`%s: grants "sign" on "signers" in certificates.k8s.io, which the manager may not hold`,
			[_where(3, rule)],
		),
	}}
}

test_create_is_caught if {
	rule := _certificates(["certificatesigningrequests"], ["create", "get", "list", "watch"])
	_violations(_rule(1, rule)) == {{
		"code": "RightNotAllowed",
		"message": sprintf(
			`%s: grants "create" on "certificatesigningrequests" in certificates.k8s.io, which the manager may not hold`,
			[_where(1, rule)],
		),
	}}
}

test_delete_is_caught if {
	_codes(_add_rule(_certificates(["certificatesigningrequests"], ["delete", "deletecollection"]))) == [
		"RightNotAllowed",
		"RightNotAllowed",
	]
}

test_status_update_is_caught if {
	rule := _certificates(["certificatesigningrequests/status"], ["update"])
	_violations(_add_rule(rule)) == {{
		"code": "RightNotAllowed",
		"message": sprintf(
			`%s: grants "update" on "certificatesigningrequests/status" in certificates.k8s.io, which the manager may not hold`,
			[_where(5, rule)],
		),
	}}
}

test_patch_on_approval_is_caught if {
	_codes(_rule(2, _certificates(["certificatesigningrequests/approval"], ["update", "patch"]))) == ["RightNotAllowed"]
}

test_combined_resources_grant_their_cross_product if {
	# get on approval and update on the requests themselves come with this rule.
	rule := _certificates(
		["certificatesigningrequests", "certificatesigningrequests/approval"],
		["get", "list", "watch", "update"],
	)
	{v.message | some v in _violations(_rule(1, rule))} == {
		_not_held(1, rule, "update", "certificatesigningrequests"),
		_not_held(1, rule, "get", "certificatesigningrequests/approval"),
		_not_held(1, rule, "list", "certificatesigningrequests/approval"),
		_not_held(1, rule, "watch", "certificatesigningrequests/approval"),
	}
}

test_another_signer_is_caught if {
	rule := _signers(["kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client"])
	_violations(_rule(3, rule)) == {{
		"code": "ResourceNameNotAllowed",
		"message": sprintf(
			concat("", [
				`%s: grants "approve" on "signers" with resourceName "kubernetes.io/kube-apiserver-client" `,
				`in certificates.k8s.io, which is not within `,
				`["kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving"]`,
			]),
			[_where(3, rule)],
		),
	}}
}

test_domain_wildcard_signer_is_caught if {
	# The apiserver honours "<domain>/*" as every signer of the domain.
	_codes(_rule(3, _signers(["kubernetes.io/*"]))) == ["ResourceNameNotAllowed"]
}

test_missing_resource_names_is_caught if {
	rule := _certificates(["signers"], ["approve"])
	_violations(_rule(3, rule)) == {{
		"code": "ResourceNamesMissing",
		"message": sprintf(
			concat("", [
				`%s: grants "approve" on every "signers" in certificates.k8s.io; resourceNames must be within `,
				`["kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving"]`,
			]),
			[_where(3, rule)],
		),
	}}
}

test_empty_resource_names_is_caught if {
	_codes(_rule(3, _signers([]))) == ["ResourceNamesMissing"]
}

test_wildcard_verb_is_caught if {
	rule := object.union(_signers(["kubernetes.io/kubelet-serving"]), {"verbs": ["*"]})
	_violations(_rule(3, rule)) == {{
		"code": "RightNotAllowed",
		"message": sprintf(
			`%s: grants "*" on "signers" in certificates.k8s.io, which the manager may not hold`,
			[_where(3, rule)],
		),
	}}
}

test_wildcard_resource_is_caught if {
	_codes(_rule(1, _certificates(["*"], ["get", "list", "watch"]))) == [
		"RightNotAllowed",
		"RightNotAllowed",
		"RightNotAllowed",
	]
}

test_wildcard_subresource_is_caught if {
	_codes(_rule(2, _certificates(["*/approval"], ["update"]))) == ["RightNotAllowed"]
}

test_wildcard_group_is_caught if {
	rule := {"apiGroups": ["*"], "resources": ["configmaps"], "verbs": ["get"]}
	_violations(_add_rule(rule)) == {{
		"code": "WildcardAPIGroup",
		"message": sprintf(
			`%s: apiGroups "*" includes certificates.k8s.io; name the API groups the rule is for`,
			[_where(5, rule)],
		),
	}}
}

test_wildcard_group_beside_certificates_group_is_caught_for_both if {
	rule := {"apiGroups": ["*", "certificates.k8s.io"], "resources": ["signers"], "verbs": ["sign"]}
	{v.code | some v in _violations(_add_rule(rule))} == {"RightNotAllowed", "WildcardAPIGroup"}
}

test_every_violation_is_reported if {
	_codes(array.concat(
		_rule(3, _certificates(["signers"], ["approve", "sign"])),
		_add_rule({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
	)) == ["ResourceNamesMissing", "RightNotAllowed", "WildcardAPIGroup"]
}

# --- the role itself ---

test_missing_role_is_a_violation if {
	v := rbac.violations with input as {"manager_role": "ichor-manager-role", "objects": []}
	v == {{
		"code": "ManagerRoleMissing",
		"message": concat("", [
			`no ClusterRole "ichor-manager-role" (rbac.authorization.k8s.io/v1) among the 0 objects; `,
			"the manager's rights cannot be checked",
		]),
	}}
}

test_wrong_role_name_is_a_violation if {
	_codes(_rule_name("ichor-manager")) == ["ManagerRoleMissing"]
}

test_namespaced_role_of_that_name_does_not_count if {
	_codes([{"op": "replace", "path": "/objects/1/kind", "value": "Role"}]) == ["ManagerRoleMissing"]
}

test_cluster_role_of_another_api_group_does_not_count if {
	_codes([{"op": "replace", "path": "/objects/1/apiVersion", "value": "example.com/v1"}]) == ["ManagerRoleMissing"]
}

test_aggregated_role_is_a_violation if {
	selector := {"clusterRoleSelectors": [{"matchLabels": {"ichor.dev/aggregate-to-manager": "true"}}]}
	_violations([{"op": "add", "path": "/objects/1/aggregationRule", "value": selector}]) == {{
		"code": "ManagerRoleAggregated",
		"message": concat("", [
			`ClusterRole "ichor-manager-role" (objects[1]) has an aggregationRule `,
			`{"clusterRoleSelectors": [{"matchLabels": {"ichor.dev/aggregate-to-manager": "true"}}]}; `,
			"its rules would be whatever ClusterRoles it selects",
		]),
	}}
}

test_every_role_of_the_name_is_checked if {
	second := {
		"apiVersion": "rbac.authorization.k8s.io/v1",
		"kind": "ClusterRole",
		"metadata": {"name": "ichor-manager-role"},
		"rules": [_certificates(["certificatesigningrequests"], ["create"])],
	}
	v := _violations([{"op": "add", "path": "/objects/-", "value": second}])
	[m.message | some m in v] == [concat("", [
		`ClusterRole "ichor-manager-role" (objects[4]) rules[0] `,
		`{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create"]}: `,
		`grants "create" on "certificatesigningrequests" in certificates.k8s.io, which the manager may not hold`,
	])]
}

_rule_name(name) := [{"op": "replace", "path": "/manager_role", "value": name}]

# --- RBAC follows the features ---

test_client_signer_without_the_client_approver_is_caught if {
	rule := _signers(["kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"])
	_violations([{"op": "replace", "path": "/kubelet_client_approver", "value": false}]) == {{
		"code": "SignerNotEnabled",
		"message": sprintf(
			concat("", [
				`%s: grants "approve" on signer "kubernetes.io/kube-apiserver-client-kubelet", `,
				"whose approver is off (input kubelet_client_approver is not true)",
			]),
			[_where(3, rule)],
		),
	}}
	_codes([{"op": "remove", "path": "/kubelet_client_approver"}]) == ["SignerNotEnabled"]
}

test_serving_signer_alone_holds_without_the_client_approver if {
	count(_violations(array.concat(
		[{"op": "replace", "path": "/kubelet_client_approver", "value": false}],
		_rule(3, _signers(["kubernetes.io/kubelet-serving"])),
	))) == 0
}
