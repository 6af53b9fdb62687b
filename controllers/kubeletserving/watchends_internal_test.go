package kubeletserving

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
)

// The watches' ends are counted by cause, every cause's series there from
// the start, so that a rate of lost or refused watches can be alerted on
// (review 261 F3: a watch's failure was seen only as the live watches
// falling). A pure unit test of the counter; the causes themselves are
// talosnode's (watch_test.go).
func TestTheWatchesEndsAreCountedByCause(t *testing.T) {
	var n NodeReaders
	n.watchEnded(talosnode.WatchLost) // before the metrics: counted nowhere, no panic
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, RegisterWatchMetrics(reg, &n))
	n.watchEnded(talosnode.WatchLost)
	n.watchEnded(talosnode.WatchRefused)
	n.watchEnded(talosnode.WatchRefused)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ichor_talos_identity_watch_ends_total Identity watches that ended, by cause: aged (synced and made anew at --talos-watch-max-age, not a failure), lost (the connection could not be made or failed, or the node sent an error), not_synced (not established or synced in time), refused (the node sent more than a watch takes, an identity beyond its bounds, or ResourceExhausted). A machine whose watch is not live is read at each decision.
# TYPE ichor_talos_identity_watch_ends_total counter
ichor_talos_identity_watch_ends_total{cause="aged"} 0
ichor_talos_identity_watch_ends_total{cause="lost"} 1
ichor_talos_identity_watch_ends_total{cause="not_synced"} 0
ichor_talos_identity_watch_ends_total{cause="refused"} 2
`), "ichor_talos_identity_watch_ends_total"))
}
