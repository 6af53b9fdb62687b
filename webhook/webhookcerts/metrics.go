package webhookcerts

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the rotator's Prometheus collectors, served beside the
// engine's and the approvers'. A nil *Metrics counts nothing.
type Metrics struct {
	expiry *prometheus.GaugeVec
}

// NewMetrics makes the collectors and registers them, as engine.NewMetrics
// does the engine's.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_webhook_certificate_expiry_timestamp_seconds",
			Help: "When the certificate this replica serves the webhook with (certificate=serving), and the CA the API server trusts it through (certificate=ca), expire, in Unix seconds; set whenever they are loaded or renewed. Renewal is two thirds into their life: alert when one gets close to expiry, renewal is failing.",
		}, []string{"certificate"}),
	}
	if err := reg.Register(m.expiry); err != nil {
		return nil, fmt.Errorf("register the webhook certificates' metrics: %w", err)
	}
	return m, nil
}

// loaded records the expiry of the certificates now served.
func (m *Metrics) loaded(current *material) {
	if m == nil {
		return
	}
	m.expiry.WithLabelValues("serving").Set(float64(current.serving.NotAfter.Unix()))
	m.expiry.WithLabelValues("ca").Set(float64(current.ca.NotAfter.Unix()))
}
