package ichor.kubelet_client_test

# The review of 2026-12-05: a common name as long as the requester likes is no node's name, and
# the result, logged at each look, names it cut.
test_a_long_common_names_node_is_cut_in_the_result if {
	long := concat("", [x | some _ in numbers.range(1, 10000); x := "n"])
	cn := concat("", ["system:node:", long])
	d := _decide(array.concat(_set("/csr/request/subject/1/value", cn), _set("/csr/username", cn)))
	d.node == sprintf("%s... (10000 bytes)", [substring(long, 0, 253)])
}
