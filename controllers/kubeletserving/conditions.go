package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// updateConditions sets KubeletServingCertificates from the machines'
// recorded certificates and the latched KubeletServingVerified (ADR 0125,
// "Condition" and "verifyFromAPIServer and ordering"), and says when a
// machine's certificate expires next (zero: none), to look again then.
// p is the pass that looked at the cluster's requests, whose denials it
// says (deniedOf); nil: none is said.
func (r *Reconciler) updateConditions(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, p *pass, now time.Time, withheld int) (next time.Duration, err error) {
	// The cache's own objects, read only: a reconcile of a cluster of 5,000
	// machines otherwise copied every one of them.
	var machines ichorv1alpha1.TalosMachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(cluster.Namespace), client.MatchingFields{IndexCluster: cluster.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("list machines of the cluster: %w", err)
	}
	var waiting []*ichorv1alpha1.TalosMachine
	for i := range machines.Items {
		m := &machines.Items[i]
		cert := m.Status.KubeletServingCertificate
		if cert == nil || !cert.NotAfter.After(now) {
			waiting = append(waiting, m)
			continue
		}
		// Look again when this certificate expires: the condition turns False.
		if d := cert.NotAfter.Sub(now) + time.Second; next == 0 || d < next {
			next = d
		}
	}
	slices.SortFunc(waiting, func(a, b *ichorv1alpha1.TalosMachine) int { return strings.Compare(a.Name, b.Name) })

	before := cluster.DeepCopy()
	issued := metav1.Condition{
		Type:               ichorv1alpha1.ConditionKubeletServingCertificates,
		Status:             metav1.ConditionTrue,
		Reason:             ichorv1alpha1.ReasonAllMachinesIssued,
		Message:            fmt.Sprintf("all %d machines have an unexpired kubelet serving certificate", len(machines.Items)),
		ObservedGeneration: cluster.Generation,
	}
	switch {
	case len(machines.Items) == 0:
		// Vacuously true would latch verification before any kubelet has a
		// certificate, breaking logs and exec for every machine that joins.
		issued.Status = metav1.ConditionFalse
		issued.Reason = ichorv1alpha1.ReasonMachinesPending
		issued.Message = "the cluster has no machines yet"
	case len(waiting) > 0:
		issued.Status = metav1.ConditionFalse
		issued.Reason = ichorv1alpha1.ReasonMachinesPending
		issued.Message = fmt.Sprintf("%d of %d machines have no unexpired kubelet serving certificate yet: %s%s%s",
			len(waiting), len(machines.Items), nameSome(namesOf(waiting), maxNamedMachines), r.refusedOf(cluster, waiting), deniedOf(ctx, p, waiting))
	}
	// No node's identity can be read without the cluster's OS CA, so
	// nothing is approved whatever the nodes do: the configuration's
	// matter, which Ready says, not a node's (review 169; Ready stayed
	// True, and only turned False, as TalosAPIUnreachable, once more than
	// half of the machines had asked in vain).
	if err := r.secretsUnusable(ctx, cluster); err != nil {
		issued.Status = metav1.ConditionFalse
		issued.Reason = ichorv1alpha1.ReasonSecretsUnusable
		what := "the secrets bundle cannot be used, so no node's identity can be read and no request is approved: "
		if errors.Is(err, errKubernetesCAUnusable) {
			what = "the secrets bundle's Kubernetes CA cannot be used, so requests are decided but no issued certificate is recorded on its machine: "
		}
		issued.Message = engine.Clip(what+err.Error(), "", maxConditionMessage)
	}
	meta.SetStatusCondition(&cluster.Status.Conditions, issued)
	meta.SetStatusCondition(&cluster.Status.Conditions, requestsCondition(cluster, withheld))

	latched := meta.IsStatusConditionTrue(cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)
	switch {
	case unlatchIfOff(cluster):
	case latched:
		// A latch: a machine joining later does not take the flag away, since
		// that would restart every kube-apiserver each time a node is added.
		// It says it holds for the spec as it is, as the others do (its
		// time kept: review 247, F6).
		meta.FindStatusCondition(cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified).ObservedGeneration = cluster.Generation
	case issued.Status == metav1.ConditionTrue:
		meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{
			Type:               ichorv1alpha1.ConditionKubeletServingVerified,
			Status:             metav1.ConditionTrue,
			Reason:             ichorv1alpha1.ReasonVerificationLatched,
			Message:            "every machine had a kubelet serving certificate; the kube-apiserver verifies kubelets against the Kubernetes CA from now on",
			ObservedGeneration: cluster.Generation,
		})
	default:
		meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{
			Type:               ichorv1alpha1.ConditionKubeletServingVerified,
			Status:             metav1.ConditionFalse,
			Reason:             ichorv1alpha1.ReasonAwaitingCertificates,
			Message:            "verification waits until every machine has a kubelet serving certificate",
			ObservedGeneration: cluster.Generation,
		})
	}
	reach := r.NodeReaders.reachability(client.ObjectKeyFromObject(cluster), now)
	reach.total = len(machines.Items)
	if setReady(cluster, reach) && (next == 0 || reach.earlyLeft < next) {
		// Kept from before the restart: looked at again when the reads
		// have had their time, whatever the resync interval.
		next = reach.earlyLeft
	}
	if !statusChanged(before.Status, cluster.Status) {
		return next, nil
	}
	if err := r.Client.Status().Patch(ctx, cluster, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return 0, fmt.Errorf("update cluster conditions: %w", err)
	}
	return next, nil
}

// unlatchIfOff removes KubeletServingVerified when verifyFromAPIServer is
// off, and reports whether it is off. ADR 0125 removes the latch when
// either option is switched off; every path that writes the cluster's
// status while the option is on asks this, a refused API server's too:
// switched off while the cluster's kubeconfig was refused, the latch stayed,
// and switched on again it rendered --kubelet-certificate-authority at once
// for the machines that had joined meanwhile without a certificate
// (review 247, F1).
func unlatchIfOff(cluster *ichorv1alpha1.TalosCluster) bool {
	if cluster.Spec.Security.KubeletServingCertificates.VerifyFromAPIServer {
		return false
	}
	meta.RemoveStatusCondition(&cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)
	return true
}

// secretsUnusable is why the cluster's secrets bundle cannot be used for
// its nodes' identities, or nil: it is gone, names another cluster or none,
// holds no usable OS CA, or the manager may not read it. A failure to reach
// the API server says nothing of the bundle, and is nil: the next look
// reads it again.
func (r *Reconciler) secretsUnusable(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) error {
	if r.NodeReaders.Reader == nil {
		// Readers that read no Secret (the package's unit tests') have no
		// bundle to judge.
		return nil
	}
	// The Kubernetes CA too: without it no certificate is recorded, and
	// the requests' looks fail one by one (review 194).
	_, err := r.NodeReaders.KubernetesRoots(ctx, cluster)
	if err == nil || transientRead(ctx, err) {
		return nil
	}
	return err
}

// transientRead is whether a read of a Secret failed for want of an answer
// about it: the API server failed, was unreachable, or the read was cut
// short. A Secret gone or forbidden, or one read and refused, is an answer.
func transientRead(ctx context.Context, err error) bool {
	var status apierrors.APIStatus
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		return false
	case errors.As(err, &status), ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, errBundleReadAgain): // a later read answered: the next look says
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}

// refusedOf says, of the first waiting machines whose last certificate was
// refused a record, why (notRecorded): the Event that says it expires within
// the hour, and the machine waits until a certificate is recorded.
func (r *Reconciler) refusedOf(cluster *ichorv1alpha1.TalosCluster, waiting []*ichorv1alpha1.TalosMachine) string {
	key := client.ObjectKeyFromObject(cluster)
	var b strings.Builder
	said := 0
	for _, m := range waiting {
		why, ok := r.refusedRecords.of(key, m)
		if !ok {
			continue
		}
		if said == maxNamedRefusals {
			b.WriteString("; and others (their CertificateNotRecorded Events)")
			break
		}
		fmt.Fprintf(&b, "; %s: %s", m.Name, why)
		said++
	}
	return b.String()
}

// deniedOf says, of the first waiting machines whose node's own newest
// kubelet-serving request is denied, that it is and why (its Denied
// condition), so that a node denied for good does not read as one joining
// (review 247, F3): only the Denied Event, for an hour, and the decision log
// said it. Only the node's own requests count (spec.username
// system:node:NAME, which the API server sets from the requester's
// credential): one that another node makes in its name is denied for its
// requester, not for the node; and only a machine's own name (its recorded
// node name, else its hostname) that no other judging machine answers to
// (machineFor), and requests made since the machine was: a name another
// cluster's machine shares on a shared API server, or one a machine made
// again under an old name inherits, says nothing of another's request
// (review 251 F2). A later request of the node's own, approved or pending,
// ends the note. Read from the cache at each look, so it needs no memory of
// its own and holds across restarts. Best effort: a list or lookup that
// fails leaves the note out, not the condition unwritten.
func deniedOf(ctx context.Context, p *pass, waiting []*ichorv1alpha1.TalosMachine) string {
	if p == nil || len(waiting) == 0 {
		return ""
	}
	// The nodes' user names as the rule writes them (the decisions' own
	// prefix: review 252 F9).
	limits, err := p.r.limits.get(ctx, p.r.Engine, p.now)
	if err != nil {
		log.FromContext(ctx).V(1).Info("the machines' denials are not said: the rule's limits cannot be read", "error", err.Error())
		return ""
	}
	prefix := limits.NodeUserPrefix
	wanted := make(map[string]*certificatesv1.CertificateSigningRequest, len(waiting))
	for _, m := range waiting {
		if name := ownName(m); name != "" {
			wanted[prefix+name] = nil
		}
	}
	var list certificatesv1.CertificateSigningRequestList
	if err := p.target.reader.List(ctx, &list, client.MatchingFields{IndexSignerName: certificatesv1.KubeletServingSignerName}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).V(1).Info("the machines' denials are not said: the requests cannot be listed", "error", err.Error())
		return ""
	}
	for i := range list.Items {
		csr := &list.Items[i]
		if n, ok := wanted[csr.Spec.Username]; ok && (n == nil || newer(csr, n)) {
			wanted[csr.Spec.Username] = csr
		}
	}
	var b strings.Builder
	said := 0
	for _, m := range waiting {
		name := ownName(m)
		own := wanted[prefix+name]
		denial := deniedCondition(own)
		if denial == nil || own.CreationTimestamp.Before(&m.CreationTimestamp) {
			continue
		}
		mine, candidates, _, err := p.machineFor(ctx, name)
		if err != nil || candidates != 1 || mine == nil || mine.UID != m.UID {
			continue
		}
		if said == maxNamedRefusals {
			b.WriteString("; and others (their Denied Events)")
			break
		}
		// Each part cut before it is escaped: a tenant's server sends a
		// message of megabytes, which escaping would multiply.
		b.WriteString("; ")
		b.WriteString(servingcert.Clip(termsafe.EscapeLine(fmt.Sprintf("%s: its node's newest request, CSR %q, was denied (%s): %s", m.Name,
			servingcert.Clip(own.Name, maxRecordedRequestName), servingcert.Clip(denial.Reason, maxDenialReason), servingcert.Clip(denial.Message, maxNotRecordedNote))),
			maxNotRecordedNote))
		said++
	}
	return b.String()
}

// maxDenialReason bounds a denial's reason as a condition says it: a rule's
// is a code of a few dozen characters.
const maxDenialReason = 128

// ownName is the node name a machine answers to first: its recorded node
// name, else its hostname (machines.FindAll's order).
func ownName(m *ichorv1alpha1.TalosMachine) string {
	if m.Status.NodeName != "" {
		return m.Status.NodeName
	}
	return m.Spec.Hostname
}

// deniedCondition is csr's Denied condition; nil if it has none, or is nil.
func deniedCondition(csr *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	if csr == nil {
		return nil
	}
	for i := range csr.Status.Conditions {
		if c := &csr.Status.Conditions[i]; c.Type == certificatesv1.CertificateDenied {
			return c
		}
	}
	return nil
}

// maxNamedRefusals bounds the refusals (and the denials) a condition says:
// each is at most an Event's note.
const maxNamedRefusals = 3

// maxConditionMessage is metav1.Condition's limit on a message.
const maxConditionMessage = 32768

// progressReasons are the reasons of a False KubeletServingCertificates that
// say how far the nodes are, not that the cluster is served otherwise than
// configured: a node joining, a node the rule left pending or denied. Any
// other reason (the kubeconfigRef unreadable, a local cluster the operator
// did not name, or a refusal added later) is a refusal of the configuration.
var progressReasons = map[string]bool{
	ichorv1alpha1.ReasonMachinesPending: true,
}

// setReady sets Ready, for the tools that read one condition (kubectl wait,
// kstatus, and Flux's and Argo CD's health checks through it), and records
// the generation it was computed from, which kstatus compares with
// metadata.generation before it believes any condition.
//
// Ready says whether Ichor serves the cluster as its spec asks: True once
// the spec of this generation is accepted and its requests are being
// decided; False when the configuration is refused, or when Ichor reaches
// none of the cluster's Talos API: every machine it read for its own node's
// request within readFreshness failed, and those are more than half of the
// cluster's machines (reach). It never follows the nodes' progress: a node
// joining, a request left pending, a node denied for ever, a flood withheld
// are what KubeletServingCertificates and KubeletServingRequests say. Were
// Ready to follow them, every node join would stall kubectl wait and GitOps
// health checks, and whoever may create a CSR (any node, a flood) could turn
// the cluster unhealthy at will. One machine of several that does not answer
// is that machine's matter (its request stays pending, NodeUnreadable); a
// policy bundle that was refused leaves the last good one serving, which
// the manager's metrics and alerts say, not each cluster's Ready.
func setReady(cluster *ichorv1alpha1.TalosCluster, reach reachability) (keptUnreachable bool) {
	ready := metav1.Condition{
		Type:               ichorv1alpha1.ConditionReady,
		Status:             metav1.ConditionTrue,
		Reason:             ichorv1alpha1.ReasonServing,
		Message:            "kubelet serving certificates: the spec is accepted and the cluster's requests are decided; node progress is in KubeletServingCertificates",
		ObservedGeneration: cluster.Generation,
	}
	c := meta.FindStatusCondition(cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	switch {
	case !cluster.DeletionTimestamp.IsZero():
		ready.Reason = ichorv1alpha1.ReasonDeleting
		ready.Message = "the cluster is being deleted: nothing is approved for it"
	case !servesKubeletCertificates(cluster):
		ready.Reason = ichorv1alpha1.ReasonKubeletServingOff
		ready.Message = "kubelet serving certificates are off: nothing to approve"
	case c != nil && c.Status != metav1.ConditionTrue && !progressReasons[c.Reason]:
		ready.Status = metav1.ConditionFalse
		ready.Reason = c.Reason
		prefix := "the configuration is refused: "
		switch c.Reason {
		case ReasonPolicyEvaluationFailed:
			prefix = "the manager cannot judge the configuration (its policy or its decision log failed): "
		case ReasonRemoteWatchStarting:
			prefix = "the cluster's requests are not decided yet: "
		}
		ready.Message = truncate(prefix+c.Message, maxConditionMessage)
		if c.Reason == ReasonRemoteWatchStarting && keepUnreachable(cluster, &ready) {
			// A remote cluster waiting for its turn to start after a
			// restart: what the last manager found of its Talos API is
			// kept until the reads say otherwise (below), not replaced
			// by a wait that would hand it to a new time (review 248).
			keptUnreachable = true
		}
	case reach.unreachable():
		ready.Status = metav1.ConditionFalse
		ready.Reason = ichorv1alpha1.ReasonTalosAPIUnreachable
		ready.Message = engine.Clip(fmt.Sprintf("no machine's Talos API answered: the %d of the cluster's %d machines read in the last %s all failed; %s: %s",
			reach.machines, reach.total, readFreshness, reach.machine, reach.err), "", maxConditionMessage)
	case reach.early && reach.answered == 0:
		// Just after a restart or a hand-over, no read has said anything
		// yet: the Talos API an earlier manager found unreachable stays
		// so, its time unchanged, until a machine answers or the reads
		// have had readFreshness (review 247, F2: it went True, then False
		// again a minute or two later with a new time, at every rollout).
		keptUnreachable = keepUnreachable(cluster, &ready)
	}
	meta.SetStatusCondition(&cluster.Status.Conditions, ready)
	cluster.Status.ObservedGeneration = cluster.Generation
	return keptUnreachable
}

// keepUnreachable makes ready the cluster's Ready as it is, if that is
// False for TalosAPIUnreachable, of the spec as it is now (a spec changed
// since is looked at afresh: kstatus would take the old verdict as the new
// spec's), and reports whether it was.
func keepUnreachable(cluster *ichorv1alpha1.TalosCluster, ready *metav1.Condition) bool {
	prev := meta.FindStatusCondition(cluster.Status.Conditions, ichorv1alpha1.ConditionReady)
	if prev == nil || prev.Status != metav1.ConditionFalse || prev.Reason != ichorv1alpha1.ReasonTalosAPIUnreachable ||
		prev.ObservedGeneration != cluster.Generation {
		return false
	}
	ready.Status, ready.Reason, ready.Message = prev.Status, prev.Reason, prev.Message
	return true
}

// truncate cuts s to at most n bytes, at a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// requestsCondition says whether the rule withholds approvals for a flood:
// withheld requests the cluster's last decisions withheld.
func requestsCondition(cluster *ichorv1alpha1.TalosCluster, withheld int) metav1.Condition {
	if withheld > 0 {
		return metav1.Condition{
			Type:   ichorv1alpha1.ConditionKubeletServingRequests,
			Status: metav1.ConditionFalse,
			Reason: ichorv1alpha1.ReasonTooManyPendingRequests,
			Message: fmt.Sprintf("%d kubelet serving requests are withheld: the API server holds more undecided requests than the machines explain, "+
				"and nothing is approved until a person looks (`ichor decisions list --policy kubelet-serving --action pending` names them; delete or deny the flood)", withheld),
			ObservedGeneration: cluster.Generation,
		}
	}
	return metav1.Condition{
		Type:               ichorv1alpha1.ConditionKubeletServingRequests,
		Status:             metav1.ConditionTrue,
		Reason:             ichorv1alpha1.ReasonRequestsWithinBounds,
		Message:            "the undecided kubelet serving requests are within what the machines explain",
		ObservedGeneration: cluster.Generation,
	}
}

// clearConditions removes the conditions when the option is off; Ready
// stays, True.
func (r *Reconciler) clearConditions(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) error {
	before := cluster.DeepCopy()
	meta.RemoveStatusCondition(&cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	meta.RemoveStatusCondition(&cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)
	meta.RemoveStatusCondition(&cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingRequests)
	setReady(cluster, reachability{})
	if !statusChanged(before.Status, cluster.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, cluster, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("remove kubelet serving conditions: %w", err)
	}
	return nil
}

// maxNamedMachines bounds the machines a condition names: a message is at
// most 32 KiB, and thousands of names would make the status unwritable.
const maxNamedMachines = 20

// namesOf are the machines' names, in their order.
func namesOf(machines []*ichorv1alpha1.TalosMachine) []string {
	names := make([]string, len(machines))
	for i, m := range machines {
		names[i] = m.Name
	}
	return names
}

// nameSome joins the first n names, and says how many more there are.
func nameSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
