package kubeletaudit

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/ichor-policy/engine"
)

// Metrics are the audit's Prometheus collectors. A nil *Metrics counts
// nothing.
type Metrics struct {
	audited *prometheus.GaugeVec
	drift   *prometheus.GaugeVec
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
			Help: "Machines whose kubelet serving certificate drifted at the cluster's last audit, by reason code (CertificateNamesNotNode, CertificateNotIssuedByClusterCA, CertificateNotForServing, CertificateNotYetValid, CertificateExpiresSoon); alert on it.",
		}, []string{"namespace", "cluster", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.audited, m.drift} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the kubelet serving audit's metrics: %w", err)
		}
	}
	return m, nil
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
