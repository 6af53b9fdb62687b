package ichor.kubelet_serving

import data.ichor.lib.csr as lib_csr

# The name checks, one message per name of sans that is not the node's as input.node
# reports it: the same checks judge a request (approval) and a certificate in service
# (the audit), so "no longer the node's" means exactly "would not be approved today".
# Empty names are dropped so that an empty DNS name can never match a node with no hostname.
_dns_names_not_node(sans, node) := {msg |
	some san in sans
	san.type == "dns"

	# Read before the not, so that a name without a value is not skipped.
	value := object.get(san, "value", null)
	not value in names
	msg := sprintf(
		"DNS name %q is neither the node's Nodename %q nor its hostname %q",
		[lib_csr.name_text(san, "value"), object.get(node, "nodename", ""), object.get(node, "hostname", "")],
	)
} if {
	# The node's DNS names, those it has: a node read without one has none of it.
	names := {name |
		some field in ["nodename", "hostname"]
		name := object.get(node, field, "")
		is_string(name)
		name != ""
	}
}

# One message per name of sans of a type no kubelet serving certificate may have (allowed_san_types
# of data.json): what refuses a request (SANTypeForbidden) finds a certificate in service drifted.
_sans_of_forbidden_type(sans) := {msg |
	some san in sans
	not san in allowed
	msg := sprintf(
		"subject alternative name %q of type %s is not allowed; only DNS names and IP addresses are",
		[lib_csr.name_text(san, "value"), lib_csr.name_text(san, "type")],
	)
} if {
	# The names of an allowed type; a name without a type (or not an object) is none of them,
	# where a lookup of its missing type under not would skip it.
	allowed := {san | some san in sans; _config.allowed_san_types[san.type]}
}

# Whether sans name nothing. Approval asks it of every name requested (SANMissing: a request
# without any name); the audit of those of an allowed type, since a certificate in service has
# had no approval to refuse its other names.
_sans_missing(sans) if count(sans) == 0

_ips_not_node(sans, node) := {msg |
	some san in sans
	san.type == "ip"
	value := object.get(san, "value", null)
	not value in {addr | some addr in node.addresses; is_string(addr)}
	msg := sprintf(
		"IP address %s is not one of the node's addresses %v",
		[lib_csr.name_text(san, "value"), object.get(node, "addresses", [])],
	)
}
