# METADATA
# title: Decision-log masking
# description: |
#   What the decision log must not keep. The requester's "extra" attributes come from
#   whatever authenticator the cluster uses (an authenticating proxy, OIDC claims) and can
#   hold personal or secret values; each value of a key not listed in data.json is
#   replaced, so the key stays visible and the value does not. The extra attributes sit
#   under input.csr (CSR decisions), input.user (credential admission: who made the
#   request) and input.requester (spec.requester, at admission and issuance). One rule reads
#   extra: admission compares spec.requester with the user (RequesterMismatch). Both are
#   masked alike, so a masked entry replays to the same decision unless the two differed in
#   a masked value only; the logged result still says what was decided.
#
#   What the log must not be made to keep in bulk: a hostile request can carry thousands of
#   names, attributes or extensions, and each name can be long. The lists of data.json's
#   capped_lists keep their first max_logged_items items, each string of an item cut to
#   max_logged_value_length, and the result keeps its first max_logged_reasons reasons, each
#   message cut likewise. The strings of data.json's capped_strings (the free text an audited
#   kubelet or node chooses: a certificate's issuer, serial and errors, the node's error; and
#   the names a requester or a tenant's API server chooses: a CSR's name, user and UID, a
#   binding's name) are cut to max_logged_value_length too, and so are the values of each
#   extra attribute (kept or redacted), and its keys, of which the first max_logged_items are
#   kept. input.log_truncated then says what was cut and how much, so that
#   `ichor decisions replay` does not take a shortened input for the request.
package system.log

_config := data.system.log.config

# METADATA
# title: Mask
# description: The JSON patch operations OPA's decision-log plugin applies to each entry before it is written.
# entrypoint: true
mask contains {"op": "upsert", "path": sprintf("/input/%s/extra", [holder]), "value": _masked(extra)} if {
	some holder in _config.extra_holders
	extra := input.input[holder].extra
	_to_mask(extra)
}

# METADATA
# title: Mask
# description: Long lists of the input are cut, and their long strings.
mask contains {"op": "upsert", "path": concat("/", array.concat(["", "input"], path)), "value": kept} if {
	some path, items in _oversized
	kept := [_cut_item(item) | some item in array.slice(items, 0, _config.max_logged_items)]
}

# METADATA
# title: Mask
# description: Long free-text strings of the input are cut.
mask contains {"op": "upsert", "path": concat("/", array.concat(["", "input"], path)), "value": _cut(value)} if {
	some path, value in _long_strings
}

# METADATA
# title: Mask
# description: Long reason lists of the result are cut, and long messages.
mask contains {"op": "upsert", "path": "/result/reasons", "value": kept} if {
	_reasons_too_big
	kept := [_cut_item(r) | some r in array.slice(input.result.reasons, 0, _config.max_logged_reasons)]
}

# METADATA
# title: Mask
# description: What was cut, so that a reader and replay know the entry is not the whole input.
mask contains {"op": "upsert", "path": "/input/log_truncated", "value": _truncated} if count(_truncated) > 0

# Extra with a key not listed, or with a list of values too long or holding a long value
# (a requester can write spec.requester.extra padded with copies of its own values).
_to_mask(extra) if {
	some key, _ in extra
	not _config.logged_extra_keys[key]
}

_to_mask(extra) if {
	not _short(extra)
	some values in extra
	_too_big(values)
}

# Extra with more keys than max_logged_items or a key longer than max_logged_value_length:
# a tenant's API server writes a request's spec.extra as it likes (review of 2026-12-06).
# Such extra is masked anyway: the keys data.json lists are far fewer and short, so it has
# a key not listed.
_extra_keys_cut(extra) if count(extra) > _config.max_logged_items

_extra_keys_cut(extra) if {
	some key, _ in extra
	count(key) > _config.max_logged_value_length
}

_truncated[concat(".", path)] := count(items) if some path, items in _oversized

_truncated[concat(".", path)] := count(value) if some path, value in _long_strings

_truncated[concat(".", [holder, "extra"])] := count(extra) if {
	some holder in _config.extra_holders
	extra := input.input[holder].extra
	not _short(extra)
	_extra_keys_cut(extra)
}

_truncated[concat(".", [holder, "extra", _logged_key(key, i)])] := count(values) if {
	some holder in _config.extra_holders
	extra := input.input[holder].extra
	not _short(extra)
	some i, key in _kept_keys(extra)
	values := extra[key]
	_too_big(values)
}

# The capped strings of this entry that are too long (an absent one fails at is_string).
# data.json lists the capped paths under the key of the input that holds them (csr, node,
# user...), so that each rule over them looks each holder up once and skips at once every
# path of a holder the entry does not have: a decision's entry has two or three of the ten,
# and a look at each of the 36 paths was most of the mask's cost for an entry it cut
# nothing of.
_long_strings[path] := value if {
	some holder, rests in _config.capped_strings
	held := input.input[holder]
	some rest in rests
	value := object.get(held, rest, null)
	is_string(value)
	count(value) > _config.max_logged_value_length
	path := array.concat([holder], rest)
}

# The capped lists of this entry that are too long or hold a long string, each checked
# once per entry: every decision is masked, and most cut nothing. A path the entry does not
# hold fails at is_array (an absent list cuts nothing): most entries hold few of the paths,
# and the applied record (system/applied) none. A list whose JSON is short fails before the
# call of _too_big, which costs more than the JSON (see _short_json).
_oversized[path] := items if {
	some holder, rests in _config.capped_lists
	held := input.input[holder]
	some rest in rests
	items := object.get(held, rest, null)
	is_array(items)
	count(json.marshal(items)) > _short_json
	_too_big(items)
	path := array.concat([holder], rest)
}

# The length of JSON below which a list can be neither too long nor hold a long string: a
# string of more than max_logged_value_length characters is at least as long in JSON, and a
# list of more than max_logged_items items is at least twice that long (each item at least
# one character, a comma between two). The lists of an ordinary request are far below it.
# A max_logged_items that is not a number (a broken data.json) leaves the bound undefined: then
# every list is looked into, as before the bound, rather than none.
default _short_json := 0

_short_json := min([_config.max_logged_value_length, 2 * _config.max_logged_items])

# Whether a value's JSON is too short to hold anything to cut (see _short_json): one
# builtin call instead of a look at each key and value of an ordinary requester's extra.
_short(value) if count(json.marshal(value)) <= _short_json

_truncated["result.reasons"] := count(input.result.reasons) if _reasons_too_big

# Whether the result's reasons are to be cut, asked once per entry by the mask and by
# log_truncated.
_reasons_too_big if {
	reasons := object.get(input, ["result", "reasons"], null)
	is_array(reasons)
	_too_big_reasons(reasons)
}

_too_big(items) if {
	is_array(items)
	count(items) > _config.max_logged_items
}

_too_big(items) if {
	is_array(items)

	# A list whose whole JSON is short cannot hold a long string: one builtin call
	# instead of a look at every value, for the lists of an ordinary request.
	count(json.marshal(items)) > _config.max_logged_value_length
	some item in items
	_long_item(item)
}

_too_big_reasons(reasons) if {
	is_array(reasons)
	count(reasons) > _config.max_logged_reasons
}

_too_big_reasons(reasons) if {
	is_array(reasons)

	# As in _too_big: reasons whose whole JSON is short hold no long message.
	count(json.marshal(reasons)) > _config.max_logged_value_length
	some r in reasons
	_long_item(r)
}

_long_item(item) if {
	some value in item
	is_string(value)
	count(value) > _config.max_logged_value_length
}

_long_item(item) if {
	is_string(item)
	count(item) > _config.max_logged_value_length
}

_cut_item(item) := {key: _cut(value) | some key, value in item} if is_object(item)

else := _cut(item)

_cut(value) := sprintf("%s... (%d bytes)", [substring(value, 0, _config.max_logged_value_length), count(value)]) if {
	is_string(value)
	count(value) > _config.max_logged_value_length
} else := value

_masked(extra) := {_logged_key(key, i): _masked_value(key, extra[key]) | some i, key in _kept_keys(extra)}

# The keys of extra the log keeps: the first max_logged_items, in key order.
_kept_keys(extra) := array.slice(sort(object.keys(extra)), 0, _config.max_logged_items)

# A kept key as the log names it: cut like a string, with its place among the kept keys, so
# that two keys alike in their first characters stay two (an object holds a key once, and a
# mask that cannot be built writes no entry at all).
_logged_key(key, i) := key if count(key) <= _config.max_logged_value_length

else := sprintf("%s... (%d bytes, key %d)", [substring(key, 0, _config.max_logged_value_length), count(key), i])

_masked_value(key, values) := _cut_list(values) if _config.logged_extra_keys[key]

_masked_value(key, values) := [_config.redacted | some _ in _cut_list(values)] if not _config.logged_extra_keys[key]

_cut_list(values) := [_cut(value) | some value in array.slice(values, 0, _config.max_logged_items)] if {
	_too_big(values)
} else := values
