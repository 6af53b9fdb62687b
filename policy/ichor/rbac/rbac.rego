# METADATA
# title: Manager RBAC on certificates.k8s.io
# description: |
#   The least-privilege invariant of ADR 0125 over the generated manifests (the chart's
#   and config/rbac's). The manager's ClusterRole may hold on the API group
#   certificates.k8s.io exactly what approving kubelet CSRs needs, as listed in data:
#   get, list and watch on certificatesigningrequests; update on
#   certificatesigningrequests/approval; approve on signers, with resourceNames within the
#   two kubelet signers. Anything else there is a violation: sign (which would let the
#   manager issue certificates itself), create, delete, update on
#   certificatesigningrequests/status, another signer, approve on signers without
#   resourceNames (every signer), and any wildcard verb, resource or API group.
#
#   Only the manager's ClusterRole is checked, and on it only rules that name
#   certificates.k8s.io or the wildcard group; rights on other API groups are not this
#   invariant's business. A missing manager role is a violation, since an invariant that
#   found nothing to check must not pass.
#
#   RBAC follows the features: approve on a signer whose approver is optional (the kubelet
#   client approver) is allowed only when the render switches that approver on.
#
#   Input: input.manager_role (the name of the manager's ClusterRole), input.objects
#   (the rendered Kubernetes objects as JSON, of any kind) and input.kubelet_client_approver
#   (whether the render runs the kubelet client approver; absent is false).
package ichor.rbac

# The tables of data.json, beside this file. They sit under "config" because the
# package's own rules share the path data.ichor.rbac.
_config := data.ichor.rbac.config

# METADATA
# title: RBAC violations
# description: |
#   The violations of the invariant, a set of {"code", "message"}; empty when it holds.
#   Each message names the ClusterRole, its index in input.objects, the index of the rule
#   in its rules, the rule itself, and what it grants that it may not.
# entrypoint: true
violations := missing | forbidden

# METADATA
# title: Manager role missing
# description: |
#   No rbac.authorization.k8s.io/v1 ClusterRole has the manager's name, so there is
#   nothing to check: the manifests changed, or the name given is wrong.
# custom:
#   code: ManagerRoleMissing
missing contains violation if {
	count(_manager_roles) == 0
	violation := {
		"code": "ManagerRoleMissing",
		"message": sprintf(
			"no ClusterRole %q (%s) among the %d objects; the manager's rights cannot be checked",
			[input.manager_role, _config.rbac_api_version, count(input.objects)],
		),
	}
}

# METADATA
# title: Manager role aggregated
# description: |
#   The manager's ClusterRole has an aggregationRule. The controller manager then replaces
#   its rules with those of every ClusterRole its selectors match, so what the manifest
#   says is not what the manager holds, and any ClusterRole with a matching label could
#   add rights on certificates.k8s.io.
# custom:
#   code: ManagerRoleAggregated
forbidden contains violation if {
	some i, role in _manager_roles
	role.aggregationRule
	violation := {
		"code": "ManagerRoleAggregated",
		"message": sprintf(
			"ClusterRole %q (objects[%d]) has an aggregationRule %v; its rules would be whatever ClusterRoles it selects",
			[role.metadata.name, i, role.aggregationRule],
		),
	}
}

# METADATA
# title: Wildcard API group
# description: A rule of the manager's ClusterRole with apiGroups "*" applies to certificates.k8s.io too.
# custom:
#   code: WildcardAPIGroup
forbidden contains violation if {
	some i, j
	rule := _rules[i][j]
	"*" in _list(rule, "apiGroups")
	violation := {
		"code": "WildcardAPIGroup",
		"message": sprintf(
			"%s: apiGroups \"*\" includes %s; name the API groups the rule is for",
			[_where(i, j, rule), _config.api_group],
		),
	}
}

# METADATA
# title: Right not allowed
# description: |
#   A rule of the manager's ClusterRole grants on certificates.k8s.io a verb on a resource
#   that data does not allow: sign, create, delete, update on a status subresource, a
#   wildcard verb or resource, or any resource not listed. One violation per verb and
#   resource.
# custom:
#   code: RightNotAllowed
forbidden contains violation if {
	some i, j
	rule := _certificate_rules[i][j]
	some resource in _list(rule, "resources")
	some verb in _list(rule, "verbs")
	not _verb_allowed(resource, verb)
	violation := {
		"code": "RightNotAllowed",
		"message": sprintf(
			"%s: grants %q on %q in %s, which the manager may not hold",
			[_where(i, j, rule), verb, resource, _config.api_group],
		),
	}
}

# METADATA
# title: Resource names missing
# description: |
#   A rule grants an allowed verb on a resource that data restricts to some names (signers),
#   but has no resourceNames: a rule without resourceNames applies to every name, so
#   "approve" on signers without them would approve for every signer.
# custom:
#   code: ResourceNamesMissing
forbidden contains violation if {
	some i, j
	rule := _certificate_rules[i][j]
	some resource in _list(rule, "resources")
	some verb in _list(rule, "verbs")
	_verb_allowed(resource, verb)
	names := _config.allowed_rights[resource].resource_names
	count(_list(rule, "resourceNames")) == 0
	violation := {
		"code": "ResourceNamesMissing",
		"message": sprintf(
			"%s: grants %q on every %q in %s; resourceNames must be within %v",
			[_where(i, j, rule), verb, resource, _config.api_group, names],
		),
	}
}

# METADATA
# title: Resource name not allowed
# description: |
#   A rule grants an allowed verb on a resource that data restricts to some names (signers)
#   for a name that is not among them: another signer, or a pattern such as
#   "kubernetes.io/*", which the apiserver honours for every signer of that domain.
# custom:
#   code: ResourceNameNotAllowed
forbidden contains violation if {
	some i, j
	rule := _certificate_rules[i][j]
	some resource in _list(rule, "resources")
	some verb in _list(rule, "verbs")
	_verb_allowed(resource, verb)
	names := _config.allowed_rights[resource].resource_names
	some name in _list(rule, "resourceNames")
	not name in names
	violation := {
		"code": "ResourceNameNotAllowed",
		"message": sprintf(
			"%s: grants %q on %q with resourceName %q in %s, which is not within %v",
			[_where(i, j, rule), verb, resource, name, _config.api_group, names],
		),
	}
}

# METADATA
# title: Signer of an approver that is off
# description: |
#   A rule grants approve on a signer whose approver the render does not run (the kubelet
#   client approver, switched on by the chart value manager.kubeletClientApprover). A right
#   no running code needs is a right an attacker who takes the manager's token gets for free.
# custom:
#   code: SignerNotEnabled
forbidden contains violation if {
	some i, j
	rule := _certificate_rules[i][j]
	"signers" in _list(rule, "resources")
	"approve" in _list(rule, "verbs")
	some name in _list(rule, "resourceNames")
	switch := _config.optional_signers[name]
	not input[switch] == true
	violation := {
		"code": "SignerNotEnabled",
		"message": sprintf(
			"%s: grants \"approve\" on signer %q, whose approver is off (input %s is not true)",
			[_where(i, j, rule), name, switch],
		),
	}
}

# The manager's ClusterRoles by index in input.objects: normally one, but every object
# with the name is checked, since a later one in a manifest replaces an earlier one.
_manager_roles[i] := obj if {
	some i, obj in input.objects
	obj.kind == "ClusterRole"
	obj.apiVersion == _config.rbac_api_version
	obj.metadata.name == input.manager_role
}

# Every rule of the manager's ClusterRoles that applies to certificates.k8s.io, named or
# by wildcard, keyed by the role's index in input.objects and the rule's index.
_rules[i][j] := rule if {
	some i, role in _manager_roles
	some j, rule in _list(role, "rules")
	some group in _list(rule, "apiGroups")
	group in {_config.api_group, "*"}
}

# The rules that name certificates.k8s.io. A wildcard-group rule is reported once as such
# rather than for every right it would grant.
_certificate_rules[i][j] := rule if {
	some i, j
	rule := _rules[i][j]
	_config.api_group in _list(rule, "apiGroups")
}

_verb_allowed(resource, verb) if verb in _config.allowed_rights[resource].verbs

# A field that is absent grants nothing, as in the apiserver.
_list(obj, key) := object.get(obj, key, [])

_where(i, j, rule) := sprintf(
	"ClusterRole %q (objects[%d]) rules[%d] %v",
	[input.objects[i].metadata.name, i, j, rule],
)
