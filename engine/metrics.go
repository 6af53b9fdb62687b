package engine

import (
	"encoding/json"
	"errors"
	"time"

	opametrics "github.com/open-policy-agent/opa/v1/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the engine's Prometheus collectors.
type Metrics struct {
	decisions      *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	revision       *prometheus.GaugeVec
	loadFailures   prometheus.Counter
	disagreements  *prometheus.CounterVec
	droppedEntries *prometheus.CounterVec
	// opa receives the counters of OPA's decision-log plugin: the entries its
	// upload buffer dropped (full, or over the rate limit).
	opa opametrics.Metrics
}

// OPA's names of the decision-log upload drop counters, by cause.
var opaDropCounters = map[string]string{
	"buffer_full":       "decision_logs_dropped_buffer_size_limit_exceeded",
	"buffer_bytes_full": "decision_logs_dropped_buffer_size_limit_bytes_exceeded",
	"rate_limit":        "decision_logs_dropped_rate_limit_exceeded",
}

// NewMetrics makes the collectors and registers them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_decisions_total",
			Help: "Decisions by policy, action and first reason code.",
		}, []string{"policy", "action", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ichor_policy_decision_duration_seconds",
			Help:    "Time to evaluate and log one decision.",
			Buckets: []float64{50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3},
		}, []string{"policy"}),
		revision: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_policy_bundle_info",
			Help: "1 for the revision of the active policy bundle.",
		}, []string{"revision"}),
		loadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ichor_policy_bundle_load_failures_total",
			Help: "Bundles refused (corrupt, unsigned, wrongly signed, tampered); the last good one keeps serving.",
		}),
		disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_shadow_disagreements_total",
			Help: "Decisions where the shadow bundle disagreed with the active one.",
		}, []string{"policy"}),
		droppedEntries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_decision_log_dropped_total",
			Help: "Decision-log entries a sink could not write.",
		}, []string{"sink"}),
	}
	m.opa = opametrics.New()
	collectors := []prometheus.Collector{m.decisions, m.latency, m.revision, m.loadFailures, m.disagreements, m.droppedEntries}
	for cause, name := range opaDropCounters {
		collectors = append(collectors, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ichor_policy_decision_log_upload_dropped_total",
			Help:        "Decision-log entries the upload sink (--decision-log-url) dropped, by cause.",
			ConstLabels: prometheus.Labels{"cause": cause},
		}, func() float64 { return counterValue(m.opa, name) }))
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func counterValue(m opametrics.Metrics, name string) float64 {
	if v, ok := m.Counter(name).Value().(uint64); ok {
		return float64(v)
	}
	return 0
}

// UploadDropped is the upload sink's drop count for a cause (buffer_full,
// buffer_bytes_full, rate_limit).
func (m *Metrics) UploadDropped(cause string) float64 {
	return counterValue(m.opa, opaDropCounters[cause])
}

func (m *Metrics) decision(path string, result json.RawMessage, err error, d time.Duration) {
	m.latency.WithLabelValues(path).Observe(d.Seconds())
	var r struct {
		Action  string `json:"action"`
		Allowed *bool  `json:"allowed"`
		Reasons []struct {
			Code string `json:"code"`
		} `json:"reasons"`
	}
	action, reason := "error", ""
	switch {
	case errors.Is(err, ErrNoDecision):
		action = "none"
	case err == nil && json.Unmarshal(result, &r) == nil:
		action = r.Action
		if r.Allowed != nil {
			action = map[bool]string{true: "allowed", false: "refused"}[*r.Allowed]
		}
		if len(r.Reasons) > 0 {
			reason = r.Reasons[0].Code
		}
	}
	m.decisions.WithLabelValues(path, action, reason).Inc()
}

func (m *Metrics) bundle(revision string, err error) {
	if err != nil {
		m.loadFailures.Inc()
	}
	if revision != "" {
		m.revision.Reset()
		m.revision.WithLabelValues(revision).Set(1)
	}
}

func (m *Metrics) disagreement(path string) {
	m.disagreements.WithLabelValues(path).Inc()
}

func (m *Metrics) dropped(sink string) {
	m.droppedEntries.WithLabelValues(sink).Inc()
}

// RevisionGauge is the bundle-info gauge of a revision, for tests and
// dashboards that read it back.
func (m *Metrics) RevisionGauge(revision string) prometheus.Gauge {
	return m.revision.WithLabelValues(revision)
}

// LoadFailures is the counter of refused bundles.
func (m *Metrics) LoadFailures() prometheus.Counter { return m.loadFailures }

// Disagreements is the shadow-disagreement counter of a policy path.
func (m *Metrics) Disagreements(path string) prometheus.Counter {
	return m.disagreements.WithLabelValues(path)
}

// Decisions is the decision counter of a policy, action and reason.
func (m *Metrics) Decisions(path, action, reason string) prometheus.Counter {
	return m.decisions.WithLabelValues(path, action, reason)
}
