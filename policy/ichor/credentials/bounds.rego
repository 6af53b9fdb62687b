package ichor.credentials

# METADATA
# title: Lifetime above the cap
# description: |
#   The lifetime (spec.ttl, else the purpose's default) is longer than the purpose's cap. It
#   is refused, never shortened, so that nobody holds a credential that lives other than they
#   asked. The default is checked too, so a table whose default exceeds its cap signs nothing.
#   The cap is the table's, and never above the source documents' whatever the table says:
#   12 hours for a talosconfig-reader (ADR 0124), a year for any credential (KEP-4214).
#   Checked at admission and again before signing.
# custom:
#   code: LifetimeTooLong
_lifetime_too_long(request, purposes) := {reason |
	bound := _lifetime_bound(request.purpose)
	limit := min([object.get(purposes[request.purpose], "max_lifetime_seconds", bound), bound])
	lifetime := _lifetime(request, purposes)
	lifetime > limit
	reason := {
		"code": "LifetimeTooLong",
		"message": sprintf(
			"the lifetime %s is above the cap of %s for purpose %q; it is refused, not shortened",
			[_duration(lifetime), _duration(limit), request.purpose],
		),
	}
}

# The caps the source documents set. Literal on purpose, not from data: a bundle's data can
# be replaced, these bounds cannot (review 210: a table with a two-year cap signed for two
# years).
_lifetime_bound(purpose) := 43200 if purpose == "talosconfig-reader"

else := 31536000

# METADATA
# title: Group not allowed
# description: |
#   A credential carries system:masters, which authorization never checks and no RBAC can
#   revoke, only as the break-glass kubeconfig (kubeconfig-super-admin, KEP-4214), whatever
#   the table says: the admin kubeconfig is bound to a group RBAC can revoke, never to
#   system:masters. Literal on purpose, not from data, as the lifetime's bounds. Checked at
#   admission and again before signing.
# custom:
#   code: GroupNotAllowed
_group_not_allowed(request, purposes) := {reason |
	request.purpose != "kubeconfig-super-admin"
	"system:masters" in object.get(purposes[request.purpose], "groups", [])
	reason := {
		"code": "GroupNotAllowed",
		"message": sprintf(
			"purpose %q would carry the group system:masters, which only the break-glass kubeconfig-super-admin may",
			[request.purpose],
		),
	}
}
