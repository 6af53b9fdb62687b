package engine_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/termsafe/termsafetest"
)

func TestClipKeepsTheTailAndSaysWhatItCut(t *testing.T) {
	assert.Equal(t, "short (decision d)", engine.Clip("short", " (decision d)", 100))

	long := strings.Repeat("IPNotNode: 10.9.0.1 is not the node's; ", 1000)
	got := engine.Clip(long, " (decision d)", engine.MaxEventNote)
	assert.LessOrEqual(t, len(got), engine.MaxEventNote)
	assert.True(t, strings.HasSuffix(got, " (decision d)"), got)
	assert.Contains(t, got, "more bytes in the decision log]")
	assert.True(t, strings.HasPrefix(got, long[:100]))

	// Never half a character.
	wide := strings.Repeat("é", 2000)
	got = engine.Clip(wide, "", 101)
	assert.True(t, utf8.ValidString(got))
	assert.LessOrEqual(t, len(got), 101)
}

func TestADecisionWithThousandsOfReasonsFitsACondition(t *testing.T) {
	reasons := make([]engine.Reason, 10000)
	for i := range reasons {
		reasons[i] = engine.Reason{Code: "IPNotNode", Message: strings.Repeat("x", 100)}
	}
	d := engine.CSRDecision{Action: engine.ActionDeny, Reasons: reasons, DecisionID: "d", Revision: "r"}
	assert.LessOrEqual(t, len(d.ConditionMessage()), engine.MaxConditionMessage)
	assert.LessOrEqual(t, len(d.EventNote()), engine.MaxEventNote)
	assert.True(t, strings.HasSuffix(d.ConditionMessage(), "(decision d, policy revision r)"))
}

// A reason quotes what the requester wrote; on a condition or an Event it is
// read on a terminal, so it is escaped there (the decision log keeps it).
func TestClipEscapesWhatATerminalWouldObey(t *testing.T) {
	got := engine.Clip("SubjectMismatch: the subject is O="+termsafetest.Node, " (decision d)", engine.MaxEventNote)
	assert.Equal(t, "SubjectMismatch: the subject is O="+termsafetest.NodeEscaped+" (decision d)", got)
	termsafetest.AssertInert(t, got)

	// A line break in a subject's attribute would start a row of its own
	// under kubectl describe's Events, one that reads as Ichor's approval.
	forged := "OU=x\n  Normal  Approved  1s  ichor-policy  approved\tlater"
	got = engine.Clip("SubjectMismatch: the subject is "+forged, " (decision d)", engine.MaxEventNote)
	assert.Equal(t, `SubjectMismatch: the subject is OU=x\n  Normal  Approved  1s  ichor-policy  approved\tlater (decision d)`, got)
	assert.NotContains(t, got, "\n")
	assert.NotContains(t, got, "\t")

	// Escaped before it is cut: the limit holds for what is written.
	long := strings.Repeat("\x1b", engine.MaxEventNote)
	got = engine.Clip(long, " (decision d)", engine.MaxEventNote)
	assert.LessOrEqual(t, len(got), engine.MaxEventNote)
	termsafetest.AssertInert(t, got)
}
