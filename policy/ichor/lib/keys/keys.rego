# METADATA
# title: Public keys
# description: |
#   What "a sound key" means, in one place for every rule that judges a key: the kubelet
#   serving and client certificates and the short-lived credentials. The table is this
#   package's data.json (config.algorithms): each allowed algorithm, and for each the curves
#   or the sizes it may have. A key is described by Go as facts (algorithm, curve, bits),
#   never judged there. The functions take the key and the table as arguments.
package ichor.lib.keys

_config := data.ichor.lib.keys.config

# METADATA
# title: Allowed algorithms
# description: The table of allowed keys, from data.json, for the rules to pass to allowed.
algorithms := _config.algorithms

# METADATA
# title: Key allowed
# description: |
#   Whether the key is allowed by the table: its algorithm has a row, and the row's curves
#   (when it lists some) hold the key's curve and its min_bits and max_bits (when it has
#   them) hold the key's size. A row without limits accepts any key of its algorithm.
allowed(key, algorithms) if {
	rule := algorithms[key.algorithm]
	_curve_allowed(object.get(key, "curve", ""), rule)
	size := object.get(key, "bits", 0)
	is_number(size)
	size >= max([object.get(rule, "min_bits", 0), object.get(_floor, key.algorithm, 0)])
	size <= object.get(rule, "max_bits", size)
	_curve_sound(key)
}

# The least any table may allow, whatever a bundle's data says (review 215: a table with
# RSA of 512 bits admitted a key anyone can factor): RSA of 2048 bits, and for ECDSA the
# NIST curves of 256 bits and more. Literal on purpose, not from data.
_floor := {"RSA": 2048}

_curve_sound(key) if key.algorithm != "ECDSA"

_curve_sound(key) if key.curve in {"P-256", "P-384", "P-521"}

_curve_allowed(_, rule) if not rule.curves

_curve_allowed(curve, rule) if curve in rule.curves

# METADATA
# title: Key text
# description: |
#   How a key is named in a message, such as "RSA 1024-bit" or "ECDSA P-224 224-bit"; a key
#   fact that is not an object (a hand-made input's null) is written out as it is, so that
#   the message of the check that refuses it can still be built.
text(key) := concat(" ", [part |
	some part in [object.get(key, "algorithm", ""), object.get(key, "curve", ""), _bits_text(object.get(key, "bits", 0))]
	part != ""
]) if {
	is_object(key)
} else := sprintf("%v", [key])

default _bits_text(_) := ""

_bits_text(size) := sprintf("%v-bit", [size]) if size != 0

# METADATA
# title: Allowed keys text
# description: |
#   How the table is named in a message, such as "ECDSA on curve P-256 or P-384, Ed25519,
#   RSA of 2048 to 8192 bits".
algorithms_text(algorithms) := concat(", ", [_algorithm_text(name, algorithms[name]) |
	some name in sort(object.keys(algorithms))
])

_algorithm_text(name, rule) := sprintf("%s on curve %s", [name, concat(" or ", rule.curves)]) if {
	rule.curves
} else := sprintf("%s of %d to %d bits", [name, rule.min_bits, rule.max_bits]) if {
	rule.min_bits
	rule.max_bits
} else := sprintf("%s of at least %d bits", [name, rule.min_bits]) if {
	rule.min_bits
} else := name
