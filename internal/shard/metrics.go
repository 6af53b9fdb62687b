package shard

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sharding's Prometheus collectors, per shard. A nil
// *Metrics counts nothing.
type Metrics struct {
	heldGauge   *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	liveMembers prometheus.Gauge
	mismatched  prometheus.Gauge
}

// NewMetrics makes the collectors and registers them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		heldGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_shard_held",
			Help: "1 for each shard this replica serves, 0 for a shard it served and gave up: summed over the replicas, 1 per shard once the hand-over is done.",
		}, []string{"shard"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_shard_transitions_total",
			Help: "Shards this replica began or ceased to serve, by event: taken; released (meant for another replica), taken (by another that judged this one gone), lease-gone (its Lease deleted, or its ichor.dev/shard-role label removed), lost (this replica's membership could not be renewed), unrenewed (its last renewal older than the renew deadline: a pause, a slow API server), shard-count-mismatch, stopping.",
		}, []string{"shard", "event"}),
		liveMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_shard_live_replicas",
			Help: "Replicas this one sees live (membership Lease renewed within its duration), itself included.",
		}),
		mismatched: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_shard_count_mismatch",
			Help: "1 while a live replica announces another shard count (--shards) than this one's: meanwhile this replica serves no cluster.",
		}),
	}
	for _, c := range []prometheus.Collector{m.heldGauge, m.transitions, m.liveMembers, m.mismatched} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the sharding metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) held(shard int, held bool, event string) {
	if m == nil {
		return
	}
	label := strconv.Itoa(shard)
	v := 0.0
	if held {
		v = 1
	}
	m.heldGauge.WithLabelValues(label).Set(v)
	m.transitions.WithLabelValues(label, event).Inc()
}

func (m *Metrics) members(n int) {
	if m == nil {
		return
	}
	m.liveMembers.Set(float64(n))
}

func (m *Metrics) mismatch(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.mismatched.Set(v)
}
