package bench

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statsChildEnv makes the test binary stand in for benchmanager's stats
// endpoint (TestMain).
const statsChildEnv = "ICHOR_BENCH_STATS_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(statsChildEnv) != "" {
		os.Exit(statsChild(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// statsChild serves the stats endpoint as benchmanager does, on the socket
// StartController hands over, until it is stopped.
func statsChild(args []string) int {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	fd := fs.Int("stats-fd", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	l, err := StatsListener(*fd, "127.0.0.1:0")
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ServeStats(ctx, l)
	<-ctx.Done()
	return 0
}

// A controller's stats endpoint is the socket the driver listened on and
// handed over: it answers there, and no other process could take its port
// between the driver's choice and the child's start.
func TestAControllerServesStatsOnTheSocketItIsHanded(t *testing.T) {
	t.Setenv(statsChildEnv, "1")
	self, err := os.Executable()
	require.NoError(t, err)
	c, err := StartController(self, t.TempDir(), "child", nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	require.NoError(t, c.WaitReady(t.Context()), "the child's log: %s", tail(c.LogPath, 20))

	st, err := c.Stats(t.Context())
	require.NoError(t, err)
	assert.NotZero(t, st.VmRSS)
	_, err = net.Listen("tcp", c.stats)
	assert.Error(t, err, "the port is the child's")
}

// A descriptor that is not a listening socket is refused with its number.
func TestStatsListenerRefusesADescriptorThatIsNotASocket(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "not-a-socket"))
	require.NoError(t, err)
	defer f.Close()
	fd, err := syscall.Dup(int(f.Fd()))
	require.NoError(t, err)

	_, err = StatsListener(fd, "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "descriptor ")
}
