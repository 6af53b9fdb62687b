package ichor.credentials_test

# The review of 2026-12-06: the authenticator chooses the name, and the Event printed it as it
# came, so a name of look-alike letters read as another person's and one holding a sentence
# read as a second record ("eve (lifetime 1h0m0s); ... was requested by ichor:alice"). A name
# that is not plain is quoted, with its digest; a plain one is named as it is.
test_the_event_quotes_and_digests_a_name_that_is_not_plain if {
	every name in [
		"ichor:\u0430lice",
		"eve (lifetime 1h0m0s); an os:admin talosconfig was requested by ichor:alice",
		"ichor:alice ",
		"ichor:eve\nan os:admin talosconfig was requested by ichor:rita",
		"-alice",
	] {
		message := _admit(_as_user(name)).event.message
		quoted := sprintf("was requested by %q (sha256 %s) (lifetime 1h0m0s)", [name, substring(crypto.sha256(name), 0, 12)])
		endswith(message, quoted)
	}
	every name in ["ichor:alice", "alice@example.com", "a", "system:serviceaccount:team-a:ci-1"] {
		endswith(_admit(_as_user(name)).event.message, sprintf("was requested by %s (lifetime 1h0m0s)", [name]))
	}
}

_as_user(name) := [
	{"op": "replace", "path": "/user/username", "value": name},
	{"op": "replace", "path": "/requester/username", "value": name},
	{"op": "replace", "path": "/authorization/user", "value": name},
]
