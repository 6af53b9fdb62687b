package ichor.credentials_test

# The review of 2026-12-06: the authenticator chooses the name, and the Event printed it as it
# came, so a name of look-alike letters read as another person's and one holding a sentence
# read as a second record ("eve (lifetime 1h0m0s); ... was requested by ichor:alice"). A name
# that is not plain is quoted, with its digest; a plain one is named as it is.
test_the_event_quotes_and_digests_a_name_that_is_not_plain if {
	every name in [
		"ichor:\u0430lice",
		"eve (lifetime 1h0m0s); an os:admin talosconfig by ichor:al",
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

# The review of 2026-12-06 (161): a name over a kilobyte lost its digest when the Event was
# cut to its 1 kB, so two long names alike in their first kilobyte read as one person. Cut
# by the rule instead, each keeps its length and digest, and the message fits an Event even
# when every character is quoted at ten bytes.
test_a_long_name_is_cut_keeping_its_digest if {
	long := concat("", [concat("", [x | some _ in numbers.range(1, 300); x := "alice"]), "-1"])
	other := concat("", [concat("", [x | some _ in numbers.range(1, 300); x := "alice"]), "-2"])
	message := _admit(_as_user(long)).event.message
	tail := sprintf("(%d characters, sha256 %s) (lifetime 1h0m0s)", [count(long), substring(crypto.sha256(long), 0, 12)])
	endswith(message, tail)
	contains(message, sprintf("%q...", [substring(long, 0, _config.event_person.quoted_max_length)]))
	message != _admit(_as_user(other)).event.message

	# Not plain and longer than the quoted cut: cut there.
	odd := concat("", ["ichor: ", concat("", [x | some _ in numbers.range(1, 20); x := "alice"])])
	odd_tail := sprintf("(%d characters, sha256 %s) (lifetime 1h0m0s)", [count(odd), substring(crypto.sha256(odd), 0, 12)])
	endswith(_admit(_as_user(odd)).event.message, odd_tail)

	# Each character quoted at its longest: an unprintable one beyond the Basic Plane.
	tags := concat("", [x | some _ in numbers.range(1, 2000); x := "\udb40\udc01"])
	count(_admit(_as_user(tags)).event.message) <= 1024
	contains(_admit(_as_user(tags)).event.message, substring(crypto.sha256(tags), 0, 12))
}

# A ServiceAccount's username, at its longest, is plain and named as it is.
test_a_plain_name_at_the_length_is_as_it_is if {
	name := concat("", [x | some _ in numbers.range(1, _config.event_person.plain_max_length); x := "a"])
	endswith(_admit(_as_user(name)).event.message, sprintf("was requested by %s (lifetime 1h0m0s)", [name]))
	account := concat(":", [
		"system:serviceaccount",
		concat("", [x | some _ in numbers.range(1, 63); x := "n"]),
		concat("", [x | some _ in numbers.range(1, 253); x := "s"]),
	])
	endswith(_admit(_as_user(account)).event.message, sprintf("was requested by %s (lifetime 1h0m0s)", [account]))
	count(_admit(_as_user(account)).event.message) <= 1024
}
