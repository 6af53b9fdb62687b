package ichor.kubelet_serving_test

# The review of 2026-12-06: a common name as long as the requester likes is no node's name;
# such a request stays pending (no machine has the name) and is decided, and logged, at each
# version, so the result names it cut, as the kubelet client rule does.
test_a_long_common_names_node_is_cut_in_the_result if {
	long := concat("", [x | some _ in numbers.range(1, 10000); x := "n"])
	cn := concat("", ["system:node:", long])
	d := _decide(array.concat(
		array.concat(_set("/csr/request/subject/1/value", cn), _set("/csr/username", cn)),
		[{"op": "remove", "path": "/machine"}],
	))
	d.action == "pending"
	d.node == sprintf("%s... (10000 bytes)", [substring(long, 0, 253)])
}

test_a_node_name_of_253_characters_is_whole if {
	name := concat("", [x | some _ in numbers.range(1, 253); x := "n"])
	cn := concat("", ["system:node:", name])
	d := _decide(array.concat(_set("/csr/request/subject/1/value", cn), _set("/csr/username", cn)))
	d.node == name
}
