package engine

import (
	"bytes"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The log lines of a failed upload name the service, never a password its
// URL holds (review of 2026-12-05).
func TestTheServicesURLIsLoggedWithoutItsPassword(t *testing.T) {
	assert.Equal(t, "https://ichor:xxxxx@decisions.example.com/v1", redactedURL("https://ichor:s3cret@decisions.example.com/v1"))
	assert.Equal(t, "https://decisions.example.com", redactedURL("https://decisions.example.com"))
	assert.Equal(t, "(an unparsable URL)", redactedURL("https://ichor:s3cret@decisions.example.com:port\x7f"))
}

// fullVolume writes part of a line once and fails, as a write to a volume
// that fills up does, then writes whole.
type fullVolume struct {
	bytes.Buffer
	failed bool
}

func (v *fullVolume) Write(p []byte) (int, error) {
	if !v.failed && len(p) > 10 {
		v.failed = true
		v.Buffer.Write(p[:10])
		return 10, syscall.ENOSPC
	}
	return v.Buffer.Write(p)
}

func (*fullVolume) Close() error { return nil }

// A write cut short leaves part of a line in the file: the next entry, of a
// decision acted on, begins on a line of its own, or it is glued to that
// part and unreadable (review of 2026-12-06).
func TestAnEntryAfterAWriteCutShortIsWhole(t *testing.T) {
	v := &fullVolume{}
	s := &sinks{f: v}
	event := func(id string) logs.EventV1 {
		return logs.EventV1{DecisionID: id, Path: "ichor/kubelet_serving/decision", Timestamp: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)}
	}
	require.ErrorIs(t, s.writeFile(event("d-lost")), syscall.ENOSPC)
	require.NoError(t, s.writeFile(event("d-acted-on")))
	lines := strings.Split(strings.TrimSuffix(v.String(), "\n"), "\n")
	require.Len(t, lines, 2, "the torn line and the entry: %q", v.String())
	var entry struct {
		DecisionID string `json:"decision_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &entry), "the entry after the torn line is not whole: %q", lines[1])
	assert.Equal(t, "d-acted-on", entry.DecisionID)
}
