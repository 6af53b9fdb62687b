package engine

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the engine's Prometheus collectors. A nil *Metrics counts
// nothing.
type Metrics struct {
	decisions      *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	revision       *prometheus.GaugeVec
	epochBehind    prometheus.Gauge
	epochRecordBad prometheus.Gauge
	loadFailures   prometheus.Counter
	refused        prometheus.Gauge
	disagreements  *prometheus.CounterVec
	droppedEntries *prometheus.CounterVec
	uploadDropped  *prometheus.CounterVec
	uploadedTotal  prometheus.Counter
	uploadFailures prometheus.Counter
	manualActs     *prometheus.CounterVec
}

// The causes of an upload drop.
var uploadDropCauses = []string{"buffer_full", "oversized", "refused", "shutdown"}

// NewMetrics makes the collectors and registers them.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_decisions_total",
			Help: "Decision-log entries by kind (decision: a rule's verdict; record: the record that a verdict was applied, path " + PathApplied + "; manual: a person's act recorded, path " + PathManualRecord + "), policy, action and first reason code. Count decisions with kind=\"decision\".",
		}, []string{"kind", "policy", "action", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ichor_policy_decision_duration_seconds",
			Help:    "Time to evaluate and log one decision.",
			Buckets: []float64{50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3},
		}, []string{"policy"}),
		revision: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_policy_bundle_info",
			Help: "1 for the revision of the active policy bundle.",
		}, []string{"revision"}),
		epochBehind: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_policy_bundle_epoch_behind",
			Help: "1 while the bundle in service on this replica has a lower epoch than the highest any replica recorded in the cluster (ConfigMap ichor-policy-bundle-epoch): it decides with rules the cluster has moved past, because its source still serves an older bundle (a tag moved back, another source than the other replicas') or its binary is older (a rollout under way). Read every bundle poll interval.",
		}),
		epochRecordBad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_policy_bundle_epoch_record_failing",
			Help: "1 while this replica could not read the cluster's record of the highest bundle epoch (ConfigMap ichor-policy-bundle-epoch) at its last poll, or found it below the epoch of the bundle in service here and could not write it again: a replica started now would not start (a record it cannot read) or would take back an older signed bundle (a record below). 0 once read, and written again where it was below. Only with --bundle-key.",
		}),
		loadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ichor_policy_bundle_load_failures_total",
			Help: "Bundles refused (corrupt, unsigned, wrongly signed, tampered); the last good one keeps serving.",
		}),
		// A file source (a ConfigMap) is read again only when it changes, so
		// its refusal is counted once: the counter's increase ends while
		// the source still holds what a restart would refuse.
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ichor_policy_bundle_refused",
			Help: "1 while the latest bundle this replica read from its source was refused (or could not be read): the last good one keeps serving, and a replica started now would find no bundle to serve. 0 once a bundle is activated.",
		}),
		disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_shadow_disagreements_total",
			Help: "Decisions where the shadow bundle disagreed with the active one: another action, other reason codes, or another result for the same action (what it grants).",
		}, []string{"policy"}),
		droppedEntries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_decision_log_dropped_total",
			Help: "Decision-log entries a sink could not write (stdout, file); sink mask counts those no sink got because the bundle's decision-log mask failed on them.",
		}, []string{"sink"}),
		uploadDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_decision_log_upload_dropped_total",
			Help: "Decision-log entries the upload sink (--decision-log-url) dropped, by cause: buffer_full (the service was away too long), oversized, refused (the service refused the entry on its own: 400, 413 or 422), shutdown (not sent within --decision-log-flush-timeout).",
		}, []string{"cause"}),
		uploadedTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ichor_policy_decision_log_uploaded_total",
			Help: "Decision-log entries the decision-log service accepted.",
		}),
		uploadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ichor_policy_decision_log_upload_failures_total",
			Help: "Uploads to the decision-log service that failed or that it refused; their entries are kept and sent again, but for an entry the service refuses on its own while it takes others (upload_dropped_total, cause refused).",
		}),
		manualActs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_policy_manual_acts_total",
			Help: "A person's acts recorded (path " + PathManualRecord + ": a kubelet CSR approved or denied by hand, an admin binding deleted), by kind, action and actor_source: admission when the API server named the person to the webhook; annotation, ambiguous, not_watched or unknown when the record cannot name them (the API server's audit log can).",
		}, []string{"kind", "action", "actor_source"}),
	}
	for _, cause := range uploadDropCauses {
		m.uploadDropped.WithLabelValues(cause)
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.revision, m.epochBehind, m.epochRecordBad, m.loadFailures, m.refused, m.disagreements, m.droppedEntries,
		m.uploadDropped, m.uploadedTotal, m.uploadFailures, m.manualActs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Dropped is a sink's count of entries it could not write (stdout, file,
// and mask: entries no sink got, the mask or drop rule having failed).
func (m *Metrics) Dropped(sink string) float64 {
	var out dto.Metric
	if err := m.droppedEntries.WithLabelValues(sink).Write(&out); err != nil {
		return 0
	}
	return out.GetCounter().GetValue()
}

// UploadDropped is the upload sink's drop count for a cause (buffer_full,
// oversized, refused, shutdown).
func (m *Metrics) UploadDropped(cause string) float64 {
	var out dto.Metric
	if err := m.uploadDropped.WithLabelValues(cause).Write(&out); err != nil {
		return 0
	}
	return out.GetCounter().GetValue()
}

func (m *Metrics) uploadDrop(cause string, n int) {
	if m != nil {
		m.uploadDropped.WithLabelValues(cause).Add(float64(n))
	}
}

func (m *Metrics) uploaded(n int) {
	if m != nil {
		m.uploadedTotal.Add(float64(n))
	}
}

func (m *Metrics) uploadFailed() {
	if m != nil {
		m.uploadFailures.Inc()
	}
}

func (m *Metrics) decision(path string, result json.RawMessage, err error, d time.Duration) {
	m.latency.WithLabelValues(path).Observe(d.Seconds())
	o := OutcomeOf(result, err)
	action, reason := o.Action, ""
	if len(o.Reasons) > 0 {
		reason = o.Reasons[0].Code
	}
	m.decisions.WithLabelValues(KindOf(path), path, action, reason).Inc()
}

// The label values of ichor_policy_manual_acts_total, as the shipped rule
// writes them; anything else a bundle writes is counted as "other", so that
// a bundle cannot make series without bound.
var (
	manualKinds        = []string{ManualKindDecision, ManualKindRevocation}
	manualActions      = []string{ActionApprove, ActionDeny, ActionRevoke}
	manualActorSources = []string{ActorSourceAdmission, ActorSourceAnnotation, ActorSourceAmbiguous, ActorSourceNotWatched, ActorSourceUnknown}
)

func allowedLabel(value string, allowed []string) string {
	if slices.Contains(allowed, value) {
		return value
	}
	return "other"
}

// manualAct counts a person's act recorded.
func (m *Metrics) manualAct(r ManualRecord) {
	if m != nil {
		m.manualActs.WithLabelValues(allowedLabel(r.Kind, manualKinds), allowedLabel(r.Action, manualActions),
			allowedLabel(r.ActorSource, manualActorSources)).Inc()
	}
}

// ManualActs is the count of a person's acts recorded with these labels.
func (m *Metrics) ManualActs(kind, action, actorSource string) prometheus.Counter {
	return m.manualActs.WithLabelValues(kind, action, actorSource)
}

// record counts a record that a verdict was applied, which no rule
// evaluates: kind="record", as it was counted when a rule wrote it.
func (m *Metrics) record(action string, d time.Duration) {
	m.latency.WithLabelValues(PathApplied).Observe(d.Seconds())
	m.decisions.WithLabelValues(KindRecord, PathApplied, action, "").Inc()
}

// The kinds of entry ichor_policy_decisions_total counts: a verdict of a
// rule, the record that a verdict was carried out, or the record of a
// person's act (a CSR decided by hand, an admin binding revoked). Records
// are logged like decisions (they go through the same engine and sinks) but
// Ichor decides nothing in them, so a rate of decisions counts
// kind="decision" only.
const (
	KindDecision = "decision"
	KindRecord   = "record"
	KindManual   = "manual"
)

// KindOf is the kind of the entries logged for a path.
func KindOf(path string) string {
	switch path {
	case PathApplied:
		return KindRecord
	case PathManualRecord:
		return KindManual
	}
	return KindDecision
}

func (m *Metrics) bundle(revision string, err error) {
	if err != nil {
		m.loadFailures.Inc()
		m.refused.Set(1)
	} else {
		m.refused.Set(0)
	}
	if revision != "" {
		m.revision.Reset()
		m.revision.WithLabelValues(revision).Set(1)
	}
}

// EpochBehind is the gauge that says this replica's bundle is below the
// cluster's highest epoch.
func (m *Metrics) EpochBehind() prometheus.Gauge { return m.epochBehind }

// EpochRecordFailing is the gauge that says the cluster's record of the
// highest epoch could not be read, or not written again where it was below
// the epoch in service here.
func (m *Metrics) EpochRecordFailing() prometheus.Gauge { return m.epochRecordBad }

// epochRecord sets EpochRecordFailing.
func (m *Metrics) epochRecord(failing bool) {
	if m == nil {
		return
	}
	setFlag(m.epochRecordBad, failing)
}

// setFlag sets a gauge that says whether something holds: 1 or 0.
func setFlag(g prometheus.Gauge, on bool) {
	v := 0.0
	if on {
		v = 1
	}
	g.Set(v)
}

func (m *Metrics) disagreement(path string) {
	m.disagreements.WithLabelValues(path).Inc()
}

func (m *Metrics) dropped(sink string) {
	if m == nil {
		return
	}
	m.droppedEntries.WithLabelValues(sink).Inc()
}

// RevisionGauge is the bundle-info gauge of a revision, for tests and
// dashboards that read it back.
func (m *Metrics) RevisionGauge(revision string) prometheus.Gauge {
	return m.revision.WithLabelValues(revision)
}

// LoadFailures is the counter of refused bundles.
func (m *Metrics) LoadFailures() prometheus.Counter { return m.loadFailures }

// Refused is the gauge that says the source's latest bundle is refused.
func (m *Metrics) Refused() prometheus.Gauge { return m.refused }

// Disagreements is the shadow-disagreement counter of a policy path.
func (m *Metrics) Disagreements(path string) prometheus.Counter {
	return m.disagreements.WithLabelValues(path)
}

// Decisions is the counter of a policy, action and reason, of the kind its
// path logs.
func (m *Metrics) Decisions(path, action, reason string) prometheus.Counter {
	return m.decisions.WithLabelValues(KindOf(path), path, action, reason)
}
