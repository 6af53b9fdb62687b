package system.applied_test

import data.system.applied

test_a_record_names_the_decision_carried_out if {
	r := applied.record with input as {"decision_id": "d-1", "object": "csr/csr-1", "action": "approve"}
	r == {"applied": "d-1", "object": "csr/csr-1", "action": "approve"}
}

test_no_decision_id_is_no_record if {
	not applied.record with input as {"object": "csr/csr-1"}
	not applied.record with input as {"decision_id": ""}
}
