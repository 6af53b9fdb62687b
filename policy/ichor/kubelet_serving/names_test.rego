package ichor.kubelet_serving_test

# Names are compared as the node reports them, byte for byte: no spelling
# of the node's names or addresses that another parser may read as them is
# taken for them (review of 2026-12-06: only three forms were pinned, so a
# change that "normalised" names would have passed).
test_hostile_name_forms_are_denied if {
	every value in [
		"WORKER-1", "worker-1.", "Worker-1.lab", "worker-1.lab.", "*.worker-1", "*", "xn--wrker-1-xxa",
		"worker-1..lab", ".worker-1", "worker-1 ", " worker-1", "10.5.0.2", "10.5.0.2.", "::ffff:10.5.0.2",
		"worker-1\t", "localhost", "kubernetes.default.svc",
	] {
		_codes(_sans([{"type": "dns", "value": value}])) == ["DNSNameNotNode"]
	}
	every value in [
		"0.0.0.0", "127.0.0.1", "::1", "::", "169.254.169.254",
		"fe80::2", "10.5.0.20", "10.5.0.0", "fd00::2:0",
	] {
		_codes(_sans([{"type": "ip", "value": value}])) == ["IPNotNode"]
	}
}
