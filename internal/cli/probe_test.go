package cli_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/cli"
)

// TestProbeWaitsForTheAnswerAsked: the chart's helm test runs `ichor probe`
// on the manager's metrics. It succeeds once the server answers 200 with the
// text asked for, keeps asking while it does not, and fails when the time is
// up; a URL that is not http(s) is a usage error.
func TestProbeWaitsForTheAnswerAsked(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Not ready for the first two asks, as a manager that is starting.
		if calls.Add(1) <= 2 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("# HELP ichor_build_info\nichor_build_info{version=\"v1\"} 1\n"))
	}))
	defer srv.Close()

	code, stdout, stderr := run(t, "", "probe", srv.URL+"/metrics", "--contains", "ichor_build_info", "--timeout", "30s")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, "answered 200 OK")
	assert.GreaterOrEqual(t, calls.Load(), int32(3))

	code, _, stderr = run(t, "", "probe", srv.URL+"/metrics", "--contains", "not_there", "--timeout", "5s")
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, `does not contain "not_there"`)

	code, _, stderr = run(t, "", "probe", "file:///etc/passwd")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "the URL is http:// or https://")
}
