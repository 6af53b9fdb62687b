# The shipped roles of deploy/rbac/roles.yaml against the purpose table in data.json:
# which role holds which verb, and so which credential each may ask for. make policy-test
# loads the file as data.shipped_roles (opa test ... shipped_roles:deploy/rbac/roles.yaml);
# without it these tests fail, rather than pass on no roles. Where a
# check is a set of offenders, a test also breaks a copy of the roles to prove the check
# catches it.
package ichor.credentials_test

_roles[role.metadata.name] := role if {
	some role in data.shipped_roles.items
	role.kind == "ClusterRole"
}

# Every grant of a role, one verb on one resource (with its subresource) of one group.
_grants(role) := {{"group": group, "resource": resource, "verb": verb} |
	some rule in role.rules
	some group in rule.apiGroups
	some resource in rule.resources
	some verb in rule.verbs
}

# The grant that is each purpose's authorization.
_grant_of_purpose[name] := grant if {
	some name, purpose in _purposes
	a := purpose.authorization
	grant := {"group": a.group, "resource": concat("/", [a.resource, a.subresource]), "verb": a.verb}
}

# The purposes a role reaches: those whose authorization it grants.
_purposes_of(role) := {name |
	some name, grant in _grant_of_purpose
	grant in _grants(role)
}

test_the_shipped_roles_are_loaded_and_are_exactly_three if {
	count(data.shipped_roles.items) == 3
	object.keys(_roles) == {"ichor-admin", "ichor-operator", "ichor-viewer"}
}

# Which credentials each role may ask for: a change here is a change of who may hold what.
test_each_role_reaches_exactly_its_purposes if {
	_purposes_of(_roles["ichor-viewer"]) == set()
	_purposes_of(_roles["ichor-operator"]) == {"talosconfig-reader"}
	_purposes_of(_roles["ichor-admin"]) == {"talosconfig-reader", "credentials-talos", "kubeconfig-admin"}
}

test_asking_for_a_credential_is_the_operators_and_the_admins if {
	ask := {
		{"group": "ichor.dev", "resource": "taloscredentialrequests", "verb": "create"},
		{"group": "ichor.dev", "resource": "taloscredentialrequests", "verb": "get"},
	}
	every name in {"ichor-operator", "ichor-admin"} {
		every grant in ask {
			grant in _grants(_roles[name])
		}
	}
}

# Viewers get nothing new (ADR 0124): Ichor's clusters and machines to read, not the
# credential requests, each of which carries its requester's groups and extra.
test_the_viewer_reads_clusters_and_machines_and_nothing_else if {
	_grants(_roles["ichor-viewer"]) == {{"group": "ichor.dev", "resource": resource, "verb": verb} |
		some resource in {"talosclusters", "talosmachines"}
		some verb in {"get", "list", "watch"}
	}
}

test_no_role_grants_a_wildcard_or_a_non_resource_url if {
	_wildcards(_roles) == set()
}

test_the_wildcard_check_catches_one if {
	broken := json.patch(_roles, [{"op": "add", "path": "/ichor-viewer/rules/0/verbs/-", "value": "*"}])
	_wildcards(broken) == {"ichor-viewer"}
}

test_the_wildcard_check_catches_a_non_resource_url if {
	url := {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
	broken := json.patch(_roles, [{"op": "add", "path": "/ichor-admin/rules/-", "value": url}])
	_wildcards(broken) == {"ichor-admin"}
}

_wildcards(roles) := {name |
	some name, role in roles
	some rule in role.rules
	_wildcard_or_url(rule)
}

_wildcard_or_url(rule) if {
	some field in ["apiGroups", "resources", "verbs"]
	"*" in object.get(rule, field, [])
}

_wildcard_or_url(rule) if count(object.get(rule, "nonResourceURLs", [])) > 0

test_no_role_grants_outside_ichor_dev if {
	every role in _roles {
		every grant in _grants(role) {
			grant.group == "ichor.dev"
		}
	}
}

# download is only ever the grant of a purpose for people.
test_every_download_is_the_grant_of_a_purpose_for_people if {
	_stray_downloads(_roles) == set()
}

test_the_download_check_catches_a_component_purpose if {
	rule := {"apiGroups": ["ichor.dev"], "resources": ["talosclusters/node-reader"], "verbs": ["download"]}
	broken := json.patch(_roles, [{"op": "add", "path": "/ichor-operator/rules/-", "value": rule}])
	_stray_downloads(broken) == {"ichor-operator: download talosclusters/node-reader"}
}

_stray_downloads(roles) := {sprintf("%s: download %s", [name, grant.resource]) |
	some name, role in roles
	some grant in _grants(role)
	grant.verb == "download"
	not _download_for_people(grant)
}

_download_for_people(grant) if {
	some purpose, purpose_grant in _grant_of_purpose
	purpose_grant == grant
	_purposes[purpose].for_people
}

# The break-glass kubeconfig (system:masters) is in no shipped role: whoever may have it
# is bound to it by hand, one by one. Every other purpose for people is held by one.
test_every_purpose_for_people_but_break_glass_is_held_by_a_shipped_role if {
	held := {purpose | some role in _roles; some purpose in _purposes_of(role)}
	for_people := {name | some name, purpose in _purposes; purpose.for_people}
	for_people - held == {"kubeconfig-super-admin"}
}

# issue is the verb of Ichor's own components; taloscredentialrequests/status is the
# manager's to write; a request is asked for and read, never changed or removed.
test_no_role_issues_answers_or_changes_a_request if {
	every role in _roles {
		every grant in _grants(role) {
			grant.verb != "issue"
			grant.resource != "taloscredentialrequests/status"
			_request_verb_allowed(grant)
		}
	}
}

_request_verb_allowed(grant) if grant.resource != "taloscredentialrequests"

_request_verb_allowed(grant) if {
	grant.resource == "taloscredentialrequests"
	grant.verb in {"create", "get", "list", "watch"}
}
