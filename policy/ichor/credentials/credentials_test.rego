package ichor.credentials_test

import data.ichor.credentials

_config := credentials.config

_purposes := _config.purposes

_one_year := 31536000

# A request that every check admits: alice, an operator, asking for the default
# talosconfig-reader of cluster demo, having passed download on talosclusters/talosconfig-reader.
_good := {
	"operation": "CREATE",
	"dry_run": false,
	"user": {
		"username": "ichor:alice",
		"uid": "5b2c",
		"groups": ["ichor:operators", "system:authenticated"],
		"extra": {},
	},
	"requester": {
		"username": "ichor:alice",
		"uid": "5b2c",
		"groups": ["system:authenticated", "ichor:operators"],
		"extra": {},
	},
	"request": {
		"name": "talosconfig-x7k2p",
		"namespace": "team-a",
		"uid": "0f7e8c2a-51d4-4d7b-9a57-2f3c6c1d9e10",
		"cluster": "demo",
		"purpose": "talosconfig-reader",
		"public_key": {"parsed": true, "algorithm": "Ed25519", "bits": 256, "error": ""},
	},
	"authorization": {
		# The review as the requester; its groups in another order are the same groups.
		"user": "ichor:alice",
		"groups": ["system:authenticated", "ichor:operators"],
		"verb": "download",
		"group": "ichor.dev",
		"resource": "talosclusters",
		"subresource": "talosconfig-reader",
		"namespace": "team-a",
		"name": "demo",
		"allowed": true,
		"reason": `RBAC: allowed by ClusterRoleBinding "ichor-operator"`,
		"evaluation_error": "",
	},
	"cluster": {"exists": true, "kubeconfig_ref": false, "local": true},
}

_admit(patch) := decision if {
	decision := credentials.admission with input as json.patch(_good, patch)
}

_codes(decision) := [reason.code | some reason in decision.reasons]

_set(path, value) := [{"op": "replace", "path": path, "value": value}]

_ttl(seconds) := [{"op": "add", "path": "/request/ttl_seconds", "value": seconds}]

_key(key) := _set("/request/public_key", object.union({"parsed": true, "error": ""}, key))

# The request for another purpose, its SubjectAccessReview passed; Ichor's own by its SA.
_admit_purpose(purpose, patch) := _admit(array.concat(_purpose_patch(purpose, ["/user/username"]), patch))

_requirements(purpose) := requirements if {
	requirements := credentials.requirements with input as {"purpose": purpose}
}

test_requirements_of_talosconfig_reader_are_download_and_a_normal_event if {
	_requirements("talosconfig-reader") == {
		"authorization": {
			"verb": "download", "group": "ichor.dev",
			"resource": "talosclusters", "subresource": "talosconfig-reader",
		},
		"event": {"type": "Normal", "reason": "TalosconfigReader"},
	}
}

test_requirements_of_an_unknown_purpose_are_undefined if {
	not _requirements("talosconfig-operator")
}

test_talosconfig_reader_is_admitted_for_one_hour_with_the_adr_event if {
	d := _admit([])
	d.allowed
	d.purpose == "talosconfig-reader"
	d.lifetime_seconds == 3600
	d.event == {
		"type": "Normal",
		"reason": "TalosconfigReader",
		"message": "an os:reader talosconfig was requested by ichor:alice (lifetime 1h0m0s)",
	}
	d.reasons == [{
		"code": "IchorCredentialAdmitted",
		"message": concat("", [
			`user "ichor:alice" may download talosclusters/talosconfig-reader "demo" in namespace "team-a": `,
			"an os:reader talosconfig with lifetime 1h0m0s is admitted",
		]),
	}]
}

test_talosconfig_reader_for_twelve_hours_is_admitted if {
	d := _admit(_ttl(43200))
	d.allowed
	d.lifetime_seconds == 43200
	d.event.message == "an os:reader talosconfig was requested by ichor:alice (lifetime 12h0m0s)"
}

test_talosconfig_reader_one_second_above_twelve_hours_is_refused_not_shortened if {
	d := _admit(_ttl(43201))
	not d.allowed
	d.lifetime_seconds == 43201
	not d.event
	d.reasons == [{
		"code": "LifetimeTooLong",
		"message": concat("", [
			`the lifetime 12h0m1s is above the cap of 12h0m0s for purpose "talosconfig-reader"; `,
			"it is refused, not shortened",
		]),
	}]
}

test_thirteen_hours_is_refused_for_everyone if {
	_codes(_admit(_ttl(46800))) == ["LifetimeTooLong"]
}

test_dry_run_is_admitted_without_an_event if {
	d := _admit(_set("/dry_run", true))
	d.allowed
	not d.event
}

test_missing_dry_run_is_not_a_dry_run if {
	_admit([{"op": "remove", "path": "/dry_run"}]).event.reason == "TalosconfigReader"
}

test_null_ttl_is_the_default if {
	_admit(_ttl(null)).lifetime_seconds == 3600
}

test_short_lifetimes_read_as_minutes_and_seconds if {
	_admit(_ttl(90)).event.message == "an os:reader talosconfig was requested by ichor:alice (lifetime 1m30s)"
	_admit(_ttl(45)).event.message == "an os:reader talosconfig was requested by ichor:alice (lifetime 45s)"
}

test_viewer_without_the_verb_is_refused_naming_the_verb if {
	d := _admit([
		{"op": "replace", "path": "/user/username", "value": "ichor:bob"},
		{"op": "replace", "path": "/requester/username", "value": "ichor:bob"},
		{"op": "replace", "path": "/authorization/user", "value": "ichor:bob"},
		{"op": "replace", "path": "/authorization/allowed", "value": false},
		{"op": "replace", "path": "/authorization/reason", "value": ""},
	])
	not d.allowed
	not d.event
	d.reasons == [{
		"code": "NotAuthorized",
		"message": `user "ichor:bob" may not download talosclusters/talosconfig-reader "demo" in namespace "team-a"`,
	}]
}

test_holder_of_talosclusters_credentials_only_is_refused_talosconfig_reader if {
	# RBAC grants bob download on talosclusters/credentials; the SubjectAccessReview for
	# talosconfig-reader, the one the purpose requires, answers no.
	d := _admit([
		{"op": "replace", "path": "/user/username", "value": "bob"},
		{"op": "replace", "path": "/requester/username", "value": "bob"},
		{"op": "replace", "path": "/authorization/user", "value": "bob"},
		{"op": "replace", "path": "/authorization/allowed", "value": false},
		{"op": "replace", "path": "/authorization/reason", "value": ""},
	])
	d.reasons[0].message == `user "bob" may not download talosclusters/talosconfig-reader "demo" in namespace "team-a"`
}

test_refusal_carries_the_authorizers_reason_and_evaluation_error if {
	d := _admit([
		{"op": "replace", "path": "/authorization/allowed", "value": false},
		{"op": "replace", "path": "/authorization/reason", "value": "no RBAC policy matched"},
		{"op": "replace", "path": "/authorization/evaluation_error", "value": "webhook authorizer timed out"},
	])
	d.reasons == [{"code": "NotAuthorized", "message": concat("", [
		`user "ichor:alice" may not download talosclusters/talosconfig-reader "demo" in namespace "team-a": `,
		"no RBAC policy matched; evaluation error: webhook authorizer timed out",
	])}]
}

test_allowed_review_for_credentials_does_not_admit_talosconfig_reader if {
	d := _admit(_set("/authorization/subresource", "credentials"))
	d.reasons == [{"code": "AuthorizationMismatch", "message": concat("", [
		`the SubjectAccessReview asked whether "ichor:alice" (groups {"ichor:operators", "system:authenticated"}) `,
		`may download talosclusters.ichor.dev/credentials "demo" in namespace "team-a", `,
		`not whether "ichor:alice" (groups {"ichor:operators", "system:authenticated"}) `,
		`may download talosclusters.ichor.dev/talosconfig-reader "demo" in namespace "team-a"`,
	])}]
}

test_review_made_as_someone_else_does_not_admit if {
	# As the controller, which holds every verb, the review would always pass.
	_codes(_admit(_set("/authorization/user", "system:serviceaccount:ichor-system:ichor"))) == ["AuthorizationMismatch"]
	_codes(_admit(_set("/authorization/groups", ["system:masters"]))) == ["AuthorizationMismatch"]
	_codes(_admit([{"op": "remove", "path": "/authorization/groups"}])) == ["AuthorizationMismatch"]
}

test_review_of_another_cluster_or_namespace_does_not_admit if {
	_codes(_admit(_set("/authorization/name", "prod"))) == ["AuthorizationMismatch"]
	_codes(_admit(_set("/authorization/namespace", "team-b"))) == ["AuthorizationMismatch"]
	_codes(_admit(_set("/authorization/verb", "get"))) == ["AuthorizationMismatch"]
}

test_missing_review_is_refused if {
	d := _admit([{"op": "remove", "path": "/authorization"}])
	_codes(d) == ["AuthorizationMismatch"]
	startswith(d.reasons[0].message, concat("", [
		`the SubjectAccessReview asked whether "" (groups set()) may  ./ "" in namespace "", `,
		`not whether "ichor:alice"`,
	]))
}

test_missing_answer_of_the_review_is_refused if {
	_codes(_admit([{"op": "remove", "path": "/authorization/allowed"}])) == ["NotAuthorized"]
}

test_unknown_purpose_is_refused_listing_the_purposes if {
	d := _admit(_set("/request/purpose", "talosconfig-operator"))
	not d.allowed
	d.lifetime_seconds == 0
	d.reasons == [{"code": "PurposeUnknown", "message": concat("", [
		`purpose "talosconfig-operator" is not one of credentials-talos, etcd-snapshot, kubeconfig-admin, `,
		"kubeconfig-super-admin, node-reader, packet-capture, support-bundle, talosconfig-reader",
	])}]
}

test_missing_purpose_is_refused if {
	d := _admit([{"op": "remove", "path": "/request/purpose"}])
	_codes(d) == ["PurposeUnknown"]
	d.purpose == ""
}

test_zero_lifetime_is_refused if {
	_admit(_ttl(0)).reasons == [{
		"code": "LifetimeNotPositive",
		"message": "the requested lifetime of 0 seconds is not positive",
	}]
}

test_negative_lifetime_is_refused if {
	_codes(_admit(_ttl(-60))) == ["LifetimeNotPositive"]
}

test_fractional_lifetime_is_refused if {
	_admit(_ttl(1.5)).reasons == [{
		"code": "LifetimeNotWholeSeconds",
		"message": "the requested lifetime 1.5 is not a whole number of seconds",
	}]
}

test_fractional_lifetime_above_the_cap_is_refused_twice if {
	d := _admit(_ttl(43200.5))
	_codes(d) == ["LifetimeNotWholeSeconds", "LifetimeTooLong"]
	contains(d.reasons[1].message, "the lifetime 43200.5s is above the cap of 12h0m0s")
}

test_lifetime_that_is_not_a_number_is_refused if {
	d := _admit(_ttl("12h"))
	_codes(d) == ["LifetimeNotWholeSeconds"]
	d.lifetime_seconds == 0
}

test_missing_public_key_is_refused if {
	_admit([{"op": "remove", "path": "/request/public_key"}]).reasons == [{
		"code": "PublicKeyInvalid",
		"message": "spec.publicKey does not parse as a PEM PUBLIC KEY block: it is missing",
	}]
}

test_unparseable_public_key_is_refused_with_the_error if {
	d := _admit(_set("/request/public_key", {"parsed": false, "algorithm": "", "error": "x509: malformed public key"}))
	d.reasons[0].message == "spec.publicKey does not parse as a PEM PUBLIC KEY block: x509: malformed public key"
}

test_ecdsa_p256_and_p384_and_rsa_2048_keys_are_admitted if {
	_admit(_key({"algorithm": "ECDSA", "curve": "P-256", "bits": 256})).allowed
	_admit(_key({"algorithm": "ECDSA", "curve": "P-384", "bits": 384})).allowed
	_admit(_key({"algorithm": "RSA", "bits": 2048})).allowed
	_admit(_key({"algorithm": "RSA", "bits": 4096})).allowed
}

test_ed25519_key_without_facts_beyond_its_algorithm_is_admitted if {
	_admit(_key({"algorithm": "Ed25519"})).allowed
}

test_short_rsa_key_is_refused_listing_the_allowed_keys if {
	_admit(_key({"algorithm": "RSA", "bits": 1024})).reasons == [{"code": "PublicKeyNotAllowed", "message": concat("", [
		`public key "RSA 1024-bit" is not allowed; allowed are `,
		"ECDSA on curve P-256 or P-384, Ed25519, RSA of 2048 to 8192 bits",
	])}]
}

test_rsa_key_above_8192_bits_is_refused if {
	_admit(_key({"algorithm": "RSA", "bits": 8192})).allowed
	d := _admit(_key({"algorithm": "RSA", "bits": 16000}))
	_codes(d) == ["PublicKeyNotAllowed"]
	startswith(d.reasons[0].message, `public key "RSA 16000-bit" is not allowed`)
}

test_other_curves_and_algorithms_are_refused if {
	d := _admit(_key({"algorithm": "ECDSA", "curve": "P-521", "bits": 521}))
	startswith(d.reasons[0].message, `public key "ECDSA P-521 521-bit" is not allowed`)
	_codes(_admit(_key({"algorithm": "ECDSA", "curve": "P-224", "bits": 224}))) == ["PublicKeyNotAllowed"]
	_codes(_admit(_key({"algorithm": "DSA", "bits": 2048}))) == ["PublicKeyNotAllowed"]
	_codes(_admit(_key({"algorithm": "RSA"}))) == ["PublicKeyNotAllowed"]
	_codes(_admit(_key({"algorithm": "RSA", "bits": "4096"}))) == ["PublicKeyNotAllowed"]
}

test_missing_cluster_is_refused if {
	_admit(_set("/cluster/exists", false)).reasons == [{
		"code": "ClusterNotFound",
		"message": `TalosCluster "demo" does not exist in namespace "team-a"`,
	}]
}

test_update_is_refused_since_the_spec_is_immutable if {
	d := _admit(_set("/operation", "UPDATE"))
	d.reasons == [{"code": "OperationNotAllowed", "message": concat("", [
		`operation "UPDATE" is not allowed: a TalosCredentialRequest is only created, never changed; `,
		"ask with a new one",
	])}]
	not d.event
}

test_delete_and_missing_operation_are_refused if {
	_codes(_admit(_set("/operation", "DELETE"))) == ["OperationNotAllowed"]
	_codes(_admit([{"op": "remove", "path": "/operation"}])) == ["OperationNotAllowed"]
}

test_unnamed_requester_is_refused_since_the_event_could_not_name_them if {
	d := _admit([
		{"op": "remove", "path": "/user/username"},
		{"op": "replace", "path": "/requester/username", "value": ""},
		{"op": "replace", "path": "/authorization/user", "value": ""},
	])
	_codes(d) == ["RequesterUnknown", "RequesterUnnamed"]
	d.reasons[1] == {
		"code": "RequesterUnnamed",
		"message": "the request names no user, so its issuance could not be recorded",
	}
}

test_every_failing_check_is_reported_sorted if {
	_codes(_admit([
		{"op": "replace", "path": "/operation", "value": "UPDATE"},
		{"op": "replace", "path": "/cluster/exists", "value": false},
		{"op": "replace", "path": "/authorization/allowed", "value": false},
		{"op": "replace", "path": "/request/public_key", "value": {"parsed": true, "algorithm": "RSA", "bits": 1024}},
		{"op": "add", "path": "/request/ttl_seconds", "value": 86400},
	])) == ["ClusterNotFound", "LifetimeTooLong", "NotAuthorized", "OperationNotAllowed", "PublicKeyNotAllowed"]
}

test_empty_input_is_refused_for_every_missing_fact if {
	d := credentials.admission with input as {}
	not d.allowed
	_codes(d) == [
		"ClusterNotFound", "OperationNotAllowed", "PublicKeyInvalid",
		"PurposeUnknown", "RequesterUnknown", "RequesterUnnamed",
	]
}

test_kubeconfig_super_admin_is_a_warning_event if {
	d := _admit_purpose("kubeconfig-super-admin", [])
	d.allowed
	d.lifetime_seconds == 900
	d.event == {
		"type": "Warning",
		"reason": "KubeconfigSuperAdmin",
		"message": concat("", [
			"a break-glass kubeconfig (CN=ichor-super-admin:u:ichor:alice, O=system:masters) ",
			"was requested by ichor:alice (lifetime 15m0s)",
		]),
	}
}

test_kubeconfig_super_admin_above_one_hour_is_refused if {
	_codes(_admit_purpose("kubeconfig-super-admin", _ttl(3601))) == ["LifetimeTooLong"]
}

test_every_purpose_is_admitted_with_an_event_naming_user_credential_and_lifetime if {
	messages := {
		"talosconfig-reader": "an os:reader talosconfig",
		"node-reader": "an os:reader identity to read one node",
		"support-bundle": "an os:reader identity to collect a support bundle",
		"etcd-snapshot": "an os:etcd:backup identity to take an etcd snapshot",
		"packet-capture": "an os:operator identity to run one packet capture",
		"credentials-talos": "an os:admin talosconfig for the CA-rotation hand-off",
		"kubeconfig-admin": concat("", [
			"a cluster-admin kubeconfig (CN=ichor-admin:u:ichor:alice, ",
			"O=their own group, bound to cluster-admin)",
		]),
		"kubeconfig-super-admin": "a break-glass kubeconfig (CN=ichor-super-admin:u:ichor:alice, O=system:masters)",
	}
	lifetimes := {
		"talosconfig-reader": "1h0m0s", "node-reader": "10m0s", "support-bundle": "15m0s",
		"etcd-snapshot": "10m0s", "packet-capture": "15m0s", "credentials-talos": "8760h0m0s",
		"kubeconfig-admin": "8760h0m0s", "kubeconfig-super-admin": "15m0s",
	}
	every purpose, credential in messages {
		event := _admit_purpose(purpose, []).event
		event.reason == _purposes[purpose].event.reason
		who := {true: "ichor:alice", false: _component}[_purposes[purpose].for_people]
		event.message == sprintf("%s was requested by %s (lifetime %s)", [credential, who, lifetimes[purpose]])
	}
}

test_requester_who_is_not_the_user_is_refused_naming_what_differs if {
	d := _admit(_set("/requester/username", "ichor:mallory"))
	not d.allowed
	not d.event
	d.reasons == [{
		"code": "RequesterMismatch",
		"message": `spec.requester ("ichor:mallory") is not the user who made the request ("ichor:alice"): username differ`,
	}]
}

test_requester_with_other_groups_uid_or_extra_is_refused if {
	more_groups := ["system:authenticated", "ichor:operators", "system:masters"]
	_codes(_admit(_set("/requester/groups", more_groups))) == ["RequesterMismatch"]
	_codes(_admit(_set("/requester/uid", "6c3d"))) == ["RequesterMismatch"]
	d := _admit(_set("/requester/extra", {"scopes": ["all"]}))
	d.reasons[0].message == concat("", [
		`spec.requester ("ichor:alice") is not the user who made the request ("ichor:alice"): `,
		"extra differ",
	])
	_codes(_admit([{"op": "remove", "path": "/requester/uid"}])) == ["RequesterMismatch"]
}

test_requester_groups_and_extra_values_in_another_order_are_the_same if {
	_admit([
		{"op": "replace", "path": "/user/extra", "value": {"scopes": ["a", "b"]}},
		{"op": "replace", "path": "/requester/extra", "value": {"scopes": ["b", "a"]}},
	]).allowed
}

test_requester_of_an_authenticator_without_uid_or_extra_matches_empty_ones if {
	_admit([
		{"op": "remove", "path": "/user/uid"},
		{"op": "remove", "path": "/user/extra"},
		{"op": "replace", "path": "/requester/uid", "value": ""},
		{"op": "replace", "path": "/requester/extra", "value": null},
	]).allowed
}

test_missing_requester_is_refused_as_unknown if {
	d := _admit([{"op": "remove", "path": "/requester"}])
	d.reasons == [{
		"code": "RequesterUnknown",
		"message": concat("", [
			"spec.requester names no user, so who asked cannot be checked: ",
			"ask again with `ichor cluster`, which records the requester",
		]),
	}]
}

test_kubeconfig_for_a_remote_cluster_is_refused_at_admission if {
	d := _admit_purpose("kubeconfig-admin", array.concat(
		_set("/cluster/kubeconfig_ref", true),
		_set("/cluster/local", false),
	))
	d.reasons == [{"code": "ClusterNotLocal", "message": concat("", [
		`TalosCluster "demo" judges another API server (spec.kubeconfigRef); `,
		"Kubernetes credentials are issued only for the cluster Ichor runs in",
	])}]
	_admit_purpose("talosconfig-reader", _set("/cluster/kubeconfig_ref", true)).allowed
}

test_kubeconfig_for_a_cluster_the_operator_did_not_name_is_refused if {
	d := _admit_purpose("kubeconfig-super-admin", _set("/cluster/local", false))
	d.reasons == [{"code": "ClusterNotLocal", "message": concat("", [
		`TalosCluster "demo" is not named as a cluster of the API server Ichor runs in `,
		"(--local-clusters, chart value manager.localClusters); ",
		"Kubernetes credentials are issued only for the cluster Ichor runs in",
	])}]
	unknown := [{"op": "remove", "path": "/cluster/local"}]
	_codes(_admit_purpose("kubeconfig-admin", unknown)) == ["ClusterNotLocal"]
	_admit_purpose("credentials-talos", _set("/cluster/local", false)).allowed
}

test_requester_fields_of_the_wrong_type_are_empty_and_differ if {
	_codes(_admit(_set("/requester/uid", 5))) == ["RequesterMismatch"]
	_codes(_admit(_set("/requester/groups", "ichor:operators"))) == ["RequesterMismatch"]
	_codes(_admit(_set("/requester/extra", {"scopes": "all"}))) == ["RequesterMismatch"]
}
