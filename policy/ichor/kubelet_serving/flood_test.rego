package ichor.kubelet_serving_test

import data.ichor.kubelet_serving

_requests(from, newer, undecided, machines) := [{"op": "add", "path": "/requests", "value": {
	"from_requester": from,
	"newer_from_requester": newer,
	"undecided": undecided,
	"machines": machines,
}}]

test_a_requester_within_its_limit_is_decided if {
	_decide(_requests(5, 4, 5, 3)).action == "approve"
}

test_the_oldest_requests_beyond_the_limit_are_denied if {
	d := _decide(_requests(12, 5, 12, 3))
	d.action == "deny"
	[r.code | some r in d.reasons] == ["TooManyRequests"]
	startswith(
		d.reasons[0].message,
		"system:node:worker-1 has 12 undecided kubelet serving requests and 5 newer than this one",
	)
	endswith(d.reasons[0].message, "; only the newest 5 are decided")
}

# The newer ones count when they are decided too: the last undecided request of
# a flood whose newest were approved is still one of its oldest.
test_newer_requests_count_once_decided if {
	d := _decide(_requests(1, 5, 1, 3))
	d.action == "deny"
	[r.code | some r in d.reasons] == ["TooManyRequests"]
}

test_too_many_requests_is_a_rejection_without_the_node if {
	d := kubelet_serving.rejection with input as json.patch(_without_node, _requests(12, 7, 12, 3))
	d.action == "deny"
	[r.code | some r in d.reasons] == ["TooManyRequests"]
}

test_the_rejection_is_undefined_for_a_request_the_node_could_decide if {
	not kubelet_serving.rejection with input as json.patch(_without_node, _requests(2, 1, 2, 3))
}

test_the_rejection_is_undefined_for_another_signer if {
	not kubelet_serving.rejection with input as json.patch(_without_node, array.concat(
		_requests(12, 7, 12, 3),
		_set("/csr/signer_name", "kubernetes.io/kube-apiserver-client-kubelet"),
	))
}

test_a_malformed_request_is_a_rejection_too if {
	d := kubelet_serving.rejection with input as json.patch(_without_node, _set("/csr/request/parsed", false))
	[r.code | some r in d.reasons] == ["MalformedRequest"]
}

test_a_flood_withholds_approvals if {
	d := _decide(_requests(1, 0, 501, 100))
	d.action == "pending"
	[r.code | some r in d.reasons] == ["TooManyPendingRequests"]
	startswith(d.reasons[0].message, "501 kubelet serving requests are undecided, more than the 500 that 100 machines")
	endswith(d.reasons[0].message, "; none is approved until a person looks")
}

test_as_many_undecided_as_the_machines_explain_is_no_flood if {
	_decide(_requests(1, 0, 500, 100)).action == "approve"
}

test_a_small_cluster_has_an_allowance if {
	_decide(_requests(1, 0, 100, 2)).action == "approve"
	_decide(_requests(1, 0, 101, 2)).action == "pending"
}

test_a_flood_still_denies_what_fails_a_check if {
	d := _decide(array.concat(_requests(1, 0, 1000, 1), _sans([{"type": "ip", "value": "10.9.9.9"}])))
	d.action == "deny"
	[r.code | some r in d.reasons] == ["IPNotNode"]
}

test_without_counts_nothing_is_withheld if {
	_decide([]).action == "approve"
}

test_the_limits_leave_a_kubelet_room_to_ask_again if {
	config := kubelet_serving.config
	config.max_undecided_per_requester >= 2
	config.max_undecided_per_machine >= 1
	config.min_undecided_allowance >= config.max_undecided_per_requester
}

# Each node counts up to max_undecided_per_requester, and a kubelet whose
# requests wait (its node unreadable, the manager down) asks again every few
# minutes: a backlog of the cluster's own nodes must never trip the guard,
# which would then never clear without a person, since withheld requests stay
# undecided. Only requesters beyond the machines can.
test_a_backlog_of_the_machines_own_nodes_never_withholds if {
	config := kubelet_serving.config
	config.max_undecided_per_machine >= config.max_undecided_per_requester
}

_without_node := object.remove(json.patch(_good, []), ["node"])

test_go_learns_the_limit_it_counts_with if {
	kubelet_serving.limits == {"max_undecided_per_requester": 5, "node_user_prefix": "system:node:"}
}

# Whoever holds a bootstrap token can have a node identity issued for any name, and
# with it five undecided requests a name: requests for names no machine has are counted
# apart, and however many they are, they withhold nothing.
test_requests_for_names_no_machine_has_withhold_nothing if {
	d := _decide(array.concat(_requests(1, 0, 1, 3), [{"op": "add", "path": "/requests/unknown", "value": 100000}]))
	d.action == "approve"
}
