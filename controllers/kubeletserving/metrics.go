package kubeletserving

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The controller's metrics, on the manager's Prometheus endpoint beside the
// engine's decision metrics.
var (
	talosReadSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ichor_talos_identity_read_duration_seconds",
		Help:    "Time to read a node's identity (NodeIP, Nodename, HostnameStatus) over its Talos API.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"result"})
	talosReadErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ichor_talos_identity_read_errors_total",
		Help: "Node identity reads that failed; the requests concerned stay pending.",
	})
	writeFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ichor_kubelet_serving_decision_failures_total",
		Help: "Requests whose decision could not be reached or written, by kind: permanent (the API server refused the write as too large or invalid) or transient; each is tried again with backoff.",
	}, []string{"kind"})
	pendingCSRs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ichor_kubelet_serving_pending_csrs",
		Help: "Kubelet serving CSRs left pending at the cluster's last full pass.",
	}, []string{"namespace", "cluster"})
)

func init() {
	metrics.Registry.MustRegister(talosReadSeconds, talosReadErrors, writeFailures, pendingCSRs)
}
