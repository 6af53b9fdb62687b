package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/topdown"
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

// A mask or drop rule cut short by its decision's context ending (a shard
// lost, a stop) is not the bundle's failure: OPA logs it with the same
// words, and it is not counted as an entry the mask lost (review of
// 2026-12-06); any other failure is.
func TestAMaskCutShortByItsContextIsNoBundleFailure(t *testing.T) {
	var lost int
	l := opaLogger{Logger: logging.NewNoOpLogger(), lost: func() { lost++ }}.WithFields(map[string]any{"plugin": "decision_logs"})
	l.Error("Log event masking failed: %v.", &topdown.Error{Code: topdown.CancelErr, Message: "caller cancelled query execution"})
	l.Error("Log drop decision failed: %v.", fmt.Errorf("drop: %w", context.DeadlineExceeded))
	if lost != 0 {
		t.Fatalf("a cancelled evaluation counted %d entries lost", lost)
	}
	l.Error("Log event masking failed: %v.", &topdown.Error{Code: topdown.ConflictErr, Message: "complete rules must not produce multiple outputs"})
	l.Error("Log drop decision failed: %v.", errors.New("eval_type_error"))
	l.Error("mask rule skipped: %s: %s", "/input", "eval_type_error")
	if lost != 2 {
		t.Fatalf("%d entries counted lost, want the 2 dropped", lost)
	}
}

// OPA quotes what a bundle holds in its log lines (a file's name, a
// module's line), once a poll: each is cut to MaxLogText, and a refusal's
// error too (review 162).
func TestOPAsLogLinesAreCut(t *testing.T) {
	var out bytes.Buffer
	l := opaLogger{Logger: jsonLogger(&out, logging.Debug), lost: func() {}}
	long := strings.Repeat("é", MaxLogText)
	l.Error("Bundle load failed: %v", errors.New(long))
	l.Info("%s", long)
	l.Debug("%s", long)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	for _, line := range lines {
		assert.Less(t, len(line), MaxLogText+256, "a line of OPA's log was not cut")
		assert.Contains(t, line, "bytes more)")
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &entry), "the cut line is still JSON")
		msg, _ := entry["msg"].(string)
		assert.True(t, utf8.ValidString(msg), "cut within a character")
	}

	// A format given alone is the line, not a format (review 163), and a
	// secret query is replaced before the line is cut, so a cut cannot
	// leave part of it for the scrubbing writer to miss.
	var alone bytes.Buffer
	opaLogger{Logger: jsonLogger(&alone, logging.Info), lost: func() {}}.Info("100% of the bundle")
	assert.Contains(t, alone.String(), `"msg":"100% of the bundle"`)
	var scrubbed bytes.Buffer
	secret := "X-Amz-Signature=" + strings.Repeat("s", 64)
	opaLogger{Logger: jsonLogger(&scrubbed, logging.Info), lost: func() {}, secret: secret}.
		Error("Bundle load failed: %s", strings.Repeat("a", MaxLogText-20)+secret)
	assert.NotContains(t, scrubbed.String(), "X-Amz-Signature=sss", "part of the secret was left by the cut")
}

// A full buffer drops the oldest entry not held at the front as refused on
// their own: those are dropped as refused once the service takes the next,
// or kept; dropped meanwhile, each upload after was a refusal sent at once
// (review 205 F2).
func TestAFullBufferKeepsTheEntriesHeldAsRefused(t *testing.T) {
	s := &sinks{config: sinksConfig{URL: "https://decisions.example.com", BufferEvents: 3}, engine: &Engine{}, wake: make(chan struct{}, 1), batchLimit: uploadBatchEvents}
	for _, id := range []string{"a", "b", "c"} {
		entry := []byte(`{"decision_id":"` + id + `"}`)
		s.pending = append(s.pending, entry)
		s.pendingBytes += len(entry)
	}
	s.held = true
	require.NoError(t, s.Log(context.Background(), logs.EventV1{DecisionID: "d"}))
	assert.Equal(t, []string{"a", "c", "d"}, pendingIDs(s))
	assert.True(t, s.held)

	// A buffer of one entry takes the newest all the same, and holds
	// nothing then (review 206 F2: the entry held kept its one slot, and
	// every later entry was dropped).
	s = &sinks{config: sinksConfig{URL: "https://decisions.example.com", BufferEvents: 1}, engine: &Engine{}, wake: make(chan struct{}, 1), batchLimit: uploadBatchEvents}
	s.pending, s.pendingBytes, s.held = [][]byte{[]byte(`{"decision_id":"a"}`)}, 19, true
	require.NoError(t, s.Log(context.Background(), logs.EventV1{DecisionID: "b"}))
	assert.Equal(t, []string{"b"}, pendingIDs(s))
	assert.False(t, s.held, "the entry held was dropped, and still held")
}

func pendingIDs(s *sinks) []string {
	var ids []string
	for _, e := range s.pending {
		ids = append(ids, entryDecisionID(e))
	}
	return ids
}

// The fields of OPA's log lines are scrubbed as the lines are: at debug
// level OPA's REST client logs a request's URL, the answer's headers and the
// body of an answer that is not a success as fields, and a storage's answer
// names its signed URL (review 228 N6).
func TestOPAsLogFieldsAreScrubbed(t *testing.T) {
	var out bytes.Buffer
	l := opaLogger{Logger: jsonLogger(&out, logging.Debug), lost: func() {}}
	const signed = "https://storage.example/blob?X-Amz-Signature=5ecr3t"
	parsed, err := url.Parse("https://reader:pa55word@storage.example/blob?X-Amz-Signature=5ecr3t")
	require.NoError(t, err)
	l.WithFields(map[string]any{
		"url":      signed,
		"headers":  http.Header{"Location": {signed}},
		"response": "HTTP/1.1 403 Forbidden\r\n\r\n<Error>denied for " + signed + "</Error>",
		"error":    errors.New("Get \"" + signed + "\": EOF"),
		"status":   403,
		"bytes":    []byte(signed),
		"parsed":   parsed,
		"value":    *parsed,
		"none":     (*url.URL)(nil),
		"struct":   struct{ Location string }{signed},
	}).Debug("Received response.")
	assert.NotContains(t, out.String(), "5ecr3t")
	assert.NotContains(t, out.String(), "pa55word", "a URL's password is left out as url.URL's Redacted leaves it")
	assert.Contains(t, out.String(), "https://storage.example/blob?...", "the URL is still named")
	assert.Contains(t, out.String(), `"status":403`, "a number is kept as it is")
}
