package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePeer(t *testing.T) {
	p, err := ParsePeer("kca  true --bypass-dns-resolution --provider-regex ^node-")
	require.NoError(t, err)
	assert.Equal(t, "kca", p.Name)
	assert.Len(t, p.Command, 4)
	assert.FileExists(t, p.Command[0], "resolved on PATH to an absolute path")
	for in, want := range map[string]string{
		"kca":                          `want "NAME BINARY [ARG...]"`,
		"rubberstamp true":             "the bench's own",
		"ichor-shipped true":           "the bench's own",
		"../x true":                    "or a path",
		"kca /nonexistent/approver -v": "no such file",
	} {
		_, err := ParsePeer(in)
		assert.ErrorContains(t, err, want, in)
	}
}

// A peer is measured from /proc: this process stands in for one.
func TestProcStatsReadsCPUAndPeakRSS(t *testing.T) {
	st, err := procStats(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, st.VmHWM)
	assert.Positive(t, st.VmRSS)
	assert.GreaterOrEqual(t, st.VmHWM, st.VmRSS)
	_, err = procStats(1 << 30)
	assert.Error(t, err)
}

func TestAPIRequestsSinceAndTop(t *testing.T) {
	before := APIRequests{"GET certificatesigningrequests": 10, "LIST nodes": 5}
	after := APIRequests{"GET certificatesigningrequests": 30, "LIST nodes": 5, "PUT certificatesigningrequests/approval": 20, "WATCH leases": 1}
	d := after.Since(before)
	assert.Equal(t, APIRequests{"GET certificatesigningrequests": 20, "PUT certificatesigningrequests/approval": 20, "WATCH leases": 1}, d)
	assert.Equal(t, []string{"GET certificatesigningrequests", "PUT certificatesigningrequests/approval"}, d.Top(2))
	assert.InDelta(t, 41, d.Total(), 0)
}

// A process is quiet once it spends under the share of a CPU over a window;
// one that keeps a CPU busy never is, and the error says how busy it was.
func TestWaitQuiet(t *testing.T) {
	start := func(script string) *Controller {
		dir := t.TempDir()
		c := &Controller{Name: "sh", DecisionLogPath: filepath.Join(dir, "out"), LogPath: filepath.Join(dir, "err")}
		require.NoError(t, c.start(exec.Command("sh", "-c", script)))
		t.Cleanup(func() { _ = c.Stop() })
		return c
	}
	settled, err := start("sleep 30").WaitQuiet(t.Context(), 200*time.Millisecond, 0.05, 10*time.Second)
	require.NoError(t, err)
	assert.Less(t, settled, 10*time.Second)

	_, err = start("while :; do :; done").WaitQuiet(t.Context(), 200*time.Millisecond, 0.05, 2*time.Second)
	require.Error(t, err)
	assert.Regexp(t, `sh not quiet within 2s: [1-9][0-9]*% of a CPU over the last 200ms`, err.Error())
}
