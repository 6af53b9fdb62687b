package ichor.kubeconfig_test

import data.ichor.kubeconfig

# The facts of a kubeconfig like kubectl writes: one cluster with CA data, one user with a
# client certificate and key, one context, current.
_fields := [
	{"path": "apiVersion", "field": "apiVersion"},
	{"path": "clusters", "field": "clusters"},
	{"path": "clusters[0].cluster", "field": "clusters[].cluster"},
	{"path": "clusters[0].cluster.certificate-authority-data", "field": "clusters[].cluster.certificate-authority-data"},
	{"path": "clusters[0].cluster.server", "field": "clusters[].cluster.server"},
	{"path": "clusters[0].name", "field": "clusters[].name"},
	{"path": "contexts", "field": "contexts"},
	{"path": "contexts[0].context", "field": "contexts[].context"},
	{"path": "contexts[0].context.cluster", "field": "contexts[].context.cluster"},
	{"path": "contexts[0].context.user", "field": "contexts[].context.user"},
	{"path": "contexts[0].name", "field": "contexts[].name"},
	{"path": "current-context", "field": "current-context"},
	{"path": "kind", "field": "kind"},
	{"path": "preferences", "field": "preferences"},
	{"path": "users", "field": "users"},
	{"path": "users[0].name", "field": "users[].name"},
	{"path": "users[0].user", "field": "users[].user"},
	{"path": "users[0].user.client-certificate-data", "field": "users[].user.client-certificate-data"},
	{"path": "users[0].user.client-key-data", "field": "users[].user.client-key-data"},
]

_good := {
	"cluster": {"namespace": "tenant", "name": "workload"},
	"settings": {"allow_insecure_skip_tls_verify": false},
	"kubeconfig": {
		"bytes": 5000,
		"max_bytes": 262144,
		"parsed": true,
		"fields": _fields,
		"field_count": count(_fields),
		"unknown_fields": [],
		"contexts": 1,
		"clusters": 1,
		"users": 1,
		"current_context": "admin@workload",
		"context": {
			"name": "admin@workload",
			"cluster": "workload",
			"user": "admin",
			"cluster_found": true,
			"user_found": true,
			"server": {"url": "https://10.0.0.1:6443", "scheme": "https", "host": "10.0.0.1:6443", "user_info": false},
			"ca_data": true,
			"insecure_skip_tls_verify": false,
			"tls_server_name": "",
			"credentials": {"token": false, "client_certificate_data": true, "client_key_data": true},
		},
	},
	"server_identity": {"same_key_as_local": false, "verifies_with_local_ca": false, "local_ca_known": true},
}

_decide(patch) := d if {
	d := kubeconfig.decision with input as json.patch(_good, patch)
}

_codes(patch) := [reason.code | some reason in _decide(patch).reasons]

_set(path, value) := [{"op": "replace", "path": path, "value": value}]

# A field added to the document's facts, by path.
_with_field(path, field) := [
	{"op": "add", "path": "/kubeconfig/fields/-", "value": {"path": path, "field": field}},
	{"op": "replace", "path": "/kubeconfig/field_count", "value": count(_fields) + 1},
]

# A field added to the facts without counting it.
_add_field(path, field) := [{"op": "add", "path": "/kubeconfig/fields/-", "value": {"path": path, "field": field}}]

test_a_kubeconfig_of_data_is_allowed if {
	d := _decide([])
	d.allowed
	not d.check_identity
	_codes([]) == ["KubeconfigAllowed"]
	contains(d.reasons[0].message, "a client certificate")
}

test_a_bearer_token_is_allowed if {
	token := {"token": true, "client_certificate_data": false, "client_key_data": false}
	d := _decide(_set("/kubeconfig/context/credentials", token))
	d.allowed
	contains(d.reasons[0].message, "a bearer token")
}

test_identity_is_asked_for_once_the_document_passes if {
	d := _decide([{"op": "remove", "path": "/server_identity"}])
	not d.allowed
	d.check_identity
	[r.code | some r in d.reasons] == ["ServerIdentityUnchecked"]
}

test_a_refused_document_asks_for_no_identity if {
	patch := array.concat(
		[{"op": "remove", "path": "/server_identity"}],
		_with_field("users[0].user.tokenFile", "users[].user.tokenFile"),
	)
	d := _decide(patch)
	not d.allowed
	not d.check_identity
	_codes(patch) == ["PathField"]
}

test_the_manager_s_own_api_server_is_refused if {
	d := _decide(_set("/server_identity/same_key_as_local", true))
	not d.allowed
	not d.check_identity
	_codes(_set("/server_identity/same_key_as_local", true)) == ["ServerIsLocal"]
	contains(d.reasons[0].message, "same key")
	_codes(_set("/server_identity/verifies_with_local_ca", true)) == ["ServerIsLocal"]
}

test_path_fields_are_refused if {
	every f in [
		"users[].user.tokenFile", "users[].user.client-certificate", "users[].user.client-key",
		"clusters[].cluster.certificate-authority",
	] {
		path := replace(f, "[]", "[0]")
		_codes(_with_field(path, f)) == ["PathField"]
	}
	d := _decide(_with_field("users[0].user.tokenFile", "users[].user.tokenFile"))
	contains(d.reasons[0].message, `"users[0].user.tokenFile"`)
}

test_exec_is_refused_with_what_it_holds if {
	patch := array.concat(
		_with_field("users[0].user.exec", "users[].user.exec"),
		_add_field("users[0].user.exec.command", "users[].user.exec.command"),
	)
	_codes(patch) == ["ExecPlugin"]
}

test_auth_provider_is_refused if {
	_codes(_with_field("users[0].user.auth-provider", "users[].user.auth-provider")) == ["AuthProvider"]
}

test_proxy_url_is_refused if {
	_codes(_with_field("clusters[0].cluster.proxy-url", "clusters[].cluster.proxy-url")) == ["ProxyURL"]
}

test_impersonation_is_refused if {
	every f in ["users[].user.as", "users[].user.as-uid", "users[].user.as-groups", "users[].user.as-user-extra"] {
		_codes(_with_field(replace(f, "[]", "[0]"), f)) == ["Impersonation"]
	}
}

test_basic_auth_and_extensions_are_not_allowed if {
	every f in ["users[].user.username", "users[].user.password", "extensions", "clusters[].cluster.extensions"] {
		_codes(_with_field(replace(f, "[]", "[0]"), f)) == ["FieldNotAllowed"]
	}

	# What an extension holds is covered by it.
	patch := array.concat(
		_with_field("preferences.extensions", "preferences.extensions"),
		_add_field("preferences.extensions[0].name", "preferences.extensions[].name"),
	)
	_codes(patch) == ["FieldNotAllowed"]
}

test_a_field_the_table_does_not_list_is_not_allowed if {
	_codes(_with_field("users[0].user.new-thing", "users[].user.new-thing")) == ["FieldNotAllowed"]
}

test_unknown_fields_are_refused_not_ignored if {
	patch := array.concat(
		_with_field("users[0].user.TokenFile", "users[].user.TokenFile"),
		[{"op": "replace", "path": "/kubeconfig/unknown_fields", "value": ["users[0].user.TokenFile"]}],
	)
	_codes(patch) == ["UnknownField"]
}

test_insecure_skip_tls_verify_needs_the_operator if {
	_codes(_set("/kubeconfig/context/insecure_skip_tls_verify", true)) == ["InsecureSkipTLSVerify"]
	allowed := array.concat(
		_set("/kubeconfig/context/insecure_skip_tls_verify", true),
		_set("/settings/allow_insecure_skip_tls_verify", true),
	)
	_decide(allowed).allowed

	# Present and false is what it says.
	field := "clusters[].cluster.insecure-skip-tls-verify"
	_decide(_with_field(replace(field, "[]", "[0]"), field)).allowed
}

test_two_contexts_without_current_context_are_ambiguous if {
	patch := [
		{"op": "replace", "path": "/kubeconfig/contexts", "value": 2},
		{"op": "replace", "path": "/kubeconfig/current_context", "value": ""},
		{"op": "remove", "path": "/kubeconfig/context"},
	]
	_codes(patch) == ["ContextAmbiguous"]
}

test_no_context_in_use_is_refused if {
	_codes([{"op": "remove", "path": "/kubeconfig/context"}]) == ["ContextNotFound"]
}

test_a_context_naming_what_is_not_there_is_incomplete if {
	patch := [
		{"op": "replace", "path": "/kubeconfig/context/cluster_found", "value": false},
		{"op": "replace", "path": "/kubeconfig/context/user_found", "value": false},
	]
	_codes(patch) == ["ContextIncomplete", "ContextIncomplete"]
}

test_a_server_that_is_not_https_is_refused if {
	_codes(_set("/kubeconfig/context/server/scheme", "http")) == ["ServerNotHTTPS"]
	_codes(_set("/kubeconfig/context/server/host", "")) == ["ServerNotHTTPS"]
	_codes(_set("/kubeconfig/context/server/user_info", true)) == ["ServerNotHTTPS"]
	_codes([{"op": "add", "path": "/kubeconfig/context/server/error", "value": "bad"}]) == ["ServerNotHTTPS"]
}

test_no_credential_data_is_refused if {
	none := {"token": false, "client_certificate_data": false, "client_key_data": false}
	_codes(_set("/kubeconfig/context/credentials", none)) == ["CredentialsMissing"]
	half := {"token": true, "client_certificate_data": true, "client_key_data": false}
	_codes(_set("/kubeconfig/context/credentials", half)) == ["CredentialsMissing"]
}

test_a_document_too_large_is_refused_unread if {
	patch := [
		{"op": "replace", "path": "/kubeconfig/parsed", "value": false},
		{"op": "replace", "path": "/kubeconfig/bytes", "value": 300000},
	]
	_codes(patch) == ["KubeconfigTooLarge"]
}

test_a_malformed_document_is_refused if {
	patch := [
		{"op": "replace", "path": "/kubeconfig/parsed", "value": false},
		{"op": "add", "path": "/kubeconfig/error", "value": "duplicate key"},
	]
	_codes(patch) == ["KubeconfigMalformed"]

	# No facts at all fail closed.
	d := kubeconfig.decision with input as {}
	"KubeconfigMalformed" in {r.code | some r in d.reasons}
	not d.allowed
}

test_too_many_fields_are_refused if {
	_codes(_set("/kubeconfig/field_count", 5000)) == ["TooManyFields"]
}

test_every_refusal_is_listed_and_capped if {
	many := [{"path": sprintf("users[%d].user.tokenFile", [i]), "field": "users[].user.tokenFile"} |
		some i in numbers.range(0, 29)
	]
	patch := [
		{"op": "replace", "path": "/kubeconfig/fields", "value": many},
		{"op": "replace", "path": "/kubeconfig/unknown_fields", "value": ["x"]},
	]
	codes := _codes(patch)
	count([c | some c in codes; c == "PathField"]) == 21
	"UnknownField" in codes
}
