# METADATA
# title: Remote kubeconfig
# description: |
#   Decides whether a TalosCluster's spec.kubeconfigRef may be used: a kubeconfig a tenant
#   wrote into a Secret of the cluster's namespace, with which the manager watches and
#   approves that cluster's kubelet serving requests. Whatever a kubeconfig says would take
#   effect inside the manager's process: a token file or a client certificate path (the
#   manager's own ServiceAccount token sent to the tenant's server), a command to run, an
#   auth provider, a proxy, an impersonation. So a kubeconfig may say only: a server (https),
#   its CA data and TLS server name, and credential data (a bearer token, or a client
#   certificate and key), in one context that is current or alone. Each key of the document
#   is looked up, by its path, in data.json's fields table; one the kubeconfig schema does
#   not have is refused, not ignored. insecure-skip-tls-verify is refused unless the
#   operator allows it (--remote-kubeconfig-allow-insecure).
#
#   The decision is made in two steps, both logged. The document first, without a
#   connection: a refused document is never connected to. When its fields pass, the
#   decision asks (check_identity) for what the server is: the manager makes a TLS
#   handshake with it, sending nothing, and decides again with input.server_identity. A
#   server that presents the key of the API server the manager runs against, or whose
#   certificate chains to that API server's CA, is refused (ServerIsLocal): only the
#   operator names the clusters that judge that API server (--local-clusters).
#
#   Input: cluster (namespace, name); kubeconfig (the facts of the document: bytes,
#   max_bytes, parsed, error, fields [{path, field}], field_count, unknown_fields,
#   contexts, clusters, users, current_context, and context: the context in use with
#   name, cluster, user, cluster_found, user_found, server {url, scheme, host, user_info,
#   error}, ca_data, insecure_skip_tls_verify, tls_server_name, credentials {token,
#   client_certificate_data, client_key_data}, each a presence, never the data);
#   settings (allow_insecure_skip_tls_verify); server_identity (same_key_as_local,
#   verifies_with_local_ca, local_ca_known), absent in the first step.
package ichor.kubeconfig

import data.ichor.lib.reasons as lib_reasons

# The tables of data.json, beside this file. They sit under "config" because the
# package's own rules share the path data.ichor.kubeconfig.
_config := data.ichor.kubeconfig.config

# Missing, the facts are an empty document, so that every check still runs and fails closed.
default _kubeconfig := {}

_kubeconfig := input.kubeconfig

# METADATA
# title: Kubeconfig decision
# description: |
#   {"allowed": bool, "check_identity": bool, "reasons": [{"code", "message"}]}. Every
#   refusal of the document is listed, sorted by code, at most max_reasons_per_code of each
#   code. check_identity is true when the document passes and the server's identity is not
#   in the input yet: the manager then makes a TLS handshake with the server (no request,
#   no credential) and asks again.
# entrypoint: true
decision := {
	"allowed": false,
	"check_identity": false,
	"reasons": lib_reasons.capped(_refused, _config.max_reasons_per_code),
} if {
	count(_refused) > 0
} else := {"allowed": false, "check_identity": true, "reasons": [_unchecked]} if {
	not input.server_identity
} else := {"allowed": false, "check_identity": false, "reasons": sort(_refused_identity)} if {
	count(_refused_identity) > 0
} else := {"allowed": true, "check_identity": false, "reasons": [_allowed]}

# METADATA
# title: Kubeconfig allowed
# description: |
#   The document says only what a kubeconfigRef may say, and its server is not the API
#   server the manager runs against. The client is built from the server, the CA data,
#   the TLS server name and the credential data alone.
# custom:
#   code: KubeconfigAllowed
_allowed := {
	"code": "KubeconfigAllowed",
	"message": sprintf(
		"the kubeconfig of %s names server %q with %s; nothing else in it takes effect",
		[_cluster_name, _context.server.url, _credential_kind],
	),
}

# METADATA
# title: Server identity unchecked
# description: |
#   The document passes; what the server is has not been looked at yet. Not a refusal the
#   cluster keeps: the manager makes the TLS handshake and decides again.
# custom:
#   code: ServerIdentityUnchecked
_unchecked := {
	"code": "ServerIdentityUnchecked",
	"message": sprintf("the server %q of the kubeconfig has not been identified yet", [_context.server.url]),
}

_cluster_name := sprintf(
	"TalosCluster %s/%s",
	[object.get(input, ["cluster", "namespace"], ""), object.get(input, ["cluster", "name"], "")],
)

default _context := {"server": {"url": ""}, "credentials": {}}

_context := _kubeconfig.context

default _credential_kind := "a client certificate"

_credential_kind := "a bearer token" if _context.credentials.token

_fields := object.get(_kubeconfig, "fields", [])

_unknown := {path | some path in object.get(_kubeconfig, "unknown_fields", [])}

_parsed if _kubeconfig.parsed == true

_too_large if object.get(_kubeconfig, "bytes", 0) > object.get(_kubeconfig, "max_bytes", 0)

# The fields of a category, by path; a field below one refused (the command of an exec,
# say) is covered by it.
_fields_of(category) := [f.path | some f in _fields; _config.fields[f.field] == category]

_covered(field) if {
	some name, category in _config.fields
	category != "allowed"
	some sep in [".", "["]
	startswith(field, concat("", [name, sep]))
}

# METADATA
# title: Kubeconfig too large
# description: |
#   The document is larger than the manager reads (max_bytes); it was not parsed.
# custom:
#   code: KubeconfigTooLarge
_refused contains reason if {
	not _parsed
	_too_large
	reason := {
		"code": "KubeconfigTooLarge",
		"message": sprintf(
			"the kubeconfig is %d bytes, more than the %d a kubeconfig may be",
			[_kubeconfig.bytes, _kubeconfig.max_bytes],
		),
	}
}

# METADATA
# title: Kubeconfig malformed
# description: |
#   The document could not be read: not YAML or JSON, a key given twice, not a mapping, or
#   a value not of its field's type. Absent facts are refused here too.
# custom:
#   code: KubeconfigMalformed
_refused contains reason if {
	not _parsed
	not _too_large
	reason := {
		"code": "KubeconfigMalformed",
		"message": sprintf("the kubeconfig cannot be read: %q", [object.get(_kubeconfig, "error", "no facts")]),
	}
}

# METADATA
# title: Too many fields
# description: |
#   The document has more keys than max_fields; a kubeconfig with one context has a few
#   tens. Its fields are not all listed, so it is refused whole.
# custom:
#   code: TooManyFields
_refused contains reason if {
	_kubeconfig.field_count > _config.max_fields
	reason := {
		"code": "TooManyFields",
		"message": sprintf(
			"the kubeconfig has %d fields, more than the %d allowed",
			[_kubeconfig.field_count, _config.max_fields],
		),
	}
}

# METADATA
# title: Unknown field
# description: |
#   A key the kubeconfig schema does not have (clientcmd's v1 types), compared exactly:
#   clientcmd would ignore it or match it case-insensitively; here it is refused.
# custom:
#   code: UnknownField
_refused contains reason if {
	some path in _unknown
	reason := {
		"code": "UnknownField",
		"message": sprintf("field %q is not a kubeconfig field", [path]),
	}
}

# METADATA
# title: Path field
# description: |
#   A field that names a file (tokenFile, client-certificate, client-key,
#   certificate-authority): it would be read from the manager's file system, where the
#   manager's own ServiceAccount token and keys are. Give the data instead (token,
#   client-certificate-data, client-key-data, certificate-authority-data).
# custom:
#   code: PathField
_refused contains reason if {
	some path in _fields_of("path")
	reason := {
		"code": "PathField",
		"message": sprintf("field %q names a file of the manager's; give the data itself (the *-data fields, token)", [path]),
	}
}

# METADATA
# title: Exec credential plugin
# description: |
#   users[].user.exec: a command the manager would run, with its environment.
# custom:
#   code: ExecPlugin
_refused contains reason if {
	some path in _fields_of("exec")
	reason := {
		"code": "ExecPlugin",
		"message": sprintf("field %q would run a command in the manager", [path]),
	}
}

# METADATA
# title: Auth provider
# description: |
#   users[].user.auth-provider: a plugin of client-go that obtains credentials in the
#   manager's process.
# custom:
#   code: AuthProvider
_refused contains reason if {
	some path in _fields_of("auth_provider")
	reason := {
		"code": "AuthProvider",
		"message": sprintf("field %q would run an auth provider in the manager", [path]),
	}
}

# METADATA
# title: Proxy URL
# description: |
#   clusters[].cluster.proxy-url: every request, with its credentials, would go through a
#   proxy the tenant names.
# custom:
#   code: ProxyURL
_refused contains reason if {
	some path in _fields_of("proxy")
	reason := {
		"code": "ProxyURL",
		"message": sprintf("field %q would send the manager's requests through a proxy", [path]),
	}
}

# METADATA
# title: Impersonation
# description: |
#   as, as-uid, as-groups, as-user-extra: the requests would act as someone else than the
#   credential's user.
# custom:
#   code: Impersonation
_refused contains reason if {
	some path in _fields_of("impersonation")
	reason := {
		"code": "Impersonation",
		"message": sprintf("field %q would impersonate another user", [path]),
	}
}

# METADATA
# title: Field not allowed
# description: |
#   A kubeconfig field that a kubeconfigRef may not hold: basic-auth username and
#   password, extensions, or any field the table in data.json does not list.
# custom:
#   code: FieldNotAllowed
_refused contains reason if {
	some f in _fields
	not _unknown[f.path]
	not _allowed_field(f.field)
	not _covered(f.field)
	reason := {
		"code": "FieldNotAllowed",
		"message": sprintf("field %q may not be in a kubeconfigRef", [f.path]),
	}
}

# METADATA
# title: Insecure TLS
# description: |
#   The cluster in use sets insecure-skip-tls-verify: anyone on the path could read the
#   credential. Refused unless the operator allows it (--remote-kubeconfig-allow-insecure,
#   chart value manager.remoteKubeconfigAllowInsecure).
# custom:
#   code: InsecureSkipTLSVerify
_refused contains reason if {
	_context.insecure_skip_tls_verify == true
	not input.settings.allow_insecure_skip_tls_verify == true
	reason := {
		"code": "InsecureSkipTLSVerify",
		"message": sprintf(
			"cluster %q sets insecure-skip-tls-verify, which the operator has not allowed (--remote-kubeconfig-allow-insecure)",
			[_context.cluster],
		),
	}
}

# METADATA
# title: Context ambiguous
# description: |
#   More than one context and no current-context: which one is meant is a guess.
# custom:
#   code: ContextAmbiguous
_refused contains reason if {
	_parsed
	_kubeconfig.contexts > 1
	_kubeconfig.current_context == ""
	reason := {
		"code": "ContextAmbiguous",
		"message": sprintf("the kubeconfig has %d contexts and no current-context", [_kubeconfig.contexts]),
	}
}

# METADATA
# title: Context not found
# description: |
#   No context is in use: the kubeconfig has none, or current-context names none of them.
# custom:
#   code: ContextNotFound
_refused contains reason if {
	_parsed
	not _kubeconfig.context
	not _ambiguous
	reason := {
		"code": "ContextNotFound",
		"message": sprintf(
			"the kubeconfig has no context to use (%d contexts, current-context %q)",
			[_kubeconfig.contexts, _kubeconfig.current_context],
		),
	}
}

# METADATA
# title: Context incomplete
# description: |
#   The context in use names a cluster or a user the kubeconfig does not have.
# custom:
#   code: ContextIncomplete
_refused contains reason if {
	_kubeconfig.context
	some kind in ["cluster", "user"]
	not _kubeconfig.context[concat("_", [kind, "found"])]
	reason := {
		"code": "ContextIncomplete",
		"message": sprintf(
			"context %q names %s %q, which the kubeconfig does not have",
			[_context.name, kind, _context[kind]],
		),
	}
}

# METADATA
# title: Server not https
# description: |
#   The server of the cluster in use is not an https URL with a host and without a user
#   name or password in it: the credential would cross the network in clear, or the URL
#   cannot be read.
# custom:
#   code: ServerNotHTTPS
_refused contains reason if {
	_context.cluster_found
	not _https(_context.server)
	reason := {
		"code": "ServerNotHTTPS",
		"message": sprintf(
			"server %q of cluster %q is not an https URL with a host",
			[_context.server.url, _context.cluster],
		),
	}
}

# METADATA
# title: Credentials missing
# description: |
#   The user in use has no credential data the manager may use: a bearer token (token),
#   or a client certificate and its key (client-certificate-data and client-key-data,
#   both). The manager lends none of its own.
# custom:
#   code: CredentialsMissing
_refused contains reason if {
	_context.user_found
	not _credentials_complete(_context.credentials)
	reason := {
		"code": "CredentialsMissing",
		"message": sprintf(
			"user %q has no token and not both client-certificate-data and client-key-data; %s",
			[_context.user, "the manager lends no credential of its own"],
		),
	}
}

# METADATA
# title: Server is the manager's own API server
# description: |
#   The server presents the key of the API server the manager runs against, or a
#   certificate its CA issued: it is that API server (by another name or address, or
#   through a relay), or a server its cluster vouches for. A cluster that judges the
#   manager's own API server is named by the operator (--local-clusters), never by a
#   kubeconfigRef.
# custom:
#   code: ServerIsLocal
_refused_identity contains reason if {
	some fact in ["same_key_as_local", "verifies_with_local_ca"]
	input.server_identity[fact] == true
	reason := {
		"code": "ServerIsLocal",
		"message": sprintf(
			"server %q is the API server the manager runs against (%s); %s",
			[
				_context.server.url, _identity_words[fact],
				"only the operator names the clusters that judge it (--local-clusters)",
			],
		),
	}
}

_identity_words := {
	"same_key_as_local": "it presents the same key",
	"verifies_with_local_ca": "its certificate is issued by the same CA",
}

# A field the table lists as allowed, or that one of the rules above names.
_allowed_field(field) if _config.fields[field] in _named_categories

_named_categories := {"allowed", "insecure", "path", "exec", "auth_provider", "proxy", "impersonation"}

_ambiguous if {
	_kubeconfig.contexts > 1
	_kubeconfig.current_context == ""
}

_https(server) if {
	object.get(server, "error", "") == ""
	server.scheme == "https"
	server.host != ""
	server.user_info == false
}

_credentials_complete(creds) if {
	creds.client_certificate_data == creds.client_key_data
	some kind in ["token", "client_certificate_data"]
	creds[kind] == true
}
