# METADATA
# title: CSR subject and usages
# description: |
#   What the CSR rules share about reading a request: whether it is exactly what the
#   signer signs, the subject's common names and
#   organizations, the node name the subject claims and how a result names it, how a
#   subject attribute is shown in a message, and whether the usages are exactly one of the sets a signer permits. Each
#   function takes what it reads as arguments (the request as input.csr.request has it, a
#   rule's tables from its data.json) and reads neither input nor data itself.
package ichor.lib.csr

# METADATA
# title: Common names
# description: The values of the subject's common name (2.5.4.3) attributes, in the subject's order.
common_names(request) := [attr.value | is_array(request.subject); some attr in request.subject; attr.oid == "2.5.4.3"]

# METADATA
# title: Organizations
# description: The values of the subject's organization (2.5.4.10) attributes, in the subject's order.
organizations(request) := [attr.value | is_array(request.subject); some attr in request.subject; attr.oid == "2.5.4.10"]

# METADATA
# title: Node name
# description: |
#   The node name the subject claims: its one common name with the prefix (system:node:)
#   and a non-empty name after it, the name without the prefix. "" when the subject has no
#   or several common names, a common name without the prefix or one that is only the
#   prefix, so that a caller always has a string and "" never names a node. The same
#   reading as Go's csrinput.NodeName.
node_name(request, prefix) := name if {
	names := common_names(request)
	count(names) == 1
	startswith(names[0], prefix)
	name := trim_prefix(names[0], prefix)
	name != ""
} else := ""

# METADATA
# title: Node name as a result names it
# description: |
#   A node name for a decision's result, which is logged at each look: a node's name is at
#   most a DNS subdomain's 253 characters, and a longer one (a requester's common name, as
#   long as it likes) is no node's and is cut, with its length.
logged_node(name) := name if count(name) <= 253

else := sprintf("%s... (%d bytes)", [substring(name, 0, 253), count(name)])

# METADATA
# scope: document
# title: Attribute label
# description: How a subject attribute is named in a message, its short name (CN, O) or, without one, its OID.
attribute_label(attr) := attr.name if {
	is_string(attr.name)
	attr.name != ""
} else := attr.oid if {
	is_string(attr.oid)
} else := sprintf("%v", [attr])

# METADATA
# title: Usages allowed
# description: |
#   Whether usages are exactly one of the allowed sets (a collection of usage lists, as a
#   rule's data.json has them). Compared as lists of the same length holding the same
#   usages, so a usage more, less or repeated does not match, and the order does not count.
usages_allowed(usages, allowed_sets) if {
	is_array(usages)
	some allowed in allowed_sets
	count(usages) == count(allowed)
	{usage | some usage in usages} == {usage | some usage in allowed}
}

# METADATA
# title: Malformed request
# description: |
#   Why spec.request is not exactly a request kube-controller-manager signs, as messages
#   that follow "spec.request"; empty when it is one. Its signer and approver read the
#   first PEM block and take it only when its type is CERTIFICATE REQUEST (k8s.io/kubernetes
#   pkg/apis/certificates/v1.ParseCSR): a NEW CERTIFICATE REQUEST or any other type is
#   refused. PEM headers change nothing the signer reads and are allowed. A further block is
#   refused: the signer never reads it, but a person or a tool reading the object might. An
#   input without request.pem (logged before Go gave it) has no PEM problem, and one without
#   a parse error (no request at all) still gets its message: a reason that cannot be built
#   would let the request through. A request parsed only when its parsed fact is the boolean
#   true: a hand-made input's null or "yes" is truthy to a bare reference.
malformed(request) := unparsed | pem if {
	unparsed := {sprintf("does not parse as a certificate request: %s", [_parse_error(request)]) |
		not request.parsed == true
	}
	pem := {message |
		request.parsed == true
		some message in [
			_first_type_problem(object.get(request, ["pem", "types"], ["CERTIFICATE REQUEST"])),
			_blocks_problem(object.get(request, ["pem", "blocks"], 1)),
		]
		message != ""
	}
}

_parse_error(request) := request.parse_error if {
	is_string(request.parse_error)
} else := "the input holds no parse error (no request was given)"

_first_type_problem(types) := "" if {
	types[0] == "CERTIFICATE REQUEST"
} else := sprintf(
	"is a PEM block of type %q; kube-controller-manager signs only a CERTIFICATE REQUEST block",
	[_first(types)],
)

# The first of a PEM's block types as a message names it: whatever the input holds there.
_first(types) := types[0] if {
	is_array(types)
	is_string(types[0])
} else := sprintf("%v", [types])

_blocks_problem(blocks) := "" if {
	blocks <= 1
} else := sprintf(
	"holds %d PEM blocks; the signer reads the first only, and a reader of the object may see another",
	[blocks],
)

# METADATA
# title: List
# description: |
#   A fact that should be a list (a request's names, its extensions) as one: none for null,
#   and anything else that is not a list as a list of it, so that a check over the items sees
#   it; a hand-made input's fact that could not be iterated would be skipped by every check.
#   Given the fact rather than the request: a call's arguments are hashed, and a request's
#   are many.
list(value) := value if {
	is_array(value)
} else := [] if {
	value == null
} else := [value]

# METADATA
# title: Name field as text
# description: |
#   A name's type or value as a message shows it: the string, or whatever else the input
#   holds there (a name that is not a {"type", "value"} object, a field that is not a
#   string) written out. Only messages read it, so a request's well-formed names cost nothing.
name_text(name, field) := name[field] if {
	is_string(name[field])
} else := sprintf("%v", [name[field]]) if {
	is_object(name)
	field in object.keys(name)
} else := "" if {
	field == "type"
} else := sprintf("%v", [name])
