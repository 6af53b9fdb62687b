# METADATA
# title: Applied verdicts
# description: |
#   Not a decision, and no longer evaluated by this release's manager: it writes the record
#   that a decision was carried out itself, as a plain decision-log entry under this rule's
#   path (docs/decision-log.md), with the write's outcome and the object's uid. The rule stays
#   in the bundle so that a manager of the release before, which asks it after each write,
#   still records what it applied when it runs this bundle; it goes with the next epoch.
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
