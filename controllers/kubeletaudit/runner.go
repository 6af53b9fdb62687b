package kubeletaudit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
)

// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosmachines,verbs=get;list;watch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosmachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Runner is the manager's periodic audit: every Interval, the leader audits
// every machine of every cluster with kubelet serving certificates enabled,
// and sets each machine's condition KubeletServingCertificateCurrent, the
// metrics, and a Warning Event when a certificate becomes drifted. Every
// audit is a decision, and so a line of the decision log.
type Runner struct {
	Auditor *Auditor
	// Client reads TalosClusters and TalosMachines (the manager's cache)
	// and writes the machines' status.
	Client   client.Client
	Recorder events.EventRecorder
	// Metrics are the audit's gauges; nil counts nothing.
	Metrics *Metrics
	// Interval between audits; the first runs at once.
	Interval time.Duration
}

// NeedLeaderElection is true: one replica audits, so conditions, Events
// and the decision log are written once per audit.
func (*Runner) NeedLeaderElection() bool { return true }

// Start audits until ctx ends (manager.Runnable).
func (r *Runner) Start(ctx context.Context) error {
	if r.Interval <= 0 {
		return errors.New("kubelet serving audit: the interval must be positive")
	}
	logger := log.FromContext(ctx).WithName("kubelet-serving-audit")
	ctx = log.IntoContext(ctx, logger)
	r.Metrics.started(r.Interval)
	ticker := time.NewTicker(r.Interval)
	defer ticker.Stop()
	for {
		if err := r.Pass(ctx); err != nil {
			logger.Error(err, "kubelet serving audit")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Pass audits every enabled cluster once. A pass that completes sets the
// time of the last successful audit, which an alert watches: an audit that
// stops (no leader, a pass that hangs or fails every time) would otherwise
// leave its last gauges in place, looking current. A cluster or machine that
// could not be audited does not stop it: its gauges say so
// (status="error"), for that cluster alone (IchorKubeletServingAuditFailing),
// so that one tenant's broken Secret does not keep the fleet's alert firing
// (review of 2026-12-06); any other failure (the clusters or a cluster's
// machines not listed, a condition not written) does.
func (r *Runner) Pass(ctx context.Context) error {
	// The pass is as recent as its start: a slow pass is no fresher.
	start := time.Now()
	var clusters ichorv1alpha1.TalosClusterList
	if err := r.Client.List(ctx, &clusters); err != nil {
		return fmt.Errorf("list TalosClusters: %w", err)
	}
	var errs []error
	failed := false
	audited := map[types.NamespacedName]bool{}
	for i := range clusters.Items {
		c := &clusters.Items[i]
		if !c.Spec.Security.KubeletServingCertificates.Enabled || !c.DeletionTimestamp.IsZero() {
			// Not audited: its machines' verdicts would stand for ever,
			// True or False, with nothing checking them (review 169).
			if err := r.clearConditions(ctx, c); err != nil {
				failed = true
				errs = append(errs, fmt.Errorf("cluster %s/%s: %w", c.Namespace, c.Name, err))
			}
			continue
		}
		audited[client.ObjectKeyFromObject(c)] = true
		reported, err := r.cluster(ctx, c)
		if reported != nil {
			errs = append(errs, fmt.Errorf("cluster %s/%s: %w", c.Namespace, c.Name, reported))
		}
		if err != nil {
			failed = true
			errs = append(errs, fmt.Errorf("cluster %s/%s: %w", c.Namespace, c.Name, err))
		}
	}
	// A cluster turned off, being deleted or gone: its gauges go, so that
	// no alert fires for what is no longer audited.
	r.Metrics.retain(audited)
	if !failed {
		r.Metrics.succeeded(start)
	}
	return errors.Join(errs...)
}

// clearConditions removes the audit's condition from the machines of a
// cluster no longer audited (kubelet serving turned off, or the cluster
// being deleted).
func (r *Runner) clearConditions(ctx context.Context, c *ichorv1alpha1.TalosCluster) error {
	machines, err := MachinesOf(ctx, r.Client, c)
	if err != nil {
		return err
	}
	for i := range machines {
		if meta.FindStatusCondition(machines[i].Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificateCurrent) == nil {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur ichorv1alpha1.TalosMachine
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(&machines[i]), &cur); err != nil {
				return err
			}
			if !meta.RemoveStatusCondition(&cur.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificateCurrent) {
				return nil
			}
			return r.Client.Status().Update(ctx, &cur)
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove condition %s of machine %s: %w", ichorv1alpha1.ConditionKubeletServingCertificateCurrent, machines[i].Name, err)
		}
	}
	return nil
}

// cluster audits one cluster. reported is what could not be audited and its
// gauges say (status="error"); err, any other failure.
func (r *Runner) cluster(ctx context.Context, c *ichorv1alpha1.TalosCluster) (reported, err error) {
	machines, err := MachinesOf(ctx, r.Client, c)
	if err != nil {
		return nil, err
	}
	results, auditErr := r.Auditor.Audit(ctx, c, machines)
	if auditErr != nil {
		// Nothing could be audited (the secrets bundle unreadable, no
		// Kubernetes CA in it): every machine says so, Unknown, and counts
		// as an error, rather than keep a verdict the audit could not make
		// again.
		results = make([]Result, len(machines))
		var errs []error
		for i := range machines {
			results[i] = Result{Machine: client.ObjectKeyFromObject(&machines[i]), Err: auditErr}
			// A conflict is the cluster's, said by auditErr already (see
			// below).
			if werr := r.setErrorCondition(ctx, &machines[i], auditErr); werr != nil && !apierrors.IsConflict(werr) {
				errs = append(errs, fmt.Errorf("machine %s: %w", results[i].Machine, werr))
			}
		}
		r.Metrics.set(c.Namespace, c.Name, results)
		return auditErr, errors.Join(errs...)
	}
	logger := log.FromContext(ctx)
	var undecided, errs []error
	for i, res := range results {
		if res.Err != nil {
			// No decision (an evaluation error, a broken bundle): the
			// condition says so, Unknown, rather than keep a verdict the
			// audit could not make again.
			undecided = append(undecided, fmt.Errorf("machine %s: %w", res.Machine, res.Err))
			if err := r.setErrorCondition(ctx, &machines[i], res.Err); err != nil && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("machine %s: %w", res.Machine, err))
			}
			continue
		}
		if res.Decision.Status == engine.AuditDrifted {
			logger.Info("kubelet serving certificate drifted", "machine", res.Machine.String(), "cluster", c.Name,
				"reasons", res.Decision.Reasons.Codes(), "decision_id", res.Decision.DecisionID)
		}
		if err := r.setCondition(ctx, &machines[i], res.Decision); apierrors.IsConflict(err) {
			// The machine's own writers kept changing it (a tenant
			// updating its TalosMachine in a loop): this cluster's
			// failure, said in its pass's errors, not the audit's, whose
			// last success every cluster's alert reads (review of
			// 2026-12-06).
			undecided = append(undecided, fmt.Errorf("machine %s: %w", res.Machine, err))
		} else if err != nil {
			errs = append(errs, fmt.Errorf("machine %s: %w", res.Machine, err))
		}
	}
	r.Metrics.set(c.Namespace, c.Name, results)
	return errors.Join(undecided...), errors.Join(errs...)
}

// MachinesOf are the TalosMachines of a cluster, in name order.
func MachinesOf(ctx context.Context, reader client.Reader, c *ichorv1alpha1.TalosCluster) ([]ichorv1alpha1.TalosMachine, error) {
	var list ichorv1alpha1.TalosMachineList
	if err := reader.List(ctx, &list, client.InNamespace(c.Namespace)); err != nil {
		return nil, fmt.Errorf("list TalosMachines: %w", err)
	}
	var out []ichorv1alpha1.TalosMachine
	for _, m := range list.Items {
		if m.Spec.ClusterName == c.Name {
			out = append(out, m)
		}
	}
	return out, nil
}

// Condition is the machine condition an audit decision sets.
func Condition(d engine.AuditDecision, generation int64) metav1.Condition {
	status := metav1.ConditionUnknown
	switch d.Status {
	case engine.AuditCurrent:
		status = metav1.ConditionTrue
	case engine.AuditDrifted:
		status = metav1.ConditionFalse
	}
	reason := "Unknown"
	if len(d.Reasons) > 0 {
		reason = d.Reasons[0].Code
	}
	return metav1.Condition{
		Type:               ichorv1alpha1.ConditionKubeletServingCertificateCurrent,
		Status:             status,
		Reason:             reason,
		Message:            d.Message(),
		ObservedGeneration: generation,
	}
}

// ErrorCondition is the machine condition when its audit gave no decision:
// Unknown, ReasonAuditError, and the error, cut to what a condition takes.
func ErrorCondition(err error, generation int64) metav1.Condition {
	return metav1.Condition{
		Type:               ichorv1alpha1.ConditionKubeletServingCertificateCurrent,
		Status:             metav1.ConditionUnknown,
		Reason:             ichorv1alpha1.ReasonAuditError,
		Message:            engine.Clip("the audit of the kubelet serving certificate gave no decision: "+err.Error(), "", engine.MaxConditionMessage),
		ObservedGeneration: generation,
	}
}

// setCondition writes the machine's condition, and the Event when the
// certificate has just drifted. A message that changes only by its decision
// id is not written again: the condition says when the verdict changed.
func (r *Runner) setCondition(ctx context.Context, m *ichorv1alpha1.TalosMachine, d engine.AuditDecision) error {
	becameDrifted, err := r.writeCondition(ctx, m, func(generation int64) metav1.Condition {
		return Condition(d, generation)
	}, func(message string) bool { return sameReasons(message, d) })
	if err != nil {
		return err
	}
	if becameDrifted && r.Recorder != nil {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, d.Reasons[0].Code, engine.EventAction("Audit", d.Reasons.Codes()...), "%s", d.EventNote())
	}
	return nil
}

// setErrorCondition writes the machine's condition when its audit gave no
// decision (ErrorCondition).
func (r *Runner) setErrorCondition(ctx context.Context, m *ichorv1alpha1.TalosMachine, decideErr error) error {
	var message string
	_, err := r.writeCondition(ctx, m, func(generation int64) metav1.Condition {
		cond := ErrorCondition(decideErr, generation)
		message = cond.Message
		return cond
	}, func(before string) bool { return before == message })
	return err
}

// writeCondition writes the condition cond makes unless the machine has it
// already (same status, reason and generation, and a message same says is
// the same), and reports whether the certificate has just become drifted.
func (r *Runner) writeCondition(ctx context.Context, m *ichorv1alpha1.TalosMachine, cond func(generation int64) metav1.Condition, same func(message string) bool) (bool, error) {
	var becameDrifted bool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur ichorv1alpha1.TalosMachine
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(m), &cur); err != nil {
			return err
		}
		if cur.Generation != m.Generation {
			// Audited on the spec read at the pass's start: not said of a
			// spec changed since (an endpoint moved), which the next pass
			// audits (review 169).
			return nil
		}
		want := cond(m.Generation)
		before := meta.FindStatusCondition(cur.Status.Conditions, want.Type)
		if before != nil && before.Status == want.Status && before.Reason == want.Reason &&
			before.ObservedGeneration == want.ObservedGeneration && same(before.Message) {
			return nil
		}
		becameDrifted = want.Status == metav1.ConditionFalse && (before == nil || before.Status != metav1.ConditionFalse || before.Reason != want.Reason)
		meta.SetStatusCondition(&cur.Status.Conditions, want)
		return r.Client.Status().Update(ctx, &cur)
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("set condition %s: %w", ichorv1alpha1.ConditionKubeletServingCertificateCurrent, err)
	}
	return becameDrifted, nil
}

// sameReasons is whether a condition message holds the decision's reasons,
// whatever its decision id.
func sameReasons(message string, d engine.AuditDecision) bool {
	reasons := d.Message()
	cut := len(reasons) - len(fmt.Sprintf(" (decision %s, policy revision %s)", d.DecisionID, d.Revision))
	return cut > 0 && len(message) >= cut && message[:cut] == reasons[:cut] &&
		strings.HasPrefix(message[cut:], " (decision ")
}
