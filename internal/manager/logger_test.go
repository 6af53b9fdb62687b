package manager

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ichor-dev/ichor-policy/test/harness"
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

// What a net/http server logs about a connection (controller-runtime's
// servers have no ErrorLog: Go's standard logger) is an entry of the
// manager's JSON log, escaped, not a text line beside them: here a client
// that speaks no TLS to a TLS server.
func TestNetHTTPServerErrorsAreTheManagersEscapedJSON(t *testing.T) {
	// Written by the server's goroutines while the test reads it.
	var buf harness.DecisionLog
	setLoggers(newLogger(&buf, nil))
	t.Cleanup(func() {
		klog.ClearLogger()
		stdlog.SetOutput(os.Stderr)
		stdlog.SetFlags(stdlog.LstdFlags)
	})
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	_, err = conn.Write([]byte("GET /\x1b[2J HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, conn)
	require.NoError(t, conn.Close())
	require.Eventually(t, func() bool { return strings.Contains(buf.String(), "TLS handshake error") }, 10*time.Second, 10*time.Millisecond,
		"the server's error was not logged through the manager's logger: %q", buf.String())
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &entry), "not a JSON line: %q", line)
		assert.Equal(t, "stdlog", entry["logger"])
		assert.NotContains(t, line, "\x1b")
	}
}
