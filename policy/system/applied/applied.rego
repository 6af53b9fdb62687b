# METADATA
# title: Applied verdicts
# description: |
#   Not a decision: a record, written to the decision log through the same sinks, that a
#   decision was carried out. An approver decides, then writes its verdict on the request;
#   when that write conflicts (someone else decided, the object changed) it decides again,
#   so the log can hold several verdicts for one request of which one was applied. After a
#   write succeeds, Go asks this rule with {"decision_id", "object", "action"}, and the
#   record names the decision carried out. `ichor decisions list` shows the applied
#   verdicts (and those that write nothing, such as pending) unless asked for all.
package system.applied

# METADATA
# title: Applied record
# description: |
#   {"applied": decision id, "object": what it was written on, "action": what was done},
#   for a decision id that is a string; undefined otherwise.
# entrypoint: true
record := {
	"applied": input.decision_id,
	"object": object.get(input, "object", ""),
	"action": object.get(input, "action", ""),
} if {
	is_string(input.decision_id)
	input.decision_id != ""
}
