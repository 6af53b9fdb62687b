package kubeletserving

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A worker whose turn began before its cluster was forgotten (disabled,
// gone, or served elsewhere while it read the nodes) does not raise the
// flood guard after: no reconcile of that cluster would clear it, and the
// alert would fire for a cluster that judges nothing (the hostile review
// of 2026-12-05). Once a reconcile counts the cluster again, a worker's
// turn raises it at once, as before.
func TestAWorkerDoesNotRaiseTheFloodGuardOfAClusterForgottenMeanwhile(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	series := func() int { return testutil.CollectAndCount(m.floodGuard) }

	m.pending("ns", "demo", 3, 0)
	before := m.generation()
	m.forget("ns", "demo")
	m.withheld("ns", "demo", before)
	assert.Zero(t, series(), "the guard of a forgotten cluster raised by a turn begun before")

	// Another cluster's turn is not held back by this one's forget.
	m.withheld("ns", "other", before)
	assert.Equal(t, float64(1), testutil.ToFloat64(m.floodGuard.WithLabelValues("ns", "other")))

	// Served again: its next reconcile counts it, and a turn raises it.
	m.pending("ns", "demo", 3, 0)
	m.withheld("ns", "demo", before)
	assert.Equal(t, float64(1), testutil.ToFloat64(m.floodGuard.WithLabelValues("ns", "demo")))
}
