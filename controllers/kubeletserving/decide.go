package kubeletserving

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/go-logr/logr"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// handle does what one request needs: record its certificate once issued,
// decide it while undecided, nothing otherwise.
func (p *pass) handle(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if csr.Spec.SignerName != certificatesv1.KubeletServingSignerName {
		return nil
	}
	if !p.stillServes() {
		// The shard went while the request waited for a worker: its new
		// holder sees to it.
		return nil
	}
	key := p.memoKey(csr)
	if w, ok := p.r.uncertain.Get(key); ok && !approval.IsDecided(csr) {
		// A write of it may have been applied all the same (a 504): the
		// API server says whether it is still undecided, not the cache,
		// which may not show the write yet. Deciding it again from the
		// cache would log a second verdict.
		live, err := p.target.clientset.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && live.UID != csr.UID):
			// Gone: a record owed of it is made all the same (review 17).
			p.r.failures.Forget(key)
			if w, ok := p.r.uncertain.Take(key); ok {
				p.r.recordOwed(ctx, map[memoKey]approval.UncertainWrite{key: w})
			}
			return nil
		case err != nil:
			return fmt.Errorf("read CSR %s again after a failed write: %w", csr.Name, err)
		}
		csr = live
		// Still undecided, it is decided again from what the API server
		// says. The write stays uncertain while it may yet commit (an API
		// server that answered with a timeout may still be at it): until
		// the request is at another version than the write was made on
		// (a later write here, or any change), or the write is too old.
		if !approval.IsDecided(csr) && w.CannotCommit(csr.ResourceVersion, p.r.Clock.Now()) {
			if w, ok := p.r.uncertain.Take(key); ok {
				w.SettleAct()
			}
		}
	}
	if len(csr.Status.Certificate) > 0 {
		recorded := p.settle(ctx, csr)
		if err := p.record(ctx, csr); err != nil {
			return err
		}
		p.lookedAt(csr, recorded)
		return nil
	}
	if approval.IsDecided(csr) {
		p.lookedAt(csr, p.settle(ctx, csr))
		return nil
	}
	return p.decide(ctx, csr)
}

// lookedAt forgets the failure of a decided request whose look did all it
// had to: its verdict in effect recorded (or nothing to record) and its
// certificate, if any, recorded on its machine. One whose verdict's record
// failed again keeps its backoff (recordLater).
func (p *pass) lookedAt(csr *certificatesv1.CertificateSigningRequest, recorded bool) {
	if recorded {
		p.r.failures.Forget(p.memoKey(csr))
	}
}

// settle records which decision is in effect on a request whose last write
// here failed: a write answered with an error (a 504, a lost connection) may
// have been applied all the same, and a conflict means another writer
// decided. The condition names the decision that was applied.
//
// A cluster taken over from another replica is settled the same way: that
// replica may have written a verdict and stopped (been killed) before it
// recorded it applied, so the verdicts written since shortly before the
// take-over are recorded again, naming the decision the condition names (a
// record naming the same decision twice says nothing new).
//
// It reports whether it recorded what it had to (true when nothing). A
// record that fails is tried again at the request's next look (review 14,
// M1): a failed write's, by the failures memo; a cluster's adoption, by the
// reconcile, which keeps the adoption unsettled (review 14, H1).
func (p *pass) settle(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (recorded bool) {
	// Taken, not looked at then forgotten: the reconcile and a worker may
	// settle the same request at once, and only one records it.
	w, failed := p.r.uncertain.Take(p.memoKey(csr))
	if !failed && !p.adopts(csr) {
		return true
	}
	// A failed write of this replica's is settled once its verdict is
	// recorded, or when the condition names no approver's decision (nothing
	// of this replica's to record); a record that fails leaves it
	// unsettled, for the next look here or the next holder to record.
	recorded = true
	decision, named := approval.DecisionOf(csr)
	var owed *engine.Applied
	switch {
	case failed && w.Record != nil:
		// A record owed of this replica's own write, refused before: what
		// it wrote, whatever the condition is read to say.
		owed = w.Record
	case failed:
		// A write of unknown outcome: recorded only as what it wrote, if
		// the condition names that, or as a cluster's adoption records it.
		switch observed, ok := w.Observed(csr); {
		case ok:
			owed = &observed
		case named && p.adopts(csr):
			owed = &engine.Applied{
				DecisionID: decision.ID, Object: "csr/" + csr.Name, UID: string(csr.UID), Action: decision.Action, Outcome: engine.AppliedObserved,
				Adopted: true,
			}
		case named:
			log.FromContext(ctx).Info("the request's condition names a decision this replica did not write on it; not recorded as applied",
				"csr", csr.Name, "condition_decision_id", decision.ID)
		}
	case named:
		// Reached only by a cluster's adoption (a request with no failed
		// write of this replica's is settled only then).
		owed = &engine.Applied{
			DecisionID: decision.ID, Object: "csr/" + csr.Name, UID: string(csr.UID), Action: decision.Action, Outcome: engine.AppliedObserved,
			Adopted: true,
		}
	}
	if owed != nil {
		if err := p.r.Engine.RecordApplied(ctx, *owed); err != nil {
			log.FromContext(ctx).Error(err, "record the applied decision", "csr", csr.Name, "decision_id", owed.DecisionID)
			recorded = false
		} else {
			// Not recorded again by the cluster's adoption: a pass that
			// retries it for another verdict whose record failed records
			// only that one.
			p.r.adoptions.wrote(p.key(), owed.DecisionID)
		}
	}
	switch {
	case failed && recorded:
		w.SettleAct()
	case failed:
		stamp := decision.At
		if !named {
			stamp = w.At
		}
		p.recordLater(csr, *owed, stamp)
	}
	return recorded
}

// recordLater keeps a decided request whose applied record failed (the
// decision log's sink refused it) among those to look at: its next look
// finds it decided and records the verdict its condition names (settle).
// Before, nothing looked at it again while the shard stayed here. The
// record is owed whatever becomes of the request (recordOwed), and the
// verdict, stamped at, is unsettled on the hold meanwhile (on this hold,
// which may not be the one its write was made under: review 16, L3).
func (p *pass) recordLater(csr *certificatesv1.CertificateSigningRequest, owed engine.Applied, stamp time.Time) {
	p.unsettle(csr, stamp)
	p.r.uncertain.Add(p.memoKey(csr), approval.UncertainWrite{At: p.r.Clock.Now(), Settle: p.actSettler(csr), Record: &owed})
	_, wait := p.r.failures.Pending(p.memoKey(csr), approval.Verdict{ResourceVersion: csr.ResourceVersion, Epoch: p.r.machineEpoch.Get(), Revision: p.r.revision()}, struct{}{}, p.now, backoff.After)
	p.retryIn(wait)
}

// recordOwed records the verdicts owed by uncertain writes forgotten because
// their request or cluster is gone (review 16, M1): a verdict known to be in
// effect (written, its record refused) is recorded whatever became of its
// request; the others have nothing left to record. Each recorded, or with
// nothing to record, is settled; one refused again is kept, and owed is
// true, for the caller to look again.
func (r *Reconciler) recordOwed(ctx context.Context, dropped map[memoKey]approval.UncertainWrite) (owed bool) {
	for k, w := range dropped {
		if w.Record != nil {
			if err := r.Engine.RecordApplied(ctx, *w.Record); err != nil {
				log.FromContext(ctx).Error(err, "record the applied decision of a request no longer judged here; tried again", "object", w.Record.Object, "decision_id", w.Record.DecisionID)
				r.uncertain.Add(k, w)
				owed = true
				continue
			}
		}
		w.SettleAct()
	}
	return owed
}

// machineFor finds the machine with node name node among every cluster that
// judges the same API server: for a cluster with a kubeconfigRef, its own
// machines; for the API server the manager runs against, the machines of
// every cluster the operator named as its judges (LocalClusters). It returns this cluster's machine (nil when
// none) and how many candidates there are: a request that more than one
// machine answers to is left pending by the rule (MachineAmbiguous), and one
// that only another cluster's machine answers to is that cluster's to decide.
func (p *pass) machineFor(ctx context.Context, node string) (mine *ichorv1alpha1.TalosMachine, candidates int, others bool, err error) {
	found, err := machines.FindAll(ctx, p.r.Client, node, func(m *ichorv1alpha1.TalosMachine) (bool, error) {
		return p.judges(ctx, clusterOf(m))
	})
	if err != nil {
		return nil, 0, false, err
	}
	for i := range found {
		if found[i].Namespace == p.cluster.Namespace && found[i].Spec.ClusterName == p.cluster.Name {
			if mine == nil {
				mine = &found[i]
			}
		} else {
			others = true
		}
	}
	return mine, len(found), others, nil
}

func clusterOf(m *ichorv1alpha1.TalosMachine) types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}
}

// judges reports whether a cluster's machines count when a request of this
// pass's API server is matched to a machine: this cluster's always; for the
// API server the manager runs against, those of every enabled cluster the
// operator named as its judges; for another, none. It is looked up afresh
// each time a decision needs it: a decision may run long after its pass
// began, and a cluster enabled meanwhile must make a shared name ambiguous.
func (p *pass) judges(ctx context.Context, key types.NamespacedName) (bool, error) {
	if key == p.key() {
		return true, nil
	}
	if !p.target.local {
		return false, nil
	}
	var c ichorv1alpha1.TalosCluster
	if err := p.r.Client.Get(ctx, key, &c); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return servesKubeletCertificates(&c) && p.r.LocalClusters.Judges(&c), nil
}

// requestsToLookAt lists the kubelet-serving requests of the pass's API
// server that are this cluster's to decide or record: those for a node name
// one of its machines answers to, and those for a name no machine of a
// cluster judging this API server answers to, which every such cluster
// leaves pending (machineFor). A request for another judging cluster's
// machine is that cluster's, so that K clusters' reconciles look at each
// request once between them rather than K times: each look parses the
// request or its certificate and looks its machine up. Of those, it leaves
// out the requests handle has nothing left to do for (settled), so that the
// reconciles that follow every machine change cost little once a
// fleet's requests are decided.
//
// It returns them, and the UIDs of every request the API server holds.
func (p *pass) requestsToLookAt(ctx context.Context) ([]certificatesv1.CertificateSigningRequest, map[types.UID]bool, error) {
	var list certificatesv1.CertificateSigningRequestList
	if err := p.target.reader.List(ctx, &list, client.MatchingFields{IndexSignerName: certificatesv1.KubeletServingSignerName},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("list kubelet-serving CSRs: %w", err)
	}
	live := make(map[types.UID]bool, len(list.Items))
	for i := range list.Items {
		live[list.Items[i].UID] = true
	}
	p.target.names.keepOnly(live)
	mine, err := p.machinesByNodeName(ctx)
	if err != nil {
		return nil, nil, err
	}
	// The node names the judging clusters' machines answer to, asked once
	// for this choice when a request on the manager's own API server is
	// for none of this cluster's machines: such a name is another judging
	// cluster's machine's, the answer ours would give without a lookup a
	// request (over K clusters, most requests are another's). On a
	// cluster's own API server no other cluster judges: every request is
	// its own. The names are kept while the machines' names and the
	// judging clusters stay the same. A name whose machine changed while
	// this pass listed is looked at by the pass its event brings (the
	// machine's cluster's, and this one's if the machine is its). The
	// decisions look again (machineFor).
	var judged map[string]bool
	var out []certificatesv1.CertificateSigningRequest
	for i := range list.Items {
		csr := &list.Items[i]
		node := p.target.names.of(csr)
		ours, recorded := true, false
		if named, ok := mine[node]; ok {
			recorded = slices.ContainsFunc(named, func(m *ichorv1alpha1.TalosMachine) bool { return recordsRequest(m, csr.Name) })
		} else if node != "" && p.target.local {
			if judged == nil {
				if judged, err = p.judgedNames(ctx); err != nil {
					return nil, nil, err
				}
			}
			ours = !judged[node]
		}
		if !ours || p.settled(csr, recorded) {
			continue
		}
		// The list shares the cache's objects; what is handed on is a copy.
		out = append(out, certificatesv1.CertificateSigningRequest{})
		csr.DeepCopyInto(&out[len(out)-1])
	}
	return out, live, nil
}

// requestsOf are the requests of one requester that are this cluster's to
// decide or record and have something left to do, oldest first: the order
// the flood guard counts them in.
func (p *pass) requestsOf(ctx context.Context, username string) ([]certificatesv1.CertificateSigningRequest, error) {
	var list certificatesv1.CertificateSigningRequestList
	if err := p.target.reader.List(ctx, &list, client.MatchingFields{IndexUndecided: "made-by:" + username}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list the requests of %s: %w", username, err)
	}
	judging := map[types.NamespacedName]bool{}
	var out []certificatesv1.CertificateSigningRequest
	for i := range list.Items {
		csr := &list.Items[i]
		ours, recorded, err := p.ours(ctx, p.target.names.of(csr), csr.Name, judging)
		if err != nil {
			return nil, err
		}
		if !ours || p.settled(csr, recorded) {
			continue
		}
		// The list shares the cache's objects; what is handed on is a copy.
		out = append(out, certificatesv1.CertificateSigningRequest{})
		csr.DeepCopyInto(&out[len(out)-1])
	}
	slices.SortFunc(out, oldestFirst)
	return out, nil
}

// hasRequests reports whether the target's cache holds a kubelet-serving
// request of username, decided or not: a lookup of the cache's index.
func (p *pass) hasRequests(ctx context.Context, username string) (bool, error) {
	var list certificatesv1.CertificateSigningRequestList
	if err := p.target.reader.List(ctx, &list, client.MatchingFields{IndexUndecided: "made-by:" + username}, client.UnsafeDisableDeepCopy); err != nil {
		return false, fmt.Errorf("list the requests of %s: %w", username, err)
	}
	return len(list.Items) > 0, nil
}

// settled reports whether handle has nothing to do for a request: decided,
// no write of it waiting to be settled (failures), and no certificate or one
// that its machine has recorded already.
func (p *pass) settled(csr *certificatesv1.CertificateSigningRequest, recorded bool) bool {
	return approval.IsDecided(csr) && !p.r.failures.Has(p.memoKey(csr)) && !p.r.uncertain.Has(p.memoKey(csr)) && !p.adopts(csr) && (len(csr.Status.Certificate) == 0 || recorded)
}

// machinesByNodeName are this cluster's machines by the node names they
// answer to (machines.NodeNames, as the index ours reads), listed once for a
// full pass: most of its requests are for one of them. They share the
// cache's objects: read only.
func (p *pass) machinesByNodeName(ctx context.Context) (map[string][]*ichorv1alpha1.TalosMachine, error) {
	var list ichorv1alpha1.TalosMachineList
	if err := p.r.Client.List(ctx, &list, client.InNamespace(p.cluster.Namespace), client.MatchingFields{IndexCluster: p.cluster.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list the machines of cluster %s: %w", p.key(), err)
	}
	byName := make(map[string][]*ichorv1alpha1.TalosMachine, len(list.Items))
	for i := range list.Items {
		m := &list.Items[i]
		for _, n := range machines.NodeNames(m) {
			byName[n] = append(byName[n], m)
		}
	}
	return byName, nil
}

// recordsRequest reports whether machine m has recorded the certificate of the
// request csr.
func recordsRequest(m *ichorv1alpha1.TalosMachine, csr string) bool {
	rec := m.Status.KubeletServingCertificate
	return rec != nil && rec.Request == csr
}

// ours reports whether a request for node is this cluster's: the same
// answer machineFor gives (a machine of this cluster, or none of any cluster
// judging this API server), without copying the machines; and whether a
// machine of this cluster has recorded the request csr's certificate. judging
// remembers judges' answers.
func (p *pass) ours(ctx context.Context, node, csr string, judging map[types.NamespacedName]bool) (ours, recorded bool, err error) {
	if node == "" {
		return true, false, nil
	}
	var named ichorv1alpha1.TalosMachineList
	if err := p.r.Client.List(ctx, &named, client.MatchingFields{machines.IndexNodeName: node}, client.UnsafeDisableDeepCopy); err != nil {
		return false, false, fmt.Errorf("list machines with node name %q: %w", node, err)
	}
	others := false
	for i := range named.Items {
		m := &named.Items[i]
		key := clusterOf(m)
		if key == p.key() {
			ours = true
			recorded = recorded || recordsRequest(m, csr)
			continue
		}
		judges, known := judging[key]
		if !known {
			if judges, err = p.judges(ctx, key); err != nil {
				return false, false, err
			}
			judging[key] = judges
		}
		others = others || judges
	}
	return ours || !others, recorded, nil
}

func (p *pass) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	logger := log.FromContext(ctx).WithValues("csr", csr.Name)
	// Taken before the machine is looked up and the rule decides: a
	// machine changed or a bundle activated meanwhile makes the verdict
	// remembered below one to reach again (taken after, a machine that
	// took the name meanwhile would leave the request waiting for a change
	// that has come).
	epoch, revision := p.r.machineEpoch.Get(), p.r.revision()
	node := p.target.names.of(csr)
	machine, candidates, others, err := p.machineFor(ctx, node)
	if err != nil {
		return err
	}
	g := gathered{node: node, machine: machine, candidates: candidates}
	if machine == nil && others {
		// Another cluster's machine answers to this name: that cluster decides.
		return nil
	}
	if machine == nil {
		// Still no machine answers to the name, and the rule leaves a parsed
		// request for such a name pending whatever else it holds: one left
		// so at this version is not decided (and logged) again at each
		// change of the machines (any machine's, in any namespace, moves
		// their epoch), only once it changes or a machine takes the name. A
		// flood of requests for made-up names costs one decision each.
		// A new bundle decides it again: the operator's rule may say
		// otherwise of such a request.
		if v, ok := p.r.memo.Verdict(p.memoKey(csr)); ok && v.ResourceVersion == csr.ResourceVersion && v.Revision == revision && v.Key == codeMachineUnknown {
			return nil
		}
	}
	if wait, skip := p.r.memo.Skip(p.memoKey(csr), csr.ResourceVersion, epoch, revision, p.now); skip {
		p.retryIn(wait)
		return nil
	}
	facts := approval.Verdict{ResourceVersion: csr.ResourceVersion, Epoch: epoch, Revision: revision}

	in := csrinput.KubeletServing{CSR: csrinput.Build(csr), MachineCandidates: candidates}
	if in.Requests, err = p.requests(ctx, csr); err != nil {
		return err
	}
	if machine != nil {
		in.Machine = &csrinput.Machine{Name: machine.Name, Namespace: machine.Namespace, Cluster: machine.Spec.ClusterName}
		// A requester with several undecided requests may be flooding: the
		// rule says first whether it rejects this one whatever the node's
		// identity, so that a flood costs no Talos read. One undecided
		// request (the usual case) is never over a limit, and costs no
		// second evaluation.
		if in.Requests.FromRequester > 1 {
			// As before the verdict below: the requester's requests may
			// have been listed from a remote API server, for seconds.
			if may, err := p.mayDecide(ctx, logger, g); !may || err != nil {
				return err
			}
			d, err := p.r.Engine.KubeletServingRejection(ctx, in)
			switch {
			case err == nil && (d.Action != engine.ActionDeny || len(d.Reasons) == 0):
				// Only a reasoned denial may skip the node's identity; the
				// engine refuses any other answer, and so does this.
				return fmt.Errorf("rejection %s on CSR %s is %q with %d reasons, not a reasoned denial: nothing done", d.DecisionID, csr.Name, d.Action, len(d.Reasons))
			case err == nil:
				return p.act(ctx, logger, csr, g, facts, d)
			case !errors.Is(err, engine.ErrNoDecision):
				return fmt.Errorf("decide CSR %s: %w", csr.Name, err)
			}
		}
		// Only a read for the node's own request says whether Ichor reaches
		// the cluster: anyone may ask in a node's name, and a request of
		// another requester (denied by the rule) must not make the
		// cluster's Ready False.
		limits, err := p.r.limits.get(ctx, p.r.Engine, p.now)
		if err != nil {
			return fmt.Errorf("the limits of the kubelet serving rule: %w", err)
		}
		in.Node = p.readNode(ctx, machine, csr.Spec.Username == limits.NodeUserPrefix+node)
		// A node that still cannot be read, for the same reason, changes no
		// fact: it is looked at again soon, without a new decision (and log
		// entry) each time, so that it is decided within seconds of coming
		// back.
		if !in.Node.Readable && p.r.memo.Hold(p.memoKey(csr), facts.WithKey(codeNodeUnreadable), maxBackoff, unreadableRecheck, p.now) {
			p.retryIn(unreadableRecheck)
			return nil
		}
		// The read may have taken seconds: the counts the rule weighs are
		// those of now (kept between events, so this is mostly no listing).
		if in.Requests, err = p.requests(ctx, csr); err != nil {
			return err
		}
	}
	if may, err := p.mayDecide(ctx, logger, g); !may || err != nil {
		return err
	}
	d, err := p.r.Engine.KubeletServing(ctx, in)
	if errors.Is(err, engine.ErrNoDecision) {
		// The rule does not govern this request (a bundle without it, or
		// whose rule leaves it out): it is asked again, and logged, on a
		// pending verdict's backoff rather than at every look, and at once
		// when the request, the machines or the bundle change (another
		// bundle's activation, which may govern it, wakes its cluster:
		// BundleActivated). Not only on a change: the rule may leave it out
		// on what the memo does not key on (the node's identity, the flood
		// counts). It is not counted pending (leftPending): no rule keeps it.
		_, wait := p.r.memo.Pending(p.memoKey(csr), facts.WithKey(engine.ActionNone), struct{}{}, p.now, backoff.After)
		p.retryIn(wait)
		return nil
	}
	if err != nil {
		return fmt.Errorf("decide CSR %s: %w", csr.Name, err)
	}
	return p.act(ctx, logger, csr, g, facts, d)
}

// mayDecide reports whether the rule may be asked now: no verdict is
// reached, nor logged, that would not be written.
func (p *pass) mayDecide(ctx context.Context, logger logr.Logger, g gathered) (bool, error) {
	if !p.stillServes() {
		// The shard went during the Talos read (or this replica was paused
		// past its renew deadline).
		logger.V(1).Info("not decided: the cluster is no longer served by this replica")
		return false, nil
	}
	if ctx.Err() != nil {
		// The manager is stopping (or the cluster's target ended). Not a
		// failure: the request is looked at again by the next leader (or
		// through the cluster's next target).
		logger.V(1).Info("not decided: the turn ended", "cause", context.Cause(ctx))
		return false, nil
	}
	// Nor on a cluster or a machine that changed since the turn or the
	// decision read them (a node's read may have taken seconds, the turn's
	// earlier requests too): a verdict logged and then not written would
	// read as in effect in the decision log. act checks again before it
	// writes, for the milliseconds of the rule.
	dropped, err := p.dropped(ctx, logger, g, "not decided")
	return !dropped && err == nil, err
}

// gathered is what a decision found of the request's machine: the node's
// name, the cluster's machine that answers to it (nil when none) and how
// many machines of the clusters judging its API server do.
type gathered struct {
	node       string
	machine    *ichorv1alpha1.TalosMachine
	candidates int
}

// act carries out a decision on the request, reached on facts (their Key
// unset) and on what was gathered of its machine.
func (p *pass) act(ctx context.Context, logger logr.Logger, csr *certificatesv1.CertificateSigningRequest, g gathered, facts approval.Verdict, d engine.CSRDecision) error {
	machine := g.machine
	logger = logger.WithValues("node", d.Node, "action", d.Action, "codes", d.Reasons.Codes(), "decision_id", d.DecisionID, "revision", d.Revision)
	// The engine refuses such answers of a broken bundle; whatever decides
	// here must not be trusted further than that.
	switch {
	case d.Action != engine.ActionApprove && d.Action != engine.ActionDeny && d.Action != engine.ActionPending:
		return fmt.Errorf("decision %s on CSR %s has unknown action %q: nothing done", d.DecisionID, csr.Name, d.Action)
	case len(d.Reasons) == 0:
		return fmt.Errorf("decision %s on CSR %s gives no reason: nothing done", d.DecisionID, csr.Name)
	}

	// The verdict's stamp, the time of its write, not the pass's start: a
	// replica that takes the cluster over right after records again the
	// verdicts stamped within its window (adopts), and a pass may have read
	// nodes for seconds before this write (review 12, M1).
	at := p.r.Clock.Now()
	// An earlier write of this request whose outcome is unknown, made on a
	// version the request may still be at: this write settles it if it
	// succeeds (the earlier one then fails its version). Taken before the
	// write, so that a reconcile that sees this write in its cache does not
	// record it as the earlier one's (review 15, M1); given back if this
	// write is refused.
	var earlier approval.UncertainWrite
	var hadEarlier bool
	// The write is cancelled if the shard goes before it is sent; its
	// record, once it was written, is kept whatever happens meanwhile.
	record := context.WithoutCancel(ctx)
	write := ctx
	if d.Action == engine.ActionApprove || d.Action == engine.ActionDeny {
		if p.fence == nil {
			// Not shared out, nobody records a verdict of this replica's
			// but itself: a write not begun once the manager was told to
			// stop is the next leader's to make (and nothing is taken
			// from the uncertain writes for it); one begun is finished
			// and recorded, within approval.FinishGrace.
			if ctx.Err() != nil {
				logger.V(1).Info("not written: the turn ended", "cause", context.Cause(ctx))
				return nil
			}
			var cancel context.CancelFunc
			write, cancel = approval.Finishing(ctx, approval.FinishGrace)
			defer cancel()
			if p.target.watch != nil {
				// A turn still ends with its target (review 10 F1): a
				// kubeconfig withdrawn or a cluster forgotten while the
				// manager runs, not the manager's stop, which ends every
				// target's watch too.
				defer context.AfterFunc(p.target.watch, func() {
					if p.r.runCtx == nil || p.r.runCtx.Err() == nil {
						cancel()
					}
				})()
			}
		}
		// Just before the write, and whatever came before: this replica
		// still serves the cluster and was renewed within the renew
		// deadline, or it writes nothing (review 4, S1). Until done, a
		// graceful release waits for the write's record, and one that
		// cannot wait that long says the write's stamp.
		done, err := p.begin(at)
		if err != nil {
			logger.Info("not written: the cluster is no longer served by this replica")
			return nil
		}
		defer done()
		// A turn reads its cluster once, and may have decided others of the
		// requester's requests, or read a node, for seconds since: the
		// operator's word that came meanwhile (the cluster turned off, the
		// machine deleted) holds before any write (review 216 F4).
		if dropped, err := p.dropped(ctx, logger, g, "not written"); dropped || err != nil {
			return err
		}
		// Noted before the write: a pass settling the cluster's adoption
		// may see the write in its cache before this worker records it.
		p.r.adoptions.wrote(p.key(), d.DecisionID)
		earlier, hadEarlier = p.r.uncertain.Take(p.memoKey(csr))
	}
	recorded := true
	owed := engine.Applied{DecisionID: d.DecisionID, Object: "csr/" + csr.Name, UID: string(csr.UID), Action: d.Action, Outcome: engine.AppliedWritten}
	switch d.Action {
	case engine.ActionApprove:
		if err := approval.Approve(write, p.target.clientset, csr, ApprovalReason, d.ConditionMessage(), at); err != nil {
			p.writeFailed(err, csr, &owed, at, earlier, hadEarlier)
			return p.unwritten(ctx, err, csr, machine)
		}
		p.written(csr)
		logger.Info("approved kubelet serving certificate")
		recorded = p.applied(record, csr, owed)
		// No Event: the Approved condition and the decision log say it, and
		// at a mass reboot an Event per approval doubles the API writes.
	case engine.ActionDeny:
		// The first reason by code: conditions take one reason, and the
		// message lists them all.
		if err := approval.Deny(write, p.target.clientset, csr, d.Reasons[0].Code, d.ConditionMessage(), at); err != nil {
			p.writeFailed(err, csr, &owed, at, earlier, hadEarlier)
			return p.unwritten(ctx, err, csr, machine)
		}
		p.written(csr)
		logger.Info("denied kubelet serving certificate")
		recorded = p.applied(record, csr, owed)
		p.event(machine, csr, corev1.EventTypeWarning, "Denied", engine.EventAction("Decide", d.Reasons.Codes()...), d.EventNote())
	case engine.ActionPending:
		key := strings.Join(d.Reasons.Codes(), ",")
		if key == codeTooManyPending {
			p.r.Metrics.withheld(p.cluster.Namespace, p.cluster.Name, p.metricsGen)
		}
		first, wait := p.r.memo.Pending(p.memoKey(csr), facts.WithKey(key), struct{}{}, p.now, pendingWait(key))
		p.retryIn(wait)
		if first {
			logger.Info("left kubelet serving certificate pending")
			if machine != nil {
				p.event(machine, nil, corev1.EventTypeWarning, "KubeletServingPending", engine.EventAction("Decide", d.Reasons.Codes()...), d.EventNote())
			}
		}
	}
	if !recorded {
		// Its act stays unsettled from the earlier write's stamp on.
		p.recordLater(csr, owed, at)
		return nil
	}
	p.r.failures.Forget(p.memoKey(csr))
	if hadEarlier {
		// Written, and recorded, on the version the request was at after
		// the earlier write: that one can no longer commit.
		earlier.SettleAct()
	}
	return nil
}

// unwritten is what a refused verdict write comes to: a failure, tried again
// with backoff, unless another writer decided the request meanwhile (the
// leader before, a person, or kube-controller-manager's approver beside
// Ichor): that request is decided and no longer Ichor's, and losing the
// race is no failure to count, log as an error or try again (review 177).
func (p *pass) unwritten(ctx context.Context, err error, csr *certificatesv1.CertificateSigningRequest, machine *ichorv1alpha1.TalosMachine) error {
	if errors.Is(err, approval.ErrDecidedMeanwhile) {
		log.FromContext(ctx).V(1).Info("not written: another writer decided the request meanwhile", "csr", csr.Name)
		p.r.failures.Forget(p.memoKey(csr))
		return nil
	}
	return &writeError{err: err, machine: machine}
}

// written remembers that a verdict was written on this version of the
// request, until the cache shows it: a pass that listed the request before
// the write must not decide it again from that stale copy.
func (p *pass) written(csr *certificatesv1.CertificateSigningRequest) {
	p.r.memo.Applied(p.memoKey(csr), csr.ResourceVersion, struct{}{})
}

// applied records in the decision log that the decision was written on the
// request: of several verdicts logged for one request (the first write
// conflicted), this is the one in effect. It reports whether the record
// was written; one refused is owed (recordLater).
func (p *pass) applied(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, owed engine.Applied) bool {
	if err := p.r.Engine.RecordApplied(ctx, owed); err != nil {
		log.FromContext(ctx).Error(err, "record the applied decision", "csr", csr.Name, "decision_id", owed.DecisionID)
		return false
	}
	return true
}

// readNode reads the machine's identity over its Talos API, from its live
// watch when it has one fresh enough (NodeReaders.Read). A failure is a
// fact for the rule (readable=false, and why), never a decision here. With
// reach, the outcome counts towards the cluster's Ready.
func (p *pass) readNode(ctx context.Context, machine *ichorv1alpha1.TalosMachine, reach bool) *csrinput.Node {
	observe := func(err error) {
		if reach {
			p.r.NodeReaders.observe(p.key(), machine.Name, p.r.Clock.Now(), err)
		}
	}
	start := time.Now()
	id, source, err := p.r.NodeReaders.Read(ctx, p.cluster, machine.Spec.Endpoint)
	if ctx.Err() == nil {
		// A read cut short by the turn's end (the shard let go, the
		// manager stopping) says nothing of the node: neither to the
		// metrics nor to the cluster's Ready (review 184). A timed-out
		// read given again (talosnode.ErrHeld) made no read: the
		// metrics count the read that timed out, not its echoes
		// (review 212); Ready hears it, the node still not answering.
		if !errors.Is(err, talosnode.ErrHeld) {
			p.r.Metrics.talosRead(p.cluster.Namespace, p.cluster.Name, p.metricsGen, source, err, time.Since(start))
		}
		observe(err)
	}
	if err != nil {
		// The node's own words may be in it (a status message): bounded,
		// as the audit's are.
		return &csrinput.Node{Readable: false, Error: engine.Clip(err.Error(), "", maxReadError), Addresses: []string{}}
	}
	return &csrinput.Node{Readable: true, Nodename: id.Nodename, Hostname: id.Hostname, Addresses: id.Addresses}
}

// dropped reports whether the cluster or the request's machine changed
// since the pass and the decision read them (changed), and then logs it
// (outcome: "not decided" before the rule ran, "not written" after, when
// the log holds the verdict without an applied record), counts it and asks
// for the request to be looked at again.
//
// A change of the cluster's is errClusterChanged: the turn ends, since its
// requester's other requests were listed for what the cluster no longer
// is (each would be read, then dropped).
func (p *pass) dropped(ctx context.Context, logger logr.Logger, g gathered, outcome string) (bool, error) {
	c, err := p.changed(ctx, g)
	if err != nil || c.why == "" {
		return false, err
	}
	logger.Info(outcome+": what the verdict was to be reached on changed meanwhile; looked at again", "change", c.why)
	p.r.Metrics.droppedVerdict(c.kind)
	p.retryIn(minBackoff)
	if c.kind != changeMachine {
		return true, errClusterChanged
	}
	return true, nil
}

// errClusterChanged ends a turn whose cluster changed under it (dropped).
var errClusterChanged = errors.New("the cluster changed during the turn")

const changeMachine = "machine"

// change is what changed under a decision: its kind, a bounded set the
// metric counts by, and why, in words; nothing when why is "".
type change struct{ kind, why string }

// changed says what changed, since the pass and the request's machine were
// read, that forbids a verdict on what the decision gathered. A cluster
// disabled, deleted or moved to another API server, or a machine deleted,
// re-pointed (a spec change: its endpoint, its cluster) or joined by
// another answering to the node's name, is the operator's word that arrived
// meanwhile: a verdict written after it would be one the operator had
// withdrawn (review 211 F2). A direct read of the node may take the Talos
// timeout, and a turn goes through a requester's requests one after the
// other on the cluster it read first. Reads from the cache.
func (p *pass) changed(ctx context.Context, g gathered) (change, error) {
	var c ichorv1alpha1.TalosCluster
	err := p.r.Client.Get(ctx, p.key(), &c, client.UnsafeDisableDeepCopy)
	switch {
	case apierrors.IsNotFound(err):
		return change{"cluster_deleted", "the cluster was deleted"}, nil
	case err != nil:
		return change{}, fmt.Errorf("read TalosCluster %s again before its verdict: %w", p.key(), err)
	case c.UID != p.cluster.UID:
		return change{"cluster_deleted", "the cluster was deleted and made anew"}, nil
	case !c.DeletionTimestamp.IsZero():
		return change{"cluster_deleted", "the cluster is being deleted"}, nil
	case !servesKubeletCertificates(&c):
		return change{"cluster_off", "kubelet serving certificates were turned off"}, nil
	}
	if t := p.r.currentTarget(&c); t == nil || (t != p.target && !(t.local && p.target.local)) {
		// A remote target replaced ends the turn's context too; a cluster
		// no longer named as a judge of the local API server does not.
		return change{"cluster_target", "the cluster's API server changed"}, nil
	}
	now, n, _, err := p.machineFor(ctx, g.node)
	switch {
	case err != nil:
		return change{}, err
	case (now == nil) != (g.machine == nil):
		return change{changeMachine, "the cluster's machine answering to the node's name came or went"}, nil
	case now != nil && now.UID != g.machine.UID:
		return change{changeMachine, "another machine answers to the node's name"}, nil
	case now != nil && now.Generation != g.machine.Generation:
		return change{changeMachine, "the machine's spec changed"}, nil
	case n != g.candidates:
		return change{changeMachine, "the machines answering to the node's name changed"}, nil
	}
	return change{}, nil
}

// record writes an issued certificate on the machine it is for, when it is
// newer than the one recorded.
func (p *pass) record(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	if !approval.IsApproved(csr) {
		return nil
	}
	node := p.target.names.of(csr)
	machine, candidates, _, err := p.machineFor(ctx, node)
	if err != nil || machine == nil || candidates > 1 {
		// A certificate for a name several machines answer to belongs to
		// none of them for sure; recording it could latch verification.
		return err
	}
	cur := machine.Status.KubeletServingCertificate
	block, _ := pem.Decode(csr.Status.Certificate)
	if block == nil {
		return fmt.Errorf("CSR %s: status.certificate is not PEM", csr.Name)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("CSR %s: parse issued certificate: %w", csr.Name, err)
	}
	if cur != nil && !cur.NotAfter.Time.Before(cert.NotAfter) {
		return nil
	}
	// What is recorded latches KubeletServingVerified, and with it the
	// kube-apiserver's --kubelet-certificate-authority: only a certificate
	// the cluster's signer issued for the request counts, whatever the API
	// server the request is in wrote in it (a tenant's, or one a
	// kubeconfigRef names by mistake, signed by another cluster's CA:
	// review 191 F2).
	roots, err := p.r.NodeReaders.KubernetesRoots(ctx, p.cluster)
	if err != nil {
		return fmt.Errorf("record certificate of CSR %s: %w", csr.Name, err)
	}
	// One refused is judged (and said) again only once what it is judged
	// from changes (its name, request and certificate, not its version,
	// which its server changes with any label: review 194) or the
	// cluster's CAs do: a tenant's server may hold thousands, and each
	// pass looks at them all (review 193 M4).
	key, judged := p.memoKey(csr), recordedFacts(csr)
	now := p.r.Clock.Now()
	if _, refused := p.r.unrecorded.Skip(key, judged, 0, roots.id, now); refused {
		// Said once; the condition says it again after anything forgot
		// it there (the watch started again, the machine made again:
		// review 196).
		if v, ok := p.r.unrecorded.Verdict(key); ok && ctx.Err() == nil {
			p.r.refusedRecords.set(p.key(), machine, v.Key)
		}
		return nil
	}
	if why := recordable(cert, csr, node, roots.pool, now); why != nil {
		note := p.notRecorded(ctx, machine, csr, why)
		p.r.unrecorded.Pending(key, approval.Verdict{ResourceVersion: judged, Revision: roots.id, Key: note}, struct{}{}, now,
			func(int) time.Duration { return 0 })
		return nil
	}
	before := machine.DeepCopy()
	machine.Status.KubeletServingCertificate = &ichorv1alpha1.KubeletServingCertificateStatus{
		Request:  csr.Name,
		IssuedAt: metav1.NewTime(cert.NotBefore),
		NotAfter: metav1.NewTime(cert.NotAfter),
	}
	// Written as a verdict is, under the replica's hold on the shard, and
	// on the machine as it was read: a replica that paused with an old
	// view of it neither writes for a cluster it no longer serves nor puts
	// an older certificate over a newer one recorded meanwhile (review 5,
	// F5).
	done, err := p.begin(time.Time{})
	if err != nil {
		return nil
	}
	defer done()
	if err := p.r.Client.Status().Patch(ctx, machine, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			// Changed meanwhile: looked at again once the cache shows
			// what changed.
			p.retryIn(time.Second)
			return nil
		}
		return fmt.Errorf("record certificate of CSR %s on machine %s: %w", csr.Name, machine.Name, err)
	}
	p.r.refusedRecords.clear(client.ObjectKeyFromObject(machine))
	log.FromContext(ctx).Info("recorded kubelet serving certificate", "machine", machine.Name, "csr", csr.Name, "not_after", cert.NotAfter)
	return nil
}

// notRecorded says why an issued certificate is not recorded on its
// machine: in the log, in a Warning Event on the machine, whose status lacks
// it, and in the cluster's condition while the machine waits (an Event
// expires within the hour: refusedRecords). The Event is related to the
// request: an Event recorder folds the Events of one object, reason and
// related object into a series that keeps the first note (for six minutes
// after the last), so each request has its own (review 193 M3). The
// request's name and the certificate's words are a tenant's server's:
// escaped, and cut to fit an Event's note. It returns the note.
func (p *pass) notRecorded(ctx context.Context, machine *ichorv1alpha1.TalosMachine, csr *certificatesv1.CertificateSigningRequest, why error) (note string) {
	name := servingcert.Clip(csr.Name, maxRecordedRequestName)
	where := ""
	if !p.target.local {
		where = " (in the API server the cluster's kubeconfigRef names)"
	}
	note = servingcert.Clip(termsafe.EscapeLine(fmt.Sprintf("the certificate issued for CSR %q%s is not recorded: %v", name, where, why)), maxNotRecordedNote)
	log.FromContext(ctx).Error(nil, "issued certificate not recorded", "csr", name, "machine", machine.Name, "why", note)
	if ctx.Err() == nil {
		// A turn cut short (the shard let go, which forgets the cluster's
		// refusals) leaves none behind.
		p.r.refusedRecords.set(p.key(), machine, note)
	}
	if p.r.Recorder != nil {
		p.r.Recorder.Eventf(machine, relatedRequest(csr), corev1.EventTypeWarning, ReasonCertificateNotRecorded, "Record", "%s", note)
	}
	return note
}

// maxNotRecordedNote leaves room, within an Event's note, for what Clip
// says it cut.
const maxNotRecordedNote = engine.MaxEventNote - 64

// event writes the Event of a decision.
// Its action tells it from another of the same reason (engine.EventAction).
func (p *pass) event(machine *ichorv1alpha1.TalosMachine, csr *certificatesv1.CertificateSigningRequest, eventType, reason, action, note string) {
	if p.r.Recorder == nil {
		return
	}
	// One Event a decision: on the request where `kubectl describe csr`
	// shows it, naming the machine as related, or on the machine when the
	// request is in another API server or there is none.
	switch {
	case csr != nil && p.target.local:
		var related runtime.Object
		if machine != nil {
			related = machine
		}
		p.r.Recorder.Eventf(csr, related, eventType, reason, action, "%s", note)
	case machine != nil:
		p.r.Recorder.Eventf(machine, nil, eventType, reason, action, "%s", note)
	}
}

// memoKey is a request as a cluster sees it: several clusters may see the
// same request, each with its own verdict.
type memoKey struct {
	cluster types.NamespacedName
	uid     types.UID
}

func (p *pass) memoKey(csr *certificatesv1.CertificateSigningRequest) memoKey {
	return memoKey{cluster: p.key(), uid: csr.UID}
}

// act names the act on the request for the cluster on the shard's hold: two
// clusters of one shard may judge one API server's request.
func (k memoKey) act() string {
	return k.cluster.String() + "/" + string(k.uid)
}

// ofCluster selects a cluster's requests, or with live, those of its
// requests that are no longer undecided.
func ofCluster(cluster types.NamespacedName, live map[types.UID]bool) func(memoKey, struct{}) bool {
	in := inCluster(cluster, live)
	return func(k memoKey, _ struct{}) bool { return in(k) }
}

// inCluster is ofCluster for a set without data (approval.Uncertain).
func inCluster(cluster types.NamespacedName, live map[types.UID]bool) func(memoKey) bool {
	return func(k memoKey) bool { return k.cluster == cluster && (live == nil || !live[k.uid]) }
}

const (
	minBackoff = 5 * time.Second
	maxBackoff = 5 * time.Minute
	// unreadableRecheck is how often a node that could not be read is read
	// again. Only a read that succeeds, or fails otherwise, is decided (and
	// logged) again.
	unreadableRecheck = 3 * time.Second
	// hangingRecheckMax is how long a node whose reads keep running into
	// the Talos timeout may go unread at most: from unreadableRecheck,
	// each timeout in a row doubles the wait (talosnode's hold).
	hangingRecheckMax = time.Minute

	// withheldRecheck is how soon a request withheld for a flood is decided
	// again, then with backoff up to withheldMaxRecheck: the flood may be
	// cleared by a person at any time, but while it lasts each recheck costs
	// a Talos read and a log entry for each withheld request (up to
	// max_undecided_per_requester a node).
	withheldRecheck    = 5 * time.Second
	withheldMaxRecheck = time.Minute

	codeMachineUnknown = "MachineUnknown"
	codeNodeUnreadable = "NodeUnreadable"
	codeTooManyPending = ichorv1alpha1.ReasonTooManyPendingRequests
)

// backoff is the wait before a pending verdict other than the two below is
// decided again (a failure's is its key's, with the same bounds: newQueue).
var backoff = approval.Backoff{Initial: minBackoff, Max: maxBackoff}

// withheldBackoff paces the rechecks of a withheld request.
var withheldBackoff = approval.Backoff{Initial: withheldRecheck, Max: withheldMaxRecheck}

// pendingWait is when to decide a pending request again: when no machine has
// the node name, only once the machines change; when the node could not be
// read, soon (it is read again, and decided only when that changes, see
// Memo.Hold); otherwise with backoff.
func pendingWait(key string) func(int) time.Duration {
	switch key {
	case codeMachineUnknown:
		return approval.OnChangeOnly
	case codeNodeUnreadable:
		return func(int) time.Duration { return unreadableRecheck }
	case codeTooManyPending:
		return withheldBackoff.After
	}
	return backoff.After
}
