# The issuance decision: the issuer's check right before it signs, and the credential
# checks alone, which the CLI and the manager's own Talos identity ask.
package ichor.credentials_test

import data.ichor.credentials

# A request the issuer may sign: alice's talosconfig-reader, admitted by the webhook (its
# record found and verified), and alice still holds the grant.
_good_issuance := {
	"request": _good.request,
	"requester": _good.requester,
	"admission": {
		"recorded": true,
		"verified": true,
		"decision_id": "4b0d7c52-8f7c-4f55-9d6c-0c3b2d9a1e77",
		"error": "",
	},
	"authorization": _good.authorization,
	"cluster": {"exists": true, "kubeconfig_ref": false, "local": true},
	"secrets": {"secret": "demo-secrets", "read": true, "claimed": true, "usable": true},
	"admin_identity": {"bindings": [], "nonce": "k2x9p4m7qa"},
	"settings": {"admin_kubeconfigs": true},
}

_issue(patch) := decision if {
	decision := credentials.issuance with input as json.patch(_good_issuance, patch)
}

_issue_purpose(purpose, patch) := _issue(array.concat(_purpose_patch(purpose, []), patch))

_issue_ttl(seconds) := [{"op": "add", "path": "/request/ttl_seconds", "value": seconds}]

_reader_key := {"parsed": true, "algorithm": "Ed25519", "bits": 256, "error": ""}

_check(request) := decision if {
	decision := credentials.credential with input as request
}

test_issuance_of_talosconfig_reader_is_os_reader_for_one_hour if {
	_issue([]) == {
		"allowed": true,
		"purpose": "talosconfig-reader",
		"lifetime_seconds": 3600,
		"reasons": [{
			"code": "IchorCredentialIssuable",
			"message": "an os:reader talosconfig with lifetime 1h0m0s may be signed",
		}],
		"certificate": {"kind": "talos", "talos_role": "os:reader"},
	}
}

test_issuance_of_talosconfig_reader_for_twelve_hours_is_allowed if {
	d := _issue(_issue_ttl(43200))
	d.allowed
	d.lifetime_seconds == 43200
}

test_issuance_one_second_above_twelve_hours_is_refused_without_a_certificate if {
	d := _issue(_issue_ttl(43201))
	not d.allowed
	not d.certificate
	_codes(d) == ["LifetimeTooLong"]
}

test_issuance_of_kubeconfig_admin_names_the_person_and_makes_their_binding if {
	d := _issue_purpose("kubeconfig-admin", [])
	d.lifetime_seconds == _one_year
	d.certificate == {
		"kind": "kubernetes",
		"groups": ["ichor-admin:u:ichor:alice:k2x9p4m7qa"],
		"common_name": "ichor-admin:u:ichor:alice",
	}
	d.admin_binding == {
		"name": "ichor-admin:u:ichor:alice:k2x9p4m7qa",
		"group": "ichor-admin:u:ichor:alice:k2x9p4m7qa",
		"cluster_role": "cluster-admin",
		"username": "ichor:alice",
		"identity": "ichor-admin:u:ichor:alice",
		"create": true,
	}
	d.reasons == [{
		"code": "IchorCredentialIssuable",
		"message": concat("", [
			"a cluster-admin kubeconfig (CN=ichor-admin:u:ichor:alice, O=their own group, bound to cluster-admin) ",
			"with lifetime 8760h0m0s may be signed",
		]),
	}]
}

test_issuance_of_kubeconfig_super_admin_is_system_masters_naming_the_person if {
	d := _issue_purpose("kubeconfig-super-admin", _issue_ttl(3600))
	d.certificate == {"kind": "kubernetes", "groups": ["system:masters"], "common_name": "ichor-super-admin:u:ichor:alice"}
	not d.admin_binding
}

test_only_kubernetes_credentials_of_people_name_a_binding if {
	not _issue([]).admin_binding
	not _issue_purpose("kubeconfig-super-admin", []).admin_binding
}

test_issuance_refuses_what_admission_refuses if {
	_codes(_issue_purpose("packet-capture", array.concat(
		_issue_ttl(901),
		[{"op": "replace", "path": "/request/public_key", "value": {"parsed": false}}],
	))) == ["LifetimeTooLong", "PublicKeyInvalid"]
	_codes(_issue([{"op": "replace", "path": "/request/purpose", "value": "talosconfig-operator"}])) == ["PurposeUnknown"]
	_codes(_issue_purpose("node-reader", _issue_ttl(0))) == ["LifetimeNotPositive"]
}

test_request_never_admitted_is_refused if {
	# Created while the webhook was not serving: no record of its admission exists.
	d := _issue([{"op": "replace", "path": "/admission", "value": {"recorded": false, "verified": false}}])
	not d.allowed
	not d.certificate
	d.reasons == [{"code": "NotAdmitted", "message": concat("", [
		"no admission of this request by Ichor's webhook is recorded: it was created while the webhook ",
		"was not serving, or its admission record (an Event, which expires with the API server's ",
		"--event-ttl) is gone; ask again with a new request",
	])}]
}

test_admission_record_that_does_not_verify_is_refused_with_why if {
	d := _issue([{"op": "replace", "path": "/admission", "value": {
		"recorded": true, "verified": false,
		"error": "its MAC does not match the request's uid, spec and requester",
	}}])
	d.reasons == [{"code": "NotAdmitted", "message": concat("", [
		"the admission record of this request does not prove it: its MAC does not match the request's ",
		"uid, spec and requester; ask again with a new request",
	])}]
	e := _issue([{"op": "replace", "path": "/admission", "value": {"recorded": true}}])
	e.reasons[0].message == concat("", [
		"the admission record of this request does not prove it: it does not verify; ",
		"ask again with a new request",
	])
}

test_missing_admission_facts_are_refused if {
	_codes(_issue([{"op": "remove", "path": "/admission"}])) == ["NotAdmitted"]
	_codes(_issue([{"op": "replace", "path": "/admission/verified", "value": "true"}])) == ["NotAdmitted"]
}

test_requester_who_lost_the_grant_since_admission_is_refused if {
	d := _issue([
		{"op": "replace", "path": "/authorization/allowed", "value": false},
		{"op": "replace", "path": "/authorization/reason", "value": ""},
	])
	not d.certificate
	d.reasons == [{
		"code": "NotAuthorized",
		"message": `user "ichor:alice" may not download talosclusters/talosconfig-reader "demo" in namespace "team-a"`,
	}]
}

test_issuance_review_must_be_made_as_the_recorded_requester if {
	# A review as the issuer itself, or as anyone but the requester, says nothing.
	issuer := "system:serviceaccount:ichor-system:ichor-policy"
	_codes(_issue(_set("/authorization/user", issuer))) == ["AuthorizationMismatch"]
	_codes(_issue(_set("/requester/username", "ichor:bob"))) == ["AuthorizationMismatch"]
	_codes(_issue(_set("/requester/groups", ["system:masters"]))) == ["AuthorizationMismatch"]
	_codes(_issue([{"op": "remove", "path": "/authorization"}])) == ["AuthorizationMismatch"]
}

test_request_without_a_requester_is_refused if {
	d := _issue([{"op": "remove", "path": "/requester"}])

	# The review cannot have been made as nobody either.
	_codes(d) == ["AuthorizationMismatch", "RequesterUnknown"]
	_codes(_issue(_set("/requester/username", 7))) == ["AuthorizationMismatch", "RequesterUnknown"]
}

test_cluster_gone_since_admission_is_refused if {
	_codes(_issue(_set("/cluster/exists", false))) == ["ClusterNotFound"]
	_codes(_issue([{"op": "remove", "path": "/cluster"}])) == ["ClusterNotFound"]
}

test_a_secrets_secret_that_does_not_name_the_cluster_is_refused_with_why if {
	claim_error := concat("", [
		"the Secret does not name this TalosCluster: its annotation ichor.dev/talos-clusters ",
		`names "prod", not "demo": only whoever may write the Secret may let another cluster use it`,
	])
	d := _issue(array.concat(
		_set("/secrets/claimed", false),
		[{"op": "add", "path": "/secrets/claim_error", "value": claim_error}],
	))
	d.reasons == [{
		"code": "SecretsNotClaimed",
		"message": sprintf(`TalosCluster "demo" may not use the CAs of Secret "demo-secrets": %s`, [claim_error]),
	}]
	not d.certificate
	_codes(_issue_purpose("kubeconfig-super-admin", _set("/secrets/claimed", false))) == ["SecretsNotClaimed"]
}

test_a_request_without_the_secrets_fact_is_refused if {
	d := _issue([{"op": "remove", "path": "/secrets"}])
	d.reasons == [{
		"code": "SecretsNotClaimed",
		"message": `nothing says that the secrets Secret of TalosCluster "demo" names it`,
	}]
	_codes(_issue(_set("/secrets/claimed", "true"))) == ["SecretsNotClaimed"]
	_codes(_issue(array.concat(_set("/secrets/claimed", false), _set("/secrets/read", "false")))) == ["SecretsNotClaimed"]
}

test_a_secrets_secret_that_cannot_sign_is_refused_with_why if {
	missing := `secrets bundle of cluster team-a/demo: get Secret "demo-secrets": secrets "demo-secrets" not found`
	d := _issue([
		{"op": "replace", "path": "/secrets/read", "value": false},
		{"op": "replace", "path": "/secrets/claimed", "value": false},
		{"op": "replace", "path": "/secrets/usable", "value": false},
		{"op": "add", "path": "/secrets/error", "value": missing},
	])
	d.reasons == [{
		"code": "SecretsUnusable",
		"message": sprintf(`the secrets Secret "demo-secrets" of TalosCluster "demo" cannot sign: %s`, [missing]),
	}]
	not d.certificate

	# Read and named, without a usable bundle; and without a word of why.
	_codes(_issue(_set("/secrets/usable", false))) == ["SecretsUnusable"]
	unsaid := _issue([{"op": "remove", "path": "/secrets/usable"}])
	unsaid.reasons[0].message == `the secrets Secret "demo-secrets" of TalosCluster "demo" cannot sign: nothing says why`

	# No admin binding is made for a request that cannot be signed.
	not _issue_purpose("kubeconfig-admin", _set("/secrets/usable", false)).admin_binding

	# A cluster that does not exist is refused for that alone.
	_codes(_issue(array.concat(_set("/cluster/exists", false), _set("/secrets/read", false)))) == ["ClusterNotFound"]
}

test_kubernetes_credential_of_a_remote_cluster_is_refused_before_signing if {
	remote := array.concat(_set("/cluster/kubeconfig_ref", true), _set("/cluster/local", false))
	_codes(_issue_purpose("kubeconfig-super-admin", remote)) == ["ClusterNotLocal"]
	_codes(_issue_purpose("kubeconfig-admin", _set("/cluster/local", false))) == ["ClusterNotLocal"]

	# A kubeconfigRef cluster also named local (Go never says both, the rule does not lean on it):
	# refused at admission and at issuance.
	_codes(_issue_purpose("kubeconfig-super-admin", _set("/cluster/kubeconfig_ref", true))) == ["ClusterNotLocal"]
	_codes(_admit_purpose("kubeconfig-admin", _set("/cluster/kubeconfig_ref", true))) == ["ClusterNotLocal"]
	_issue_purpose("credentials-talos", remote).allowed
}

test_admin_kubeconfig_revoked_by_the_operator_is_refused_even_with_a_binding if {
	d := _issue_purpose("kubeconfig-admin", _set("/settings/admin_kubeconfigs", false))
	d.reasons == [{
		"code": "AdminKubeconfigsRevoked",
		"message": concat("", [
			"the operator revoked admin kubeconfigs (--admin-kubeconfigs=false, ",
			"chart value adminCredentials.enabled=false); none is issued",
		]),
	}]
	not d.admin_binding
	_codes(_issue_purpose("kubeconfig-admin", [{"op": "remove", "path": "/settings"}])) == ["AdminKubeconfigsRevoked"]
	_issue(_set("/settings/admin_kubeconfigs", false)).allowed

	# The break-glass kubeconfig is not concerned: it is for when RBAC is broken.
	_issue_purpose("kubeconfig-super-admin", _set("/settings/admin_kubeconfigs", false)).allowed
}

test_issuance_of_empty_input_is_refused_for_every_missing_fact if {
	d := credentials.issuance with input as {}
	not d.certificate
	d.lifetime_seconds == 0
	_codes(d) == ["ClusterNotFound", "NotAdmitted", "PublicKeyInvalid", "PurposeUnknown", "RequesterUnknown"]
}

test_credential_check_of_a_reader_is_os_reader_without_who_asks if {
	_check({"purpose": "node-reader", "public_key": _reader_key}) == {
		"allowed": true,
		"purpose": "node-reader",
		"lifetime_seconds": 600,
		"reasons": [{
			"code": "IchorCredentialIssuable",
			"message": "an os:reader identity to read one node with lifetime 10m0s may be signed",
		}],
		"certificate": {"kind": "talos", "talos_role": "os:reader"},
	}
}

test_credential_check_refuses_caps_and_keys_before_anything_is_sent if {
	d := _check({"purpose": "talosconfig-reader", "ttl_seconds": 86400, "public_key": _reader_key})
	not d.allowed
	not d.certificate
	_codes(d) == ["LifetimeTooLong"]
	_codes(_check({})) == ["PublicKeyInvalid", "PurposeUnknown"]
}

test_a_review_that_is_not_an_object_is_no_review if {
	every authorization in [null, "allowed", [], true] {
		_codes(_issue(_set("/authorization", authorization))) == ["AuthorizationMismatch"]
		_codes(_admit(_set("/authorization", authorization))) == ["AuthorizationMismatch"]
	}
}

test_a_lifetime_other_than_the_one_admitted_is_refused if {
	admitted := [{"op": "add", "path": "/admission/lifetime_seconds", "value": 3600}]
	_issue(admitted).allowed
	_issue(array.concat(admitted, _issue_ttl(3600))).allowed

	# The default changed since admission (the record says 1800), or a record not a number.
	d := _issue([{"op": "add", "path": "/admission/lifetime_seconds", "value": 1800}])
	d.reasons == [{"code": "LifetimeNotAdmitted", "message": concat("", [
		"the credential would now live 1h0m0s, not the 1800 seconds admitted ",
		"(the purpose's default changed since); ask again with a new request",
	])}]
	not d.allowed
	_codes(_issue([{"op": "add", "path": "/admission/lifetime_seconds", "value": "3600"}])) == ["LifetimeNotAdmitted"]
}

# The admission record's credential (Go passes it verified, as the webhook wrote it).
_admitted_credential(credential) := [{"op": "add", "path": "/admission/credential", "value": credential}]

test_admission_pins_the_credential_it_names if {
	_admit([]).credential == {"kind": "talos", "credential": "talosconfig", "talos_role": "os:reader"}
	_admit_purpose("kubeconfig-admin", []).credential == {
		"kind": "kubernetes",
		"credential": "cluster-admin kubeconfig",
		"groups": [],
		"common_name": "ichor-admin:u:ichor:alice",
		"bound_to": "cluster-admin",
	}
	_admit_purpose("kubeconfig-super-admin", []).credential == _super_admin

	# Nothing is pinned for a refusal.
	not _admit(_ttl(86400)).credential
}

_super_admin := {
	"kind": "kubernetes",
	"credential": "break-glass kubeconfig",
	"groups": ["system:masters"],
	"common_name": "ichor-super-admin:u:ichor:alice",
}

test_a_credential_other_than_the_one_admitted_is_refused if {
	reader := {"kind": "talos", "credential": "talosconfig", "talos_role": "os:reader"}
	_issue(_admitted_credential(reader)).allowed

	# The purpose mapped to another role when it was admitted.
	d := _issue(_admitted_credential(object.union(reader, {"talos_role": "os:operator"})))
	not d.allowed
	not d.certificate
	d.reasons == [{"code": "CredentialNotAdmitted", "message": concat("", [
		"the credential would now be an os:reader talosconfig, not an os:operator talosconfig ",
		"as admitted (the purpose changed since); ask again with a new request",
	])}]

	# A kubeconfig admitted without the group it would now carry, or for another person.
	_issue_purpose("kubeconfig-super-admin", _admitted_credential(_super_admin)).allowed
	every admitted in [
		object.union(_super_admin, {"groups": []}),
		object.union(_super_admin, {"common_name": "ichor-super-admin:u:ichor:bob"}),
		object.union(_super_admin, {"bound_to": "cluster-admin"}),
	] {
		_codes(_issue_purpose("kubeconfig-super-admin", _admitted_credential(admitted))) == ["CredentialNotAdmitted"]
	}

	# A record of a shape this policy does not write, or that reads the same, is named by its
	# JSON.
	every admitted in [{"kind": "x509"}, object.union(reader, {"extra": 1})] {
		d := _issue(_admitted_credential(admitted))
		d.reasons == [{"code": "CredentialNotAdmitted", "message": concat("", [
			`the credential would now be {"credential":"talosconfig","kind":"talos","talos_role":"os:reader"}, not `,
			json.marshal(admitted),
			" as admitted (the purpose changed since); ask again with a new request",
		])}]
	}
}

test_a_label_or_the_order_of_groups_changed_since_admission_is_the_same_credential if {
	reader := {"kind": "talos", "credential": "Talos config", "talos_role": "os:reader"}
	_issue(_admitted_credential(reader)).allowed
	masters := object.union(_super_admin, {"groups": ["system:masters", "system:masters"], "credential": "old"})
	_issue_purpose("kubeconfig-super-admin", _admitted_credential(masters)).allowed
}

# Every purpose's credential, as admission pins it, is issued.
test_every_purpose_is_issued_as_admitted if {
	every name in object.keys(_purposes) {
		admitted := _admit_purpose(name, [])
		admitted.credential
		_issue_purpose(name, _admitted_credential(admitted.credential)).allowed
	}
}

test_the_admitted_credential_is_compared_only_when_the_record_is_proven if {
	operator := {"kind": "talos", "credential": "talosconfig", "talos_role": "os:operator"}
	d := _issue(array.concat(_admitted_credential(operator), _set("/admission/verified", false)))
	_codes(d) == ["NotAdmitted"]
}
