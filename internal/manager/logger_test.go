package manager

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// flagOptions are the zap options as `ichor manager` binds and parses them.
func flagOptions(t *testing.T, args ...string) *zap.Options {
	t.Helper()
	var o zap.Options
	fs := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.BindFlags(fs)
	require.NoError(t, fs.Parse(args))
	return &o
}

func TestLoggerLevels(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  *zap.Options
		detail bool
	}{
		{"no flags: info", nil, false},
		{"flags at their defaults: info", flagOptions(t), false},
		{"--zap-log-level=debug", flagOptions(t, "-zap-log-level=debug"), true},
		{"--zap-log-level=2 shows V(1) too", flagOptions(t, "-zap-log-level=2"), true},
		{"--zap-log-level=error hides info", flagOptions(t, "-zap-log-level=error"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := newLogger(&buf, tc.flags)
			log.V(1).Info("detail")
			log.Info("summary")
			assert.Equal(t, tc.detail, strings.Contains(buf.String(), `"msg":"detail"`), buf.String())
		})
	}
}

// TestLoggerDefaultsAreTodays: without --zap-* flags the lines are what the
// manager always wrote, JSON with the time in epoch seconds; the flags change
// them when given.
func TestLoggerDefaultsAreTodays(t *testing.T) {
	line := func(flags *zap.Options) string {
		var buf bytes.Buffer
		newLogger(&buf, flags).Info("summary", "decision_id", "d-1")
		return buf.String()
	}
	for _, flags := range []*zap.Options{nil, flagOptions(t)} {
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(line(flags)), &entry))
		assert.IsType(t, float64(0), entry["ts"], "epoch seconds")
		assert.Equal(t, "summary", entry["msg"])
		assert.Equal(t, "d-1", entry["decision_id"])
	}
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(line(flagOptions(t, "-zap-time-encoding=rfc3339"))), &entry))
	assert.IsType(t, "", entry["ts"])
	assert.NotContains(t, line(flagOptions(t, "-zap-encoder=console")), `"msg"`)
}

// client-go's klog lines go through the manager's logger, as JSON, so that a
// control character in them (a tenant API server's error text) is escaped
// and never reaches the operator's terminal raw. (Before: klog wrote text to
// stderr.)
func TestKlogLinesAreTheManagersEscapedJSON(t *testing.T) {
	var buf bytes.Buffer
	setLoggers(newLogger(&buf, nil))
	t.Cleanup(klog.ClearLogger)
	klog.InfoS("watch failed", "err", "denied\n\x1b]2;owned\x07")
	klog.Flush()
	line := buf.String()
	assert.NotContains(t, line, "\x1b", "escaped")
	var entry map[string]any
	require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
	assert.Equal(t, "client-go", entry["logger"])
	assert.Equal(t, "denied\n\x1b]2;owned\x07", entry["err"])
}
