package kubeletserving

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
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

// Identity read errors are counted by cluster (review 169: one tenant's
// stopped node fired IchorTalosIdentityReadsFailing for the whole fleet,
// naming none), born at 0 when a reconcile counts the cluster (a rate over a
// series sees no first failure), and gone with the cluster.
func TestIdentityReadErrorsAreCountedByCluster(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	m.pending("tenant-a", "prod", 0, 0)
	m.pending("tenant-b", "prod", 0, 0)
	assert.Equal(t, 2, testutil.CollectAndCount(m.talosReadErrors), "a cluster's series is born at its reconcile")
	m.talosRead("tenant-a", "prod", m.generation(), talosnode.FromRead, errors.New("unreachable"), time.Millisecond)
	m.talosRead("tenant-a", "prod", m.generation(), talosnode.FromRead, nil, time.Millisecond)
	m.talosRead("tenant-a", "prod", m.generation(), talosnode.FromWatch, nil, 0)
	assert.Equal(t, float64(1), testutil.ToFloat64(m.talosReadErrors.WithLabelValues("tenant-a", "prod")))
	assert.Zero(t, testutil.ToFloat64(m.talosReadErrors.WithLabelValues("tenant-b", "prod")), "another cluster's failures counted here")
	before := m.generation()
	m.forget("tenant-a", "prod")
	assert.Equal(t, 1, testutil.CollectAndCount(m.talosReadErrors), "a forgotten cluster's series stays")

	// A worker's read that began before the forget and failed after it
	// does not bring the series back (review 182).
	m.talosRead("tenant-a", "prod", before, talosnode.FromRead, errors.New("context canceled"), time.Millisecond)
	assert.Equal(t, 1, testutil.CollectAndCount(m.talosReadErrors), "a forgotten cluster's series came back")
}
