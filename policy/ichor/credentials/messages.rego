# How the decisions of package ichor.credentials read: durations, the credential handed
# out, the grant a requester holds or lacks, and keys. Nothing here decides; the rules,
# and the package's annotations, are in credentials.rego.
package ichor.credentials

# Durations read the way Go's time.Duration prints them, which is also how spec.ttl is
# written (1h0m0s, 15m0s, 8760h0m0s). Anything but a positive whole number of seconds is
# printed as it came, in seconds.
_duration(seconds) := _hours_minutes_seconds(floor(seconds / 3600), floor(seconds / 60) % 60, seconds % 60) if {
	_whole_number(seconds)
	seconds > 0
} else := sprintf("%vs", [seconds])

_hours_minutes_seconds(hours, minutes, seconds) := sprintf("%dh%dm%ds", [hours, minutes, seconds]) if {
	hours > 0
} else := sprintf("%dm%ds", [minutes, seconds]) if {
	minutes > 0
} else := sprintf("%ds", [seconds])

# What is issued, as the Event says it: the Talos role or the certificate's groups are
# part of the sentence, so the record names the power handed out. It is read from the
# credential as admission pins it (_credential), so the Event and the pin cannot differ.
_credential_text(credential) := sprintf("an %s %s", [credential.talos_role, credential.credential]) if {
	credential.kind == "talos"
}

# A Kubernetes credential's subject: the person's identity when the requester is known, the
# fixed groups, and the person's own group when a binding of their own gives it its power.
_credential_text(credential) := sprintf("a %s (%s)", [
	credential.credential,
	concat(", ", array.concat(
		array.concat(
			[sprintf("CN=%s", [identity]) | identity := credential.common_name],
			[sprintf("O=%s", [group]) | some group in credential.groups],
		),
		[sprintf("O=their own group, bound to %s", [role]) | role := credential.bound_to],
	)),
]) if {
	credential.kind == "kubernetes"
}

_grant_text(authorization, name, namespace) := sprintf(
	"%s %s/%s %q in namespace %q",
	[authorization.verb, authorization.resource, authorization.subresource, name, namespace],
)

_sar_text(sar) := sprintf(
	"%q (groups %v) may %s %s.%s/%s %q in namespace %q",
	[sar.user, sar.groups, sar.verb, sar.resource, sar.group, sar.subresource, sar.name, sar.namespace],
)

# The authorizer's reason and evaluation error, when it gave them.
_sar_details(sar) := [concat("", [prefix, sar[key]]) |
	some [prefix, key] in [["", "reason"], ["evaluation error: ", "evaluation_error"]]
	object.get(sar, key, "") != ""
]

_with_details(message, details) := message if count(details) == 0

_with_details(message, details) := sprintf("%s: %s", [message, concat("; ", details)]) if count(details) > 0

default _key_error(_) := "it is missing"

_key_error(key) := key.error if {
	is_string(key.error)
	key.error != ""
}

# The person as the Event names them: a plain name as it is; any other quoted, with the first
# twelve hex digits of its SHA-256, so that a name of look-alike letters, spaces or
# punctuation reads neither as another person's nor as more of the sentence ("eve (lifetime
# 1h0m0s); ... was requested by alice" named alice). The authenticator, not Ichor, chooses
# the name (an OIDC claim, a client certificate's common name). A long name is cut
# (event_person), keeping its length and digest: cut by the Event's 1 kB instead, two long
# names alike in their first kilobyte read as one person.
_named(username) := username if {
	count(username) <= _config.event_person.plain_max_length
	regex.match(`^[A-Za-z0-9]([A-Za-z0-9._@:-]*[A-Za-z0-9])?$`, username)
} else := sprintf("%q (sha256 %s)", [username, _name_digest(username)]) if {
	count(username) <= _config.event_person.quoted_max_length
} else := sprintf("%q... (%d characters, sha256 %s)", [
	substring(username, 0, _config.event_person.quoted_max_length),
	count(username),
	_name_digest(username),
])

_name_digest(username) := substring(crypto.sha256(username), 0, 12)
