# What only the issuer checks, right before it signs: that the webhook admitted exactly this
# request, and that admin kubeconfigs are not revoked (the person's own binding is checked
# in identity.rego).
package ichor.credentials

# METADATA
# title: Not admitted
# description: |
#   The request carries no proof that this policy's admission webhook admitted it: no
#   admission record (the Event the webhook writes on the TalosCluster before it admits)
#   exists for its uid, or the record's MAC, made with a key only the manager holds over
#   the request's uid, namespace, name, spec and requester, the cluster's uid and the
#   admission's decision id (and the lifetime and the credential admitted, in MACs of their
#   own), does not verify.
#   Such a request
#   was created while the webhook was not serving (uninstalled, or its configuration deleted
#   or narrowed), or its record expired with the API server's --event-ttl (1h by default).
#   It stays refused when the webhook comes back; ask again with a new request.
# custom:
#   code: NotAdmitted
_refused_at_issuance contains reason if {
	not _admission_proven
	reason := {
		"code": "NotAdmitted",
		"message": _not_admitted_text,
	}
}

# METADATA
# title: Admin kubeconfigs revoked by the operator
# description: |
#   The credential is an admin kubeconfig (its person's own binding gives it its power) and
#   the operator revoked admin kubeconfigs (the chart value adminCredentials.enabled=false,
#   the manager flag --admin-kubeconfigs=false), under which the manager also deletes every
#   person's binding. None is issued, and no binding is made. Checked before signing.
# custom:
#   code: AdminKubeconfigsRevoked
_refused_at_issuance contains reason if {
	_binding_role
	not input.settings.admin_kubeconfigs == true
	reason := {
		"code": "AdminKubeconfigsRevoked",
		"message": concat("", [
			"the operator revoked admin kubeconfigs (--admin-kubeconfigs=false, ",
			"chart value adminCredentials.enabled=false); none is issued",
		]),
	}
}

# METADATA
# title: Lifetime not the one admitted
# description: |
#   The admission record says the lifetime it admitted (under a MAC), and the credential
#   would now have another: the request asked for no ttl, and the bundle changed the
#   purpose's default between admission and signing. The Event that names the person says
#   the lifetime admitted, and what is signed is what was admitted, so it is refused; ask
#   again. A record of a webhook older than this check says no lifetime, and nothing is
#   compared. Checked before signing.
# custom:
#   code: LifetimeNotAdmitted
_refused_at_issuance contains reason if {
	_admission_proven
	admitted := input.admission.lifetime_seconds
	lifetime := _lifetime(_request, _config.purposes)
	admitted != lifetime
	reason := {
		"code": "LifetimeNotAdmitted",
		"message": sprintf("%s %s, not the %v seconds admitted %s", [
			"the credential would now live", _duration(lifetime), admitted,
			"(the purpose's default changed since); ask again with a new request",
		]),
	}
}

# METADATA
# title: Credential not the one admitted
# description: |
#   The admission record names the credential it admitted (under a MAC): the Talos role, or
#   the certificate's common name, fixed groups and the role the person's own group is bound
#   to. The purpose now maps to another: the bundle changed it between admission and
#   signing. The Event that names the person says the credential admitted, and what is
#   signed is what was admitted, so it is refused; ask again. What is compared is what the
#   certificate carries: a purpose's label (its credential text) and the order of its groups
#   may change. A record of a webhook older than this check names no credential, and nothing
#   is compared. Checked before signing.
# custom:
#   code: CredentialNotAdmitted
_refused_at_issuance contains reason if {
	_admission_proven
	admitted := input.admission.credential
	purpose := _config.purposes[_request.purpose]
	now := _credential(purpose, _subject_name(_requester))
	_signed(admitted) != _signed(now)
	[now_text, admitted_text] := _credentials_told_apart(now, admitted)
	reason := {
		"code": "CredentialNotAdmitted",
		"message": sprintf(
			"the credential would now be %s, not %s as admitted (%s); ask again with a new request",
			[now_text, admitted_text, "the purpose changed since"],
		),
	}
}

# METADATA
# title: Secrets Secret does not name the cluster
# description: |
#   The Secret the cluster's spec.secretsRef names, whose CAs would sign, does not name the
#   cluster in its annotation ichor.dev/talos-clusters (TalosCluster names, comma-separated,
#   or "*"), or has no such annotation while the manager requires one
#   (--require-secrets-claim, the chart value manager.requireSecretsClaim). The Secret, not
#   the TalosCluster, says which clusters may use its CAs, so whoever may edit a
#   TalosCluster but not the Secrets cannot have another cluster's CAs sign for it. A
#   request without the fact is refused. Checked before signing, and again by the issuer
#   where it reads the CAs.
# custom:
#   code: SecretsNotClaimed
_refused_at_issuance contains reason if {
	input.cluster.exists == true
	not input.secrets.claimed == true

	# A Secret that could not be read is no claim to judge (SecretsUnusable says why).
	not input.secrets.read == false
	reason := {
		"code": "SecretsNotClaimed",
		"message": _not_claimed_text,
	}
}

# METADATA
# title: Secrets Secret unusable
# description: |
#   The Secret the cluster's spec.secretsRef names could not be read (it does not exist, or
#   the manager may not read Secrets in the namespace: the chart value
#   rbac.secretsNamespaces), or it names the cluster but holds no secrets bundle with the
#   CAs the issuer signs with (the key secretsRef.key, by default secrets.yaml, missing or
#   not what `talosctl gen secrets` writes). Nothing could be signed, so it is refused, and
#   no admin binding is made; the message says what the issuer found. Checked before signing.
# custom:
#   code: SecretsUnusable
_refused_at_issuance contains reason if {
	input.cluster.exists == true
	_secrets_unusable
	secret := object.get(input, ["secrets", "secret"], "")
	reason := {
		"code": "SecretsUnusable",
		"message": sprintf("the secrets Secret %q of TalosCluster %q cannot sign: %s", [secret, _cluster, _secrets_error]),
	}
}

_secrets_unusable if input.secrets.read == false

_secrets_unusable if {
	input.secrets.claimed == true
	not input.secrets.usable == true
}

default _secrets_error := "nothing says why"

_secrets_error := input.secrets.error if {
	is_string(input.secrets.error)
	input.secrets.error != ""
}

_not_claimed_text := sprintf("TalosCluster %q may not use the CAs of Secret %q: %s", [_cluster, secret, why]) if {
	secret := input.secrets.secret
	is_string(secret)
	why := input.secrets.claim_error
	is_string(why)
	why != ""
} else := sprintf("nothing says that the secrets Secret of TalosCluster %q names it", [_cluster])

# What of a pinned credential the certificate carries: all but its label, the groups as a set.
_signed(credential) := object.union(
	object.remove(credential, ["credential", "groups"]),
	{"groups": {group | some group in object.get(credential, "groups", [])}},
)

# The two credentials as the Event names them, or as JSON when that does not tell them apart
# (a record of another policy's shape).
_credentials_told_apart(now, admitted) := [_credential_text(now), text] if {
	text := _credential_text(admitted)
	text != _credential_text(now)
} else := [json.marshal(now), json.marshal(admitted)]

_admission_proven if {
	input.admission.recorded == true
	input.admission.verified == true
}

_not_admitted_text := concat("", [
	"no admission of this request by Ichor's webhook is recorded: it was created while the webhook ",
	"was not serving, or its admission record (an Event, which expires with the API server's ",
	"--event-ttl) is gone; ask again with a new request",
]) if {
	not input.admission.recorded == true
} else := sprintf(
	"the admission record of this request does not prove it: %s; ask again with a new request",
	[_admission_error],
)

default _admission_error := "it does not verify"

_admission_error := input.admission.error if {
	is_string(input.admission.error)
	input.admission.error != ""
}
