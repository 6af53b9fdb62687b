package manager

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
)

// Whoever may write Leases in the manager's namespace chooses the holder
// identities and shard count labels the ShardCountMismatch Event quotes: a
// control sequence among them must reach kubectl describe escaped, and no
// number of them may grow the note past an Event's size.
func TestTheShardCountMismatchNoteEscapesWhatLeasesSay(t *testing.T) {
	note := shardCountMismatchNote(8, map[string]string{
		"replica-b\x1b]0;owned\x07": "16\x1b[2J",
		"replica-a\r\nFAKE LINE":    "",
	})
	require.NotContains(t, note, "\x1b")
	require.NotContains(t, note, "\x07")
	require.NotContains(t, note, "\r")
	require.NotContains(t, note, "\n")
	require.Contains(t, note, "--shards=8")
	require.Contains(t, note, `replica-a\r\nFAKE LINE (none announced)`)
	require.Less(t, strings.Index(note, "replica-a"), strings.Index(note, "replica-b"), "sorted by identity")

	many := map[string]string{}
	for i := range 5000 {
		many[strings.Repeat("x", 100)+string(rune('a'+i%26))+strings.Repeat("y", i%50)] = "3"
	}
	require.LessOrEqual(t, len(shardCountMismatchNote(8, many)), engine.MaxEventNote)
	require.True(t, strings.HasSuffix(shardCountMismatchNote(8, many), "; give every replica the same --shards"))
}
