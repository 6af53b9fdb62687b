# METADATA
# title: CSR subject and usages
# description: |
#   What the CSR rules share about reading a request: the subject's common names and
#   organizations, the node name the subject claims, how a subject attribute is shown in a
#   message, and whether the usages are exactly one of the sets a signer permits. Each
#   function takes what it reads as arguments (the request as input.csr.request has it, a
#   rule's tables from its data.json) and reads neither input nor data itself.
package ichor.lib.csr

# METADATA
# title: Common names
# description: The values of the subject's common name (2.5.4.3) attributes, in the subject's order.
common_names(request) := [attr.value | some attr in request.subject; attr.oid == "2.5.4.3"]

# METADATA
# title: Organizations
# description: The values of the subject's organization (2.5.4.10) attributes, in the subject's order.
organizations(request) := [attr.value | some attr in request.subject; attr.oid == "2.5.4.10"]

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
# scope: document
# title: Attribute label
# description: How a subject attribute is named in a message, its short name (CN, O) or, without one, its OID.
attribute_label(attr) := attr.name if attr.name != ""

attribute_label(attr) := attr.oid if attr.name == ""

# METADATA
# title: Usages allowed
# description: |
#   Whether usages are exactly one of the allowed sets (a collection of usage lists, as a
#   rule's data.json has them). Compared as lists of the same length holding the same
#   usages, so a usage more, less or repeated does not match, and the order does not count.
usages_allowed(usages, allowed_sets) if {
	some allowed in allowed_sets
	count(usages) == count(allowed)
	{usage | some usage in usages} == {usage | some usage in allowed}
}
