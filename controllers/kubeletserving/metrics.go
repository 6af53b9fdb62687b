package kubeletserving

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
)

// Metrics are the approver's Prometheus collectors, served beside the
// engine's decision metrics. A nil *Metrics counts nothing.
type Metrics struct {
	talosReadSeconds *prometheus.HistogramVec
	talosReadErrors  *prometheus.CounterVec
	talosWatched     prometheus.Counter
	writeFailures    *prometheus.CounterVec
	pendingCSRs      *prometheus.GaugeVec
	floodGuard       *prometheus.GaugeVec
	dropped          *prometheus.CounterVec

	// mu orders forget and withheld: a worker whose turn began before its
	// cluster was forgotten (disabled, gone, served elsewhere) does not
	// raise the flood guard again after, where no reconcile would clear
	// it (the hostile review of 2026-12-05).
	mu sync.Mutex
	// gen counts the forgets; forgotten is the gen of each cluster's last
	// forget, and when, until a reconcile counts it again (pending) or it
	// is older than any turn (forgetKept: a deleted cluster is never
	// counted again).
	gen       uint64
	forgotten map[[2]string]forgetMark
}

type forgetMark struct {
	gen uint64
	at  time.Time
}

// forgetKept is how long a forget is remembered at least: far longer than a
// worker's turn takes (each of its reads is bounded by a timeout); a turn
// longer still could raise the guard of a forgotten cluster again, as
// before this was kept.
const forgetKept = 10 * time.Minute

// NewMetrics makes the collectors and registers them, as engine.NewMetrics
// does the engine's.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		talosReadSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ichor_talos_identity_read_duration_seconds",
			Help:    "Time to read a node's identity (NodeIP, Nodename, HostnameStatus) over its Talos API.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"result"}),
		// By cluster (review 169): one tenant's stopped node fired the
		// alert for the whole fleet, naming no cluster.
		talosReadErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_talos_identity_read_errors_total",
			Help: "Node identity reads that failed, by the TalosCluster (namespace, cluster) of the machine read; the requests concerned stay pending.",
		}, []string{"namespace", "cluster"}),
		talosWatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ichor_talos_identity_watched_total",
			Help: "Node identities taken from the node's live watch (established, synced, younger than --talos-watch-max-age) instead of a read; ichor_talos_identity_read_duration_seconds counts the reads.",
		}),
		writeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_kubelet_serving_decision_failures_total",
			Help: "Requests whose decision could not be reached or written, by kind: permanent (the API server refused the write as too large or invalid, or forbade it) or transient; each is tried again with backoff.",
		}, []string{"kind"}),
		pendingCSRs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_kubelet_serving_pending_csrs",
			Help: "Kubelet serving CSRs left pending, as the cluster's last reconcile counted them.",
		}, []string{"namespace", "cluster"}),
		floodGuard: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ichor_kubelet_serving_flood_guard",
			Help: "1 while the rule withholds the cluster's approvals because its API server holds more undecided kubelet serving requests than its machines explain (TooManyPendingRequests); alert on it.",
		}, []string{"namespace", "cluster"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_kubelet_serving_verdicts_dropped_total",
			Help: "Verdicts not reached or not written because what they were gathered on changed meanwhile, mostly during a direct Talos read, by change: cluster_off (kubelet serving certificates turned off), cluster_deleted (deleted, being deleted, or made anew), cluster_target (judged through another API server), machine (the machine answering to the node's name deleted, re-pointed, or joined by another); each request is looked at again.",
		}, []string{"change"}),
	}
	for _, c := range []prometheus.Collector{m.talosReadSeconds, m.talosReadErrors, m.talosWatched, m.writeFailures, m.pendingCSRs, m.floodGuard, m.dropped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register the kubelet serving approver's metrics: %w", err)
		}
	}
	return m, nil
}

// talosRead counts a read of a node of the cluster by a worker whose turn
// began at metrics generation since; a failure is not counted for a
// cluster forgotten after that (review 182: its series came back on a
// replica that no longer served it, where no reconcile would remove it).
func (m *Metrics) talosRead(namespace, cluster string, since uint64, source talosnode.Source, err error, took time.Duration) {
	if m == nil {
		return
	}
	if source == talosnode.FromWatch {
		m.talosWatched.Inc()
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
		m.mu.Lock()
		if m.forgotten[[2]string{namespace, cluster}].gen <= since {
			m.talosReadErrors.WithLabelValues(namespace, cluster).Inc()
		}
		m.mu.Unlock()
	}
	m.talosReadSeconds.WithLabelValues(result).Observe(took.Seconds())
}

func (m *Metrics) droppedVerdict(kind string) {
	if m != nil {
		m.dropped.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) failure(kind string) {
	if m != nil {
		m.writeFailures.WithLabelValues(kind).Inc()
	}
}

// pending sets the counts of a reconcile: the requests left pending, and
// whether any was withheld for a flood.
func (m *Metrics) pending(namespace, cluster string, pending, withheld int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.forgotten, [2]string{namespace, cluster})
	m.pendingCSRs.WithLabelValues(namespace, cluster).Set(float64(pending))
	// Born at 0 with the cluster, not at its first failure, which a rate
	// over the series would not see.
	m.talosReadErrors.WithLabelValues(namespace, cluster).Add(0)
	guard := 0.0
	if withheld > 0 {
		guard = 1
	}
	m.floodGuard.WithLabelValues(namespace, cluster).Set(guard)
}

// generation is the count of forgets so far: a worker takes it before it
// reads its cluster, and raises the flood guard only if the cluster was not
// forgotten since (withheld).
func (m *Metrics) generation() uint64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// withheld raises the flood guard at once, between reconciles, unless the
// cluster was forgotten after generation since.
func (m *Metrics) withheld(namespace, cluster string, since uint64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forgotten[[2]string{namespace, cluster}].gen > since {
		return
	}
	m.floodGuard.WithLabelValues(namespace, cluster).Set(1)
}

// forget drops a cluster that judges nothing any more.
func (m *Metrics) forget(namespace, cluster string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	now := time.Now()
	if m.forgotten == nil {
		m.forgotten = map[[2]string]forgetMark{}
	}
	for k, f := range m.forgotten {
		if now.Sub(f.at) > forgetKept {
			delete(m.forgotten, k)
		}
	}
	m.forgotten[[2]string{namespace, cluster}] = forgetMark{gen: m.gen, at: now}
	m.pendingCSRs.DeleteLabelValues(namespace, cluster)
	m.floodGuard.DeleteLabelValues(namespace, cluster)
	m.talosReadErrors.DeleteLabelValues(namespace, cluster)
}

// RegisterWatchMetrics registers the gauges of the identity watches: how many
// machines are watched, and how many of those watches are live.
func RegisterWatchMetrics(reg prometheus.Registerer, n *NodeReaders) error {
	ends := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ichor_talos_identity_watch_ends_total",
		Help: "Identity watches that ended, by cause: aged (synced and made anew at --talos-watch-max-age, not a failure), lost (the connection could not be made or failed, or the node sent an error), not_synced (not established or synced in time), refused (the node sent more than a watch takes, an identity beyond its bounds, or ResourceExhausted). A machine whose watch is not live is read at each decision.",
	}, []string{"cause"})
	for _, cause := range []talosnode.WatchEnd{talosnode.WatchAged, talosnode.WatchLost, talosnode.WatchNotSynced, talosnode.WatchRefused} {
		ends.WithLabelValues(string(cause))
	}
	for _, g := range []prometheus.Collector{
		ends,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ichor_talos_identity_watches",
			Help: "Machines whose identity is watched (expected to ask for a serving certificate soon), over the clusters this replica serves.",
		}, func() float64 { w, _ := n.Watches(); return float64(w) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ichor_talos_identity_watches_live",
			Help: "Of ichor_talos_identity_watches, those established, synced and younger than --talos-watch-max-age; a decision for another machine reads its node.",
		}, func() float64 { _, l := n.Watches(); return float64(l) }),
	} {
		if err := reg.Register(g); err != nil {
			return fmt.Errorf("register the identity watches' metrics: %w", err)
		}
	}
	n.watchEnds.Store(ends)
	return nil
}
