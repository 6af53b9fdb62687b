package ichor.kubelet_client_test

import data.ichor.kubelet_client

# worker-1 renewing its own client certificate with an RSA key: recognized as
# selfnodeclient, and nodes may create certificatesigningrequests/selfnodeclient
# (but not nodeclient, as in a kubeadm-style cluster).
_good := {
	"csr": {
		"name": "csr-client",
		"signer_name": "kubernetes.io/kube-apiserver-client-kubelet",
		"username": "system:node:worker-1",
		"uid": "5a0c1f3e",
		"groups": ["system:nodes", "system:authenticated"],
		"extra": {},
		"usages": ["digital signature", "key encipherment", "client auth"],
		"request": {
			"pem": {"blocks": 1, "types": ["CERTIFICATE REQUEST"], "headers": 0},
			"parsed": true,
			"parse_error": "",
			"signature_valid": true,
			"signature_error": "",
			"signature_algorithm": "SHA256-RSA",
			"subject": [
				{"oid": "2.5.4.10", "name": "O", "value": "system:nodes"},
				{"oid": "2.5.4.3", "name": "CN", "value": "system:node:worker-1"},
			],
			"subject_alt_names": [],
			"extensions": [],
			"public_key": {"algorithm": "RSA", "bits": 2048},
		},
	},
	"authorization": {
		"selfnodeclient": {"allowed": true, "reason": "", "evaluation_error": ""},
		"nodeclient": {"allowed": false, "reason": "", "evaluation_error": ""},
	},
	"machine": {"name": "worker-1", "namespace": "default", "cluster": "demo"},
}

# The same node's first request, made with the bootstrap token before it has an
# identity: not self, so it can only be approved as nodeclient.
_bootstrap := [
	{"op": "replace", "path": "/csr/username", "value": "system:bootstrap:abcdef"},
	{"op": "replace", "path": "/csr/groups", "value": ["system:bootstrappers", "system:authenticated"]},
	{"op": "replace", "path": "/authorization/selfnodeclient/allowed", "value": false},
	{"op": "replace", "path": "/authorization/nodeclient/allowed", "value": true},
]

_decide(patch) := decision if {
	decision := kubelet_client.decision with input as json.patch(_good, patch)
}

_codes(patch) := [reason.code | some reason in _decide(patch).reasons]

_set(path, value) := [{"op": "replace", "path": path, "value": value}]

_allow(selfnodeclient, nodeclient) := [
	{"op": "replace", "path": "/authorization/selfnodeclient/allowed", "value": selfnodeclient},
	{"op": "replace", "path": "/authorization/nodeclient/allowed", "value": nodeclient},
]

_add_attribute(oid, name, value) := [{
	"op": "add",
	"path": "/csr/request/subject/-",
	"value": {"oid": oid, "name": name, "value": value},
}]

# The tables of data.json with some entries changed, as another bundle might have them.
_config_with(changes) := object.union(kubelet_client.config, changes)

_san(type, value) := _set("/csr/request/subject_alt_names", [{"type": type, "value": value}])

_usages(usages) := _set("/csr/usages", usages)

# Each SAN type alone leaves the request unrecognized: a node client certificate has none.
_pending_for_san(type, value) if {
	d := _decide(_san(type, value))
	d.action == "pending"
	d.kind == ""
	[r.code | some r in d.reasons] == ["SANPresent"]
}

# --- approved ---

test_self_renewal_is_approved_as_selfnodeclient_naming_the_node if {
	d := _decide([])
	d.action == "approve"
	d.kind == "selfnodeclient"
	d.node == "worker-1"
	d.reasons == [{
		"code": "IchorKubeletClient",
		"message": concat("", [
			`kubelet client certificate for node "worker-1" approved as selfnodeclient: `,
			`"system:node:worker-1" may create certificatesigningrequests/selfnodeclient`,
		]),
	}]
}

test_bootstrap_request_is_approved_as_nodeclient if {
	d := _decide(_bootstrap)
	d.action == "approve"
	d.kind == "nodeclient"
	d.reasons[0].message == concat("", [
		`kubelet client certificate for node "worker-1" approved as nodeclient: `,
		`"system:bootstrap:abcdef" may create certificatesigningrequests/nodeclient`,
	])
}

test_self_request_with_both_permissions_is_approved_as_selfnodeclient_first if {
	d := _decide(_allow(true, true))
	d.action == "approve"
	d.kind == "selfnodeclient"
}

test_self_request_without_selfnodeclient_is_approved_by_nodeclient if {
	d := _decide(_allow(false, true))
	d.action == "approve"
	d.kind == "nodeclient"
}

test_ecdsa_usages_without_key_encipherment_are_approved if {
	# The kubelet's default key is ECDSA P-256, whose requests carry no key encipherment.
	d := _decide(_usages(["digital signature", "client auth"]))
	d.action == "approve"
	d.kind == "selfnodeclient"
}

test_usages_in_any_order_are_approved if {
	_decide(_usages(["client auth", "key encipherment", "digital signature"])).action == "approve"
}

test_other_subject_attributes_do_not_stop_recognition if {
	# kube-controller-manager looks only at O and CN; so does this rule.
	_decide(_add_attribute("2.5.4.11", "OU", "talos")).action == "approve"
}

test_other_signer_gets_no_decision if not _decide(_set("/csr/signer_name", "kubernetes.io/kubelet-serving"))

test_legacy_unknown_signer_gets_no_decision if {
	not _decide(_set("/csr/signer_name", "kubernetes.io/kube-apiserver-client"))
}

# --- the self recognizer ---

test_self_request_whose_username_is_another_node_falls_to_nodeclient if {
	d := _decide(array.concat(_set("/csr/username", "system:node:worker-2"), _allow(true, true)))
	d.action == "approve"
	d.kind == "nodeclient"
	d.reasons[0].message == concat("", [
		`kubelet client certificate for node "worker-1" approved as nodeclient: `,
		`"system:node:worker-2" may create certificatesigningrequests/nodeclient`,
	])
}

test_username_differing_from_common_name_is_not_approved_by_selfnodeclient if {
	d := _decide(_set("/csr/username", "system:node:worker-2"))
	d.action == "pending"
	d.kind == "nodeclient"
	d.reasons == [{
		"code": "NodeClientNotAuthorized",
		"message": concat("", [
			`recognized as nodeclient (not selfnodeclient: spec.username "system:node:worker-2" `,
			`is not the common name "system:node:worker-1"), but "system:node:worker-2" may not create `,
			`certificatesigningrequests/nodeclient: the SubjectAccessReview did not allow it `,
			`(reason "", evaluation error "")`,
		]),
	}]
}

# --- authorization ---

test_self_request_with_neither_permission_is_pending_naming_both if {
	d := _decide(array.concat(_allow(false, false), [
		{"op": "replace", "path": "/authorization/selfnodeclient/reason", "value": "no RBAC policy matched"},
		{"op": "replace", "path": "/authorization/nodeclient/evaluation_error", "value": "webhook timed out"},
	]))
	d.action == "pending"
	d.kind == "selfnodeclient"
	d.node == "worker-1"
	d.reasons == [
		{
			"code": "NodeClientNotAuthorized",
			"message": concat("", [
				`recognized as nodeclient, but "system:node:worker-1" may not create `,
				`certificatesigningrequests/nodeclient: the SubjectAccessReview did not allow it `,
				`(reason "", evaluation error "webhook timed out")`,
			]),
		},
		{
			"code": "SelfNodeClientNotAuthorized",
			"message": concat("", [
				`recognized as selfnodeclient, but "system:node:worker-1" may not create `,
				`certificatesigningrequests/selfnodeclient: the SubjectAccessReview did not allow it `,
				`(reason "no RBAC policy matched", evaluation error "")`,
			]),
		},
	]
}

test_bootstrap_request_without_nodeclient_is_pending_even_with_selfnodeclient if {
	# selfnodeclient only approves a request whose requester is the node itself.
	d := _decide(array.concat(_bootstrap, _allow(true, false)))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["NodeClientNotAuthorized"]
}

test_missing_review_is_not_an_allow if {
	d := _decide([{"op": "remove", "path": "/authorization"}])
	d.action == "pending"
	d.reasons[1].message == concat("", [
		`recognized as selfnodeclient, but "system:node:worker-1" may not create `,
		"certificatesigningrequests/selfnodeclient: no SubjectAccessReview result was given",
	])
}

test_allowed_must_be_the_boolean_true if _decide(_allow("true", false)).action == "pending"

test_review_without_reason_fields_is_reported_with_empty_strings if {
	d := _decide(_set("/authorization/selfnodeclient", {"allowed": false}))
	endswith(d.reasons[1].message, `the SubjectAccessReview did not allow it (reason "", evaluation error "")`)
}

test_evaluation_error_does_not_undo_an_allow if {
	# As in sarapprove, only status.allowed counts; an authorizer that errored while another allowed still allows.
	_decide(_set("/authorization/selfnodeclient/evaluation_error", "one webhook failed")).action == "approve"
}

# --- the node-client recognizer: organization ---

test_wrong_organization_is_not_recognized if {
	d := _decide(_set("/csr/request/subject/0/value", "system:bootstrappers"))
	d.action == "pending"
	d.kind == ""
	d.reasons == [
		{
			"code": "OrganizationNotNodes",
			"message": concat("", [
				"not recognized as a node client certificate: the subject's organizations are ",
				`["system:bootstrappers"], not exactly ["system:nodes"]`,
			]),
		},
		{
			"code": "PrivilegedSubject",
			"message": concat("", [
				"the subject carries O=system:bootstrappers; a kubelet client certificate with an organization ",
				"other than system:nodes, or with system:masters, is never approved",
			]),
		},
	]
}

test_extra_organization_is_not_recognized if {
	_codes(_add_attribute("2.5.4.10", "O", "ops")) == ["OrganizationNotNodes", "PrivilegedSubject"]
}

test_repeated_nodes_organization_is_not_recognized if {
	_codes(_add_attribute("2.5.4.10", "O", "system:nodes")) == ["OrganizationNotNodes"]
}

test_no_organization_is_not_recognized if {
	d := _decide([{"op": "remove", "path": "/csr/request/subject/0"}])
	d.action == "pending"
	d.reasons == [{
		"code": "OrganizationNotNodes",
		"message": concat(": ", [
			"not recognized as a node client certificate",
			`the subject's organizations are [], not exactly ["system:nodes"]`,
		]),
	}]
}

# --- the node-client recognizer: common name ---

test_common_name_without_prefix_is_not_recognized if {
	d := _decide(_set("/csr/request/subject/1/value", "worker-1"))
	d.action == "pending"
	d.node == ""
	d.kind == ""
	d.reasons == [{
		"code": "CommonNameNotNode",
		"message": concat("", [
			"not recognized as a node client certificate: the subject's common names are ",
			`["worker-1"], not exactly one system:node:<name>`,
		]),
	}]
}

test_common_name_that_is_only_the_prefix_is_not_recognized if {
	codes := _codes(array.concat(
		_set("/csr/request/subject/1/value", "system:node:"),
		_set("/csr/username", "system:node:"),
	))
	codes == ["CommonNameNotNode"]
}

test_common_name_that_is_only_the_prefix_names_no_node if {
	# As for Go's csrinput.NodeName: no node, so nothing is recognized, whatever the permissions.
	only_prefix := array.concat(_set("/csr/request/subject/1/value", "system:node:"), _allow(true, true))
	d := _decide(array.concat(only_prefix, _set("/csr/username", "system:node:")))
	d.action == "pending"
	d.node == ""
	d.kind == ""
	d.reasons == [{
		"code": "CommonNameNotNode",
		"message": concat("", [
			"not recognized as a node client certificate: the subject's common names are ",
			`["system:node:"], not exactly one system:node:<name>`,
		]),
	}]
}

test_input_without_a_request_still_names_no_node if {
	# Go always sends input.csr.request; without one the decision still has a string for node.
	_decide([{"op": "remove", "path": "/csr/request"}]).node == ""
}

test_no_common_name_is_not_recognized if {
	_codes([{"op": "remove", "path": "/csr/request/subject/1"}]) == ["CommonNameNotNode"]
}

test_second_common_name_is_not_recognized if {
	_codes(_add_attribute("2.5.4.3", "CN", "system:node:worker-2")) == ["CommonNameNotNode"]
}

# --- the node-client recognizer: subject alternative names ---

test_dns_name_is_not_recognized if {
	_pending_for_san("dns", "worker-1")
	d := _decide(_san("dns", "worker-1"))
	d.reasons[0].message == concat("", [
		`not recognized as a node client certificate: it has the subject alternative name "worker-1" `,
		"of type dns, and a node client certificate has none",
	])
}

test_ip_address_is_not_recognized if _pending_for_san("ip", "10.5.0.2")

test_email_address_is_not_recognized if _pending_for_san("email", "root@worker-1")

test_uri_is_not_recognized if _pending_for_san("uri", "spiffe://cluster/worker-1")

test_other_name_is_not_recognized if _pending_for_san("other_name", "a003060129")

test_directory_name_is_not_recognized if _pending_for_san("directory_name", "a4023000")

test_registered_id_is_not_recognized if _pending_for_san("registered_id", "880129")

test_undecodable_name_is_not_recognized if _pending_for_san("unknown", "9f0100")

test_every_name_is_reported if {
	d := _decide(_set("/csr/request/subject_alt_names", [
		{"type": "dns", "value": "worker-1"},
		{"type": "ip", "value": "10.5.0.2"},
	]))
	[r.code | some r in d.reasons] == ["SANPresent", "SANPresent"]
}

# --- the node-client recognizer: usages ---

test_extra_usage_is_not_recognized if {
	d := _decide(_usages(["digital signature", "key encipherment", "client auth", "server auth"]))
	d.action == "pending"
	d.kind == ""
	d.reasons == [{
		"code": "UsagesNotAllowed",
		"message": concat("", [
			"not recognized as a node client certificate: usages ",
			`["digital signature", "key encipherment", "client auth", "server auth"] are not one of the sets `,
			`[["client auth", "digital signature", "key encipherment"], ["client auth", "digital signature"]]`,
		]),
	}]
}

test_missing_client_auth_is_not_recognized if {
	_codes(_usages(["digital signature", "key encipherment"])) == ["UsagesNotAllowed"]
}

test_missing_digital_signature_is_not_recognized if {
	_codes(_usages(["key encipherment", "client auth"])) == ["UsagesNotAllowed"]
}

test_client_auth_alone_is_not_recognized if _codes(_usages(["client auth"])) == ["UsagesNotAllowed"]

test_repeated_usage_is_not_recognized if {
	# The same three distinct usages with one repeated: a set comparison alone would accept it.
	_codes(_usages(["digital signature", "key encipherment", "client auth", "client auth"])) == ["UsagesNotAllowed"]
}

test_repeated_usage_in_place_of_one_is_not_recognized if {
	_codes(_usages(["digital signature", "client auth", "client auth"])) == ["UsagesNotAllowed"]
}

test_no_usages_are_not_recognized if _codes(_usages([])) == ["UsagesNotAllowed"]

# --- the node-client recognizer: the request itself ---

test_unparseable_request_is_pending_not_denied if {
	d := _decide(_set("/csr/request", {
		"parsed": false, "parse_error": "no PEM block found",
		"signature_valid": false, "signature_error": "", "subject": [],
		"subject_alt_names": [], "extensions": [],
	}))
	d.action == "pending"
	d.node == ""
	d.kind == ""
	d.reasons == [{
		"code": "MalformedRequest",
		"message": "not recognized: spec.request does not parse as a certificate request: no PEM block found",
	}]
}

test_invalid_signature_is_pending_not_denied if {
	d := _decide([
		{"op": "replace", "path": "/csr/request/signature_valid", "value": false},
		{"op": "replace", "path": "/csr/request/signature_error", "value": "crypto/rsa: verification error"},
	])
	d.action == "pending"
	d.kind == ""
	d.reasons == [{
		"code": "InvalidSignature",
		"message": concat(": ", [
			"not recognized: the request's signature does not verify with its public key",
			"crypto/rsa: verification error",
		]),
	}]
}

test_every_failing_check_is_reported_sorted if {
	_codes([
		{"op": "replace", "path": "/csr/usages", "value": ["server auth"]},
		{"op": "replace", "path": "/csr/request/subject/1/value", "value": "worker-1"},
		{"op": "replace", "path": "/csr/request/subject_alt_names", "value": [{"type": "ip", "value": "10.5.0.2"}]},
	]) == ["CommonNameNotNode", "SANPresent", "UsagesNotAllowed"]
}

# --- the system:masters guard ---

test_system_masters_organization_is_never_approved if {
	d := _decide(array.concat(_add_attribute("2.5.4.10", "O", "system:masters"), _allow(true, true)))
	d.action == "pending"
	"PrivilegedSubject" in {r.code | some r in d.reasons}
}

test_guard_holds_even_when_data_names_another_organization if {
	# A bundle whose data was changed to recognize O=system:masters still cannot approve it:
	# the guard does not read data.
	d := kubelet_client.decision with input as json.patch(_good, _set("/csr/request/subject/0/value", "system:masters"))
		with kubelet_client.config as _config_with({"node_organization": "system:masters"})
	d.action == "pending"
	d.reasons == [{
		"code": "PrivilegedSubject",
		"message": concat("", [
			"the subject carries O=system:masters; a kubelet client certificate with an organization ",
			"other than system:nodes, or with system:masters, is never approved",
		]),
	}]
}

test_guard_holds_for_another_organization_that_data_allows if {
	d := kubelet_client.decision with input as json.patch(_good, _set("/csr/request/subject/0/value", "ops"))
		with kubelet_client.config as _config_with({"node_organization": "ops"})
	[r.code | some r in d.reasons] == ["PrivilegedSubject"]
}

test_system_masters_in_any_attribute_is_never_approved if {
	d := _decide(_add_attribute("1.2.3.4", "", "system:masters"))
	d.action == "pending"
	d.reasons == [{
		"code": "PrivilegedSubject",
		"message": concat("", [
			"the subject carries 1.2.3.4=system:masters; a kubelet client certificate with an organization ",
			"other than system:nodes, or with system:masters, is never approved",
		]),
	}]
}

# --- require_managed_machine ---

test_managed_machine_is_not_required_by_default if _decide([{"op": "remove", "path": "/machine"}]).action == "approve"

test_managed_machine_when_required_is_approved if {
	d := kubelet_client.decision with input as _good
		with kubelet_client.config as _config_with({"require_managed_machine": true})
	d.action == "approve"
}

test_unknown_machine_when_required_is_pending if {
	d := kubelet_client.decision with input as json.patch(_good, [{"op": "remove", "path": "/machine"}])
		with kubelet_client.config as _config_with({"require_managed_machine": true})
	d.action == "pending"
	d.kind == "selfnodeclient"
	d.reasons == [{
		"code": "MachineUnknown",
		"message": concat("", [
			`no managed machine has node name "worker-1", and data requires one; `,
			"left pending for another approver or a person",
		]),
	}]
}
