package kubeletaudit

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/ichor-policy/engine"
)

// Metrics are the audit's Prometheus collectors. A nil *Metrics counts
// nothing.
type Metrics struct {
	audited *prometheus.GaugeVec
	drift   *prometheus.GaugeVec
	// lastSuccess and interval say whether the audit runs: an alert fires
	// when the last pass that succeeded is several intervals old.
	lastSuccess prometheus.Gauge
	interval    prometheus.Gauge
	// clusters are those with gauges, so that a cluster deleted since is
	// forgotten (retain) rather than alerted on for ever.
	clusters map[types.NamespacedName]bool
}

// NewMetrics makes the collectors and registers them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		clusters: map[types.NamespacedName]bool{},
		audited: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_kubelet_serving_certificates_audited",
			Help: "Machines by the status of their kubelet serving certificate at the cluster's last audit: current, drifted, unknown (not read), error (no decision).",
		}, []string{"namespace", "cluster", "status"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_kubelet_serving_certificate_drift",
			Help: "Machines whose kubelet serving certificate drifted at the cluster's last audit, by reason code (CertificateNamesNotNode, CertificateNotIssuedByClusterCA, CertificateNotForServing, CertificateNotYetValid, CertificateExpiresSoon, and CertificateNodeUnreadable beside a drift when the node could not be read); alert on it.",
		}, []string{"namespace", "cluster", "reason"}),
		// 0 until the first pass succeeds, on every replica: only the leader
		// audits, and max() over the replicas is the leader's.
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_kubelet_serving_audit_last_success_timestamp_seconds",
			Help: "When the last kubelet serving audit pass that completed (every enabled cluster and its machines listed, every machine decided or its failure counted in ichor_kubelet_serving_certificates_audited{status=\"error\"}, every condition written) started, as a Unix time; 0 until one has, and on the replicas that are not the leader. Alert when it is older than a few audit intervals.",
		}),
		interval: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_kubelet_serving_audit_interval_seconds",
			Help: "The interval between passes of the kubelet serving audit (--kubelet-serving-audit-interval), set by the leader when it starts auditing; 0 on the others.",
		}),
	}
	for _, c := range []prometheus.Collector{m.audited, m.drift, m.lastSuccess, m.interval} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the kubelet serving audit's metrics: %w", err)
		}
	}
	return m, nil
}

// started records the interval of the audit the leader runs.
func (m *Metrics) started(interval time.Duration) {
	if m != nil {
		m.interval.Set(interval.Seconds())
	}
}

// succeeded records a pass, started at at, that ended without an error.
func (m *Metrics) succeeded(at time.Time) {
	if m != nil {
		m.lastSuccess.Set(float64(at.UnixNano()) / 1e9)
	}
}

// set replaces a cluster's gauges with its last audit.
func (m *Metrics) set(namespace, cluster string, results []Result) {
	if m == nil {
		return
	}
	m.forget(namespace, cluster)
	m.clusters[types.NamespacedName{Namespace: namespace, Name: cluster}] = true
	statuses := map[string]int{engine.AuditCurrent: 0, engine.AuditDrifted: 0, engine.AuditUnknown: 0, "error": 0}
	drift := map[string]int{}
	for _, r := range results {
		if r.Err != nil {
			statuses["error"]++
			continue
		}
		statuses[r.Decision.Status]++
		if r.Decision.Status != engine.AuditDrifted {
			continue
		}
		seen := map[string]bool{}
		for _, code := range r.Decision.Reasons.Codes() {
			if !seen[code] {
				seen[code] = true
				drift[code]++
			}
		}
	}
	for status, n := range statuses {
		m.audited.WithLabelValues(namespace, cluster, status).Set(float64(n))
	}
	for reason, n := range drift {
		m.drift.WithLabelValues(namespace, cluster, reason).Set(float64(n))
	}
}

// forget drops a cluster's gauges.
func (m *Metrics) forget(namespace, cluster string) {
	if m == nil {
		return
	}
	labels := prometheus.Labels{"namespace": namespace, "cluster": cluster}
	m.audited.DeletePartialMatch(labels)
	m.drift.DeletePartialMatch(labels)
	delete(m.clusters, types.NamespacedName{Namespace: namespace, Name: cluster})
}

// retain forgets the gauges of every cluster not in keep.
func (m *Metrics) retain(keep map[types.NamespacedName]bool) {
	if m == nil {
		return
	}
	for c := range m.clusters {
		if !keep[c] {
			m.forget(c.Namespace, c.Name)
		}
	}
}
