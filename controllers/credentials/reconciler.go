// Package credentials is the issuer of TalosCredentialRequests (ADR 0124,
// KEP-4214).
//
// For a request not answered yet it gathers the facts of the issuance
// decision right before it signs: the request, its recorded requester
// (spec.requester), the proof that the admission webhook admitted exactly this
// request (its admission record, verified with the manager's admission key),
// a SubjectAccessReview made as the requester for the purpose's grant, the
// cluster, the admin binding and the operator's settings. The decision is the
// policy's: a request created while the webhook was not serving, or whose
// requester lost the grant since admission, is refused, and so is one that
// breaks the current caps. It signs what the decision names for the
// requester's public key, and answers in the status: the certificate, the
// trust bundle, the expiry and the Ready condition (Issued, Refused with the
// policy's reasons, or Failed). A refusal carries no certificate and is also a
// Warning Event on the request. Talos credentials are signed by the cluster's
// OS CA with the Talos role as the only O=; Kubernetes credentials by the
// cluster's Kubernetes CA with the decision's groups as O= and its common name
// as CN. During a CA rotation the current CA signs and the trust bundle holds
// the current and the previous one.
//
// An admin kubeconfig names its person: its common name is the requester's
// admin identity and its only group is the name of that person's own
// ClusterRoleBinding to cluster-admin, both derived by the rule from
// spec.requester. Before it signs, the controller makes that binding (or the
// rule found it intact), labelled as Ichor's and owned by nothing, so that it
// outlives the request; deleting it revokes that person's admin kubeconfigs
// at once and for good (a later one gets a new binding and a new group). See
// adminbindings.go for what happens when one is deleted.
//
// A request is deleted Retention (two minutes) after it was answered.
package credentials

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	siderox509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/internal/talos/taloscert"
)

// DefaultRetention is how long an answered request is kept (ADR 0108): long
// enough for the requester to read the answer, short enough that requests do
// not pile up.
const DefaultRetention = 2 * time.Minute

// +kubebuilder:rbac:groups=ichor.dev,resources=taloscredentialrequests,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=ichor.dev,resources=taloscredentialrequests/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=events,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Decider is what the issuer asks of the policy engine: *engine.Engine, or a
// test's (engine/enginetest).
type Decider interface {
	credential.Requirer
	// RequirementsFor is Requirements for a requester: for kubeconfig-admin
	// it names their identity and their binding's role.
	RequirementsFor(ctx context.Context, purpose, username string) (engine.CredentialRequirements, error)
	Issuance(context.Context, engine.CredentialIssuanceInput) (engine.CredentialIssuance, error)
	RecordApplied(ctx context.Context, a engine.Applied) error
}

// Reconciler issues TalosCredentialRequests.
type Reconciler struct {
	// Client reads requests and clusters and writes status, the deletion and
	// the admins' bindings.
	Client client.Client
	// APIReader reads the secrets Secret, the admission record and a
	// reused admin binding directly, so the manager needs get on those
	// only, and a record written a moment ago is seen.
	APIReader client.Reader
	// Bindings reads the admins' bindings: the manager's cache, which holds
	// only those labelled as Ichor's and indexes them by identity
	// (IndexAdminBindings). Only kubeconfig-admin requests read it, and a
	// read costs the API server nothing.
	Bindings client.Reader
	Engine   Decider
	// Keys holds the admission key admission records are verified with.
	Keys *credential.Keys
	// AdminKubeconfigs is false when the operator revoked admin kubeconfigs
	// (--admin-kubeconfigs=false): the rule then issues none.
	AdminKubeconfigs bool
	// ComponentNamespaces are the namespaces of Ichor's own
	// ServiceAccounts, the only requesters of the purposes not for people;
	// none, any (engine.IssuerSettings).
	ComponentNamespaces []string
	// AcceptUnpinned accepts admission records without the lifetime and
	// credential pins, as a webhook from before them wrote
	// (--require-admission-pins=false, for a rolling upgrade from such a
	// release): such a record's lifetime and credential are not compared.
	AcceptUnpinned bool
	// SecretsClaims is what the cluster's secrets Secret must say of the
	// cluster before its CAs sign (clustersecrets.Claims): by default that
	// it names the cluster.
	SecretsClaims clustersecrets.Claims
	// Recorder writes a Warning Event on a refused request; nil writes none.
	Recorder events.EventRecorder
	// LocalClusters are the clusters of the API server the manager runs
	// against, the only ones Kubernetes credentials are issued for.
	LocalClusters *cluster.Local

	// Retention is how long an answered request is kept; DefaultRetention
	// if zero.
	Retention time.Duration
	// Clock is the clock; the real one if nil.
	Clock clock.PassiveClock
	// Nonce draws a new admin binding's nonce; crypto/rand if nil.
	Nonce func() (string, error)

	owed owedRecords
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Engine == nil {
		return errors.New("credentials controller: no engine")
	}
	if r.Keys == nil {
		return errors.New("credentials controller: no admission key")
	}
	if r.Bindings == nil {
		if err := IndexAdminBindings(context.Background(), mgr.GetFieldIndexer()); err != nil {
			return err
		}
		r.Bindings = mgr.GetCache()
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("credentials").
		For(&ichorv1alpha1.TalosCredentialRequest{}).
		Complete(r)
}

func (r *Reconciler) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return time.Now()
}

func (r *Reconciler) retention() time.Duration {
	if r.Retention > 0 {
		return r.Retention
	}
	return DefaultRetention
}

// Reconcile answers a new request, and deletes an answered one once its
// retention has passed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// controller-runtime's logger already names the request.
	var tcr ichorv1alpha1.TalosCredentialRequest
	if err := r.Client.Get(ctx, req.NamespacedName, &tcr); err != nil {
		if apierrors.IsNotFound(err) {
			return r.recordOwed(ctx, req.NamespacedName, nil), nil
		}
		return reconcile.Result{}, err
	}
	if meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady) == nil && r.owed.owes(req.NamespacedName, tcr.UID) {
		// An answer of unknown outcome may be stored, and one whose record
		// is owed is, where the cache does not show it yet: the API server
		// says, before the request is decided and signed again (an
		// issuance never stored would be listed as in effect).
		var live ichorv1alpha1.TalosCredentialRequest
		switch err := r.APIReader.Get(ctx, req.NamespacedName, &live); {
		case apierrors.IsNotFound(err):
			return r.recordOwed(ctx, req.NamespacedName, nil), nil
		case err != nil:
			return reconcile.Result{}, fmt.Errorf("read the request again after a write of unknown outcome: %w", err)
		}
		tcr = live
	}
	owed := r.recordOwed(ctx, req.NamespacedName, &tcr)
	if ready := meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady); ready != nil {
		result, err := r.expire(ctx, &tcr, ready)
		return sooner(result, owed), err
	}
	answer, decisionID, warn, err := r.answer(ctx, &tcr)
	if err != nil {
		return reconcile.Result{}, err
	}
	ready := meta.FindStatusCondition(answer.Status.Conditions, ichorv1alpha1.ConditionReady)
	applied := engine.Applied{
		DecisionID: decisionID, Object: "taloscredentialrequest/" + tcr.Namespace + "/" + tcr.Name, UID: string(tcr.UID),
		Action: ready.Reason, Outcome: engine.AppliedWritten,
	}
	if err := r.Client.Status().Update(ctx, answer); err != nil {
		switch r.storedAnyway(ctx, answer, decisionID, err) {
		case answerMaybeStored:
			// The retry reads the request: if it finds this answer
			// stored, this record is owed (review 226 F3).
			applied.Outcome = engine.AppliedObserved
			r.owed.add(req.NamespacedName, owedRecord{uid: tcr.UID, record: applied, uncertain: true, warn: warn})
			return reconcile.Result{}, fmt.Errorf("write the answer: %w", err)
		case answerNotStored:
			return reconcile.Result{}, fmt.Errorf("write the answer: %w", err)
		}
		// Seen stored, not said to be (review 201 F6).
		applied.Outcome = engine.AppliedObserved
	}
	if warn != nil && r.Recorder != nil {
		// Once the answer is stored: a refusal (or a binding refused)
		// whose write failed is decided again, and may then be issued
		// (review of 2026-12-06: an issued request carried the Warning of
		// a refusal never stored; review 161: so did one whose binding
		// was refused).
		r.Recorder.Eventf(answer, nil, corev1.EventTypeWarning, warn.reason, warn.action, "%s", warn.note)
	}
	if err := r.Engine.RecordApplied(ctx, applied); err != nil {
		log.FromContext(ctx).Error(err, "record the applied decision; tried again", "decision_id", decisionID, "retry_in", recordRetry)
		r.owed.add(req.NamespacedName, owedRecord{uid: tcr.UID, record: applied})
		return reconcile.Result{RequeueAfter: recordRetry}, nil
	}
	return sooner(reconcile.Result{RequeueAfter: r.retention()}, owed), nil
}

// sooner is result, or owed when it asks for a look sooner.
func sooner(result, owed reconcile.Result) reconcile.Result {
	if owed.RequeueAfter > 0 && (result.RequeueAfter == 0 || owed.RequeueAfter < result.RequeueAfter) {
		return owed
	}
	return result
}

// answerWrite is what a failed write of an answer did, as far as the
// request read back says.
type answerWrite int

const (
	answerNotStored answerWrite = iota
	answerStored
	// answerMaybeStored: it may yet be, or be stored already; the request
	// could not be read back, or showed no answer yet.
	answerMaybeStored
)

// storedAnyway says what became of an answer whose write failed with err:
// stored all the same (a timeout or a 5xx the API server answered after it
// stored the write, which the request, read again, says by the decision its
// condition names; retried instead, the request was decided and signed
// again, and the credential delivered had no applied record nor the
// refusal its Warning: review 197A F2); not stored (a refusal: a conflict,
// an invalid or forbidden write, the request gone, or another answer
// stored); or maybe stored, when the request cannot be read back or shows
// no answer yet (review 226 F3).
func (r *Reconciler) storedAnyway(ctx context.Context, answer *ichorv1alpha1.TalosCredentialRequest, decisionID string, err error) answerWrite {
	if decisionID == "" || apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsBadRequest(err) {
		return answerNotStored
	}
	var live ichorv1alpha1.TalosCredentialRequest
	switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(answer), &live); {
	case apierrors.IsNotFound(err) || (err == nil && live.UID != answer.UID):
		return answerNotStored
	case err != nil:
		return answerMaybeStored
	}
	ready := meta.FindStatusCondition(live.Status.Conditions, ichorv1alpha1.ConditionReady)
	switch {
	case ready == nil:
		// A write answered with a timeout may still commit after this
		// read: the retry's own write then conflicts.
		return answerMaybeStored
	case !names(ready, decisionID):
		return answerNotStored
	}
	log.FromContext(ctx).Info("the answer's write failed, and the API server stored it all the same", "decision_id", decisionID, "error", err.Error())
	return answerStored
}

// expire deletes a request whose answer is older than the retention.
func (r *Reconciler) expire(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, ready *metav1.Condition) (reconcile.Result, error) {
	left := ready.LastTransitionTime.Add(r.retention()).Sub(r.now())
	if left > 0 {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	// Preconditioned on the UID, so a new request of the same name is not
	// deleted in its place.
	err := r.Client.Delete(ctx, tcr, client.Preconditions{UID: &tcr.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("delete the answered request: %w", err)
	}
	log.FromContext(ctx).V(1).Info("deleted the answered request", "answered", ready.LastTransitionTime)
	return reconcile.Result{}, nil
}

// answer returns the request with its status answered: issued, refused or
// failed, and for a refusal or a binding refused the Warning Event to write
// once the answer is stored. An error means the answer could not be found yet (the
// API server did not answer, the engine failed) and the request is retried.
func (r *Reconciler) answer(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest) (answer *ichorv1alpha1.TalosCredentialRequest, decisionID string, warn *warning, err error) {
	logger := log.FromContext(ctx)
	out := tcr.DeepCopy()
	out.Status.ObservedGeneration = tcr.Generation

	g, err := r.facts(ctx, tcr)
	if err != nil {
		return nil, "", nil, err
	}
	d, err := r.Engine.Issuance(ctx, g.in)
	if err != nil {
		return nil, "", nil, fmt.Errorf("decide issuance: %w", err)
	}
	logger = logger.WithValues("decision_id", d.DecisionID, "purpose", d.Purpose, "allowed", d.Allowed, "codes", d.Reasons.Codes())
	if !d.Allowed {
		logger.Info("refused")
		// The reasons quote the request; clipped and escaped as a CSR's are.
		tail := fmt.Sprintf(" (decision %s)", d.DecisionID)
		setReady(out, r.now(), metav1.ConditionFalse, ichorv1alpha1.ReasonRefused, engine.Clip(d.Reasons.String(), tail, engine.MaxConditionMessage))
		return out, d.DecisionID, &warning{reason: ichorv1alpha1.ReasonRefused, action: "Issue", note: engine.Clip(d.Reasons.String(), tail, engine.MaxEventNote)}, nil
	}

	if err := checkAdmitted(g.in.Admission, d); err != nil {
		return r.answered(ctx, out, d, issued{}, err)
	}
	_, publicKey := engine.ParsePublicKey(tcr.Spec.PublicKey)
	// The person's own binding first: a certificate signed before its binding
	// exists would be powerless, and one whose binding cannot be made is not
	// signed.
	binding, err := r.bind(ctx, tcr, d, g)
	var signed issued
	if err == nil {
		signed, err = r.issue(g, d, publicKey)
	}
	if err == nil && binding != nil {
		r.recordExpiry(ctx, binding, signed.notAfter)
	}
	return r.answered(ctx, out, d, signed, err)
}

// answered writes what signing (or making the binding) came to, and the
// Warning a failure asks to write once that is stored.
func (r *Reconciler) answered(ctx context.Context, out *ichorv1alpha1.TalosCredentialRequest, d engine.CredentialIssuance, issued issued, err error) (*ichorv1alpha1.TalosCredentialRequest, string, *warning, error) {
	logger := log.FromContext(ctx).WithValues("decision_id", d.DecisionID, "purpose", d.Purpose)
	var failed *failure
	switch {
	case errors.As(err, &failed):
		logger.Error(err, "failed")
		// The error may quote what a Secret holds (a bundle's YAML keys):
		// clipped and escaped as a refusal's reasons are.
		setReady(out, r.now(), metav1.ConditionFalse, ichorv1alpha1.ReasonFailed, engine.Clip(err.Error(), fmt.Sprintf(" (decision %s)", d.DecisionID), engine.MaxConditionMessage))
		return out, d.DecisionID, failed.warn, nil
	case err != nil:
		return nil, "", nil, err
	}
	out.Status.Certificate = string(issued.certificate)
	out.Status.TrustBundle = string(issued.trustBundle)
	out.Status.ExpiresAt = &metav1.Time{Time: issued.notAfter}
	// Clipped and escaped as a refusal's reasons are: the bundle writes them,
	// and a message past a condition's bound makes the status unwritable,
	// and each retry sign again (review 197A F3).
	setReady(out, r.now(), metav1.ConditionTrue, ichorv1alpha1.ReasonIssued, engine.Clip(d.Reasons.String(),
		fmt.Sprintf("; expires at %s (decision %s)", issued.notAfter.UTC().Format(time.RFC3339), d.DecisionID), engine.MaxConditionMessage))
	logger.Info("issued", "expires_at", issued.notAfter)
	return out, d.DecisionID, nil, nil
}

// gathered is what the issuer gathered for one decision: its input, the
// cluster, and the admin binding the purpose's requirements named (nil for
// every purpose but kubeconfig-admin), which the decision's binding is
// checked against.
type gathered struct {
	in           engine.CredentialIssuanceInput
	cluster      *ichorv1alpha1.TalosCluster
	adminBinding *engine.AdminBindingRequirement
	// bundles are the CAs of the cluster's secrets Secret, read once for
	// the decision's facts and for signing; unusable says why there are
	// none (the Secret unreadable, not naming the cluster, or no bundle).
	bundles  *clustersecrets.Bundles
	unusable error
}

// facts gathers the issuance input right before signing. An error is a fact
// that could not be gathered (the API server did not answer): the request is
// retried, never answered on a guess. Admin bindings are gathered only for
// a purpose whose requirements name one, from the cache.
func (r *Reconciler) facts(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest) (gathered, error) {
	in := engine.CredentialIssuanceInput{
		Request:   credential.Request(tcr, tcr.Namespace),
		Requester: credential.Requester(tcr.Spec.Requester),
		Settings:  engine.IssuerSettings{AdminKubeconfigs: r.AdminKubeconfigs, ComponentNamespaces: r.ComponentNamespaces},
	}
	var err error
	g := gathered{}
	// Read as the webhook read it, uncached: a cache that has not yet seen
	// a cluster made a moment ago (or made again under its name, with a new
	// UID) would have the request refused for good (ClusterNotFound,
	// NotAdmitted) when it is only late.
	if in.Cluster, g.cluster, err = credential.Cluster(ctx, r.APIReader, tcr.Namespace, tcr.Spec.ClusterName, r.LocalClusters); err != nil {
		return g, err
	}
	var clusterUID types.UID
	if g.cluster != nil {
		clusterUID = g.cluster.UID
		if in.Secrets, err = r.secrets(ctx, &g); err != nil {
			return g, err
		}
	}
	if in.Admission, err = r.admission(ctx, tcr, clusterUID); err != nil {
		return g, err
	}
	if in.Requester != nil {
		reqs, err := r.Engine.RequirementsFor(ctx, string(tcr.Spec.Purpose), in.Requester.Username)
		switch {
		case errors.Is(err, engine.ErrNoDecision):
			// An unknown purpose: nothing to review, and the rule refuses it.
		case err != nil:
			return g, err
		default:
			if in.Authorization, err = credential.Review(ctx, r.Client, *in.Requester, tcr.Namespace, tcr.Spec.ClusterName, reqs.Authorization); err != nil {
				return g, err
			}
			if g.adminBinding = reqs.AdminBinding; g.adminBinding != nil {
				if in.AdminIdentity, err = r.adminIdentity(ctx, *g.adminBinding); err != nil {
					return g, err
				}
			}
		}
	}
	g.in = in
	return g, nil
}

// secrets reads the cluster's secrets Secret and its bundle, and says
// whether it names the cluster and holds the CAs: a Secret that does not
// is refused by the rule (SecretsNotClaimed, SecretsUnusable), not found
// out after the decision, and no admin binding is made for a request that
// cannot be signed. A Secret that cannot be read is a fact too when retrying
// will not change it (NotFound, Forbidden); any other error is retried.
func (r *Reconciler) secrets(ctx context.Context, g *gathered) (*engine.SecretsFacts, error) {
	facts := &engine.SecretsFacts{Secret: g.cluster.Spec.SecretsRef.Name}
	secret, err := clustersecrets.Get(ctx, r.APIReader, g.cluster)
	switch {
	case err == nil:
		facts.Read = true
	case errors.As(permanent(err), new(*failure)):
		g.unusable = err
		facts.Error = servingcert.Clip(err.Error(), engine.MaxSecretsError)
		return facts, nil
	default:
		return nil, err
	}
	if err := clustersecrets.CheckClaim(secret, g.cluster.Name, r.SecretsClaims); err != nil {
		g.unusable = err
		facts.ClaimError = err.Error()
		return facts, nil
	}
	facts.Claimed = true
	bundles, err := clustersecrets.FromSecret(secret, g.cluster, r.SecretsClaims)
	if err != nil {
		g.unusable = err
		facts.Error = servingcert.Clip(err.Error(), engine.MaxSecretsError)
		return facts, nil
	}
	g.bundles, facts.Usable = &bundles, true
	return facts, nil
}

// admission looks for the webhook's record of admitting this request and
// verifies it. A missing or unverifiable record is a fact, not an error.
func (r *Reconciler) admission(ctx context.Context, tcr *ichorv1alpha1.TalosCredentialRequest, clusterUID types.UID) (engine.AdmissionProof, error) {
	var record corev1.Event
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: tcr.Namespace, Name: credential.RecordName(tcr.UID)}, &record)
	switch {
	case apierrors.IsNotFound(err):
		return engine.AdmissionProof{}, nil
	case err != nil:
		return engine.AdmissionProof{}, fmt.Errorf("get the admission record of %s/%s: %w", tcr.Namespace, tcr.Name, err)
	}
	key, err := r.Keys.Key(ctx)
	if err != nil {
		return engine.AdmissionProof{}, err
	}
	unpinned := credential.Unpinned(r.AcceptUnpinned)
	ok, admitted, why := credential.Verify(key, tcr, clusterUID, &record, unpinned)
	if !ok {
		// The key may have been replaced since it was read: read it again
		// once before calling the record unverifiable.
		if key, err = r.Keys.Reload(ctx); err != nil {
			return engine.AdmissionProof{}, err
		}
		ok, admitted, why = credential.Verify(key, tcr, clusterUID, &record, unpinned)
	}
	return engine.AdmissionProof{
		Recorded: true, Verified: ok, DecisionID: admitted.DecisionID,
		LifetimeSeconds: admitted.LifetimeSeconds, Credential: admitted.Credential, Error: why,
	}, nil
}

// checkAdmitted holds an allowed decision to the admission the issuer
// proved, whatever the bundle says, before anything is made or signed: the
// rule refuses a request without a verified admission record and a
// lifetime other than the one admitted, and a bundle without those rules
// (or with a fault in them) must not sign what the webhook never admitted
// (the hostile review of 2026-12-05; Go backstops the bundle for admin
// bindings and secrets the same way), nor sign another credential than the
// one admitted (checkCredentialAdmitted).
func checkAdmitted(a engine.AdmissionProof, d engine.CredentialIssuance) error {
	if !a.Recorded || !a.Verified {
		return failf("the decision allows a request without a verified admission record (is the policy bundle's issuance rule missing its admission check?)")
	}
	if a.LifetimeSeconds > 0 && d.LifetimeSeconds > float64(a.LifetimeSeconds) {
		return failf("the decision allows a lifetime of %v seconds, longer than the %d admitted", d.LifetimeSeconds, a.LifetimeSeconds)
	}
	return checkCredentialAdmitted(a.Credential, d)
}

// admittedCredential is what of the credential the verified admission record
// pins the certificate carries (the rule's _credential; its label, the
// "credential" text, aside).
type admittedCredential struct {
	Kind       string   `json:"kind"`
	TalosRole  string   `json:"talos_role"`
	CommonName string   `json:"common_name"`
	Groups     []string `json:"groups"`
	BoundTo    string   `json:"bound_to"`
}

// checkCredentialAdmitted is the backstop of the rule's CredentialNotAdmitted,
// as checkAdmitted is of its lifetime: a bundle that allows signing another
// credential than the one admitted (os:admin for a reader's request, a group
// more, another person's name, a binding where none was admitted) is
// refused, whatever the bundle. A record
// of a webhook that pinned no credential is not compared (the rule says so
// too).
func checkCredentialAdmitted(pinned json.RawMessage, d engine.CredentialIssuance) error {
	if len(pinned) == 0 || d.Certificate == nil {
		// Without a certificate nothing is signed (issue refuses it).
		return nil
	}
	var a admittedCredential
	if err := json.Unmarshal(pinned, &a); err != nil {
		return failf("the admission record's credential does not read: %v", err)
	}
	c := d.Certificate
	groups := sets.New(a.Groups...)
	if d.AdminBinding != nil {
		// The person's own group is the binding's, drawn at issuance.
		groups.Insert(d.AdminBinding.Group)
	}
	switch {
	case c.Kind != a.Kind:
		return failf("the decision allows a %s certificate, not the %s credential admitted", c.Kind, a.Kind)
	case c.TalosRole != a.TalosRole:
		return failf("the decision allows the Talos role %q, not %q as admitted", c.TalosRole, a.TalosRole)
	case c.CommonName != a.CommonName:
		return failf("the decision allows the common name %q, not %q as admitted", c.CommonName, a.CommonName)
	case !sets.New(c.Groups...).Equal(groups):
		return failf("the decision allows the groups %q, not %q as admitted", c.Groups, sets.List(groups))
	case (d.AdminBinding != nil) != (a.BoundTo != ""):
		// Which role a binding names is the binding's shape check's
		// (AdminBindingShape: Ichor's role, or nothing is bound); that
		// there is one at all is the admission's.
		return failf("the decision binds %s, and the credential admitted %s", boundOrNot(d.AdminBinding != nil), boundOrNot(a.BoundTo != ""))
	}
	return nil
}

func boundOrNot(bound bool) string {
	if bound {
		return "the person's group to a role"
	}
	return "no role"
}

// failure is an error that answers the request (Failed) rather than being
// retried: what the decision allowed cannot be carried out (a bundle that
// allows what the rule would refuse: no cluster, secrets that cannot sign,
// something this controller does not sign; a binding that cannot be made),
// or a Secret read that retrying will not change, which the rule refuses
// (SecretsUnusable) before it could come to this. warn is the Warning to
// write once that answer is stored (nil for none).
type failure struct {
	err  error
	warn *warning
}

// warning is a Warning Event on the request, written once its answer is
// stored: an answer whose write failed is decided again, and may come out
// otherwise.
type warning struct{ reason, action, note string }

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func failf(format string, args ...any) error {
	return &failure{err: fmt.Errorf(format, args...)}
}

// permanent is a failure when retrying will not change the answer: the API
// server said not found, forbidden or invalid, or the secrets bundle is
// unusable. Anything else (a timeout, a refused connection, a conflict) is
// the error to retry.
func permanent(err error) error {
	if err == nil {
		return nil
	}
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		errors.Is(err, clustersecrets.ErrInvalid) {
		return &failure{err: err}
	}
	return err
}

type issued struct {
	certificate []byte
	trustBundle []byte
	notAfter    time.Time
}

// issue signs what the decision names with the CAs read for the decision
// (gathered.bundles), which come only from a Secret that names the cluster.
func (r *Reconciler) issue(g gathered, d engine.CredentialIssuance, publicKey crypto.PublicKey) (issued, error) {
	cluster := g.cluster
	if cluster == nil {
		// The rule refuses a request whose cluster does not exist; a bundle
		// that allows one names nothing this controller could sign with.
		return issued{}, failf("the decision allows a request whose TalosCluster does not exist")
	}
	if d.Certificate == nil || d.LifetimeSeconds <= 0 {
		// The engine refuses such a decision of a broken bundle; signing
		// anything would be guessing.
		return issued{}, failf("the decision allows but names no certificate or lifetime")
	}
	// A backstop: the rule refuses a Secret that does not name the cluster
	// or holds no usable bundle, and a bundle that allowed one signs
	// nothing with it (bundles are read only from a Secret that names the
	// cluster).
	if g.bundles == nil {
		return issued{}, failf("the decision allows a request whose cluster's secrets are unusable: %w", g.unusable)
	}
	bundles := *g.bundles
	// Whole seconds (the rule refuses anything else); NotBefore is now,
	// truncated, so NotAfter is exactly the lifetime later.
	lifetime := time.Duration(d.LifetimeSeconds) * time.Second
	notBefore := r.now().Truncate(time.Second)
	cert := d.Certificate

	switch cert.Kind {
	case engine.CertificateKindTalos:
		ca, err := taloscert.ParseCA(bundles.Current.Certs.OS.Crt, bundles.Current.Certs.OS.Key)
		if err != nil {
			return issued{}, failf("cluster %s/%s: %w", cluster.Namespace, cluster.Name, err)
		}
		pemCert, err := ca.Issue(taloscert.ClientCertificate{
			Role:       cert.TalosRole,
			PublicKey:  publicKey,
			CommonName: "ichor-credential:" + d.Purpose,
			NotBefore:  notBefore,
			Lifetime:   lifetime,
		})
		if err != nil {
			return issued{}, failf("sign the %s certificate: %w", cert.TalosRole, err)
		}
		return issued{certificate: pemCert, trustBundle: trust(bundles.Current.Certs.OS, osCA(bundles.Previous)), notAfter: notBefore.Add(lifetime)}, nil

	case engine.CertificateKindKubernetes:
		ca, err := taloscert.ParseCA(bundles.Current.Certs.K8s.Crt, bundles.Current.Certs.K8s.Key)
		if err != nil {
			return issued{}, failf("the Kubernetes CA: %w", err)
		}
		pemCert, err := ca.IssueKubernetes(taloscert.KubernetesClientCertificate{
			CommonName: cert.CommonName, Groups: cert.Groups, PublicKey: publicKey, NotBefore: notBefore, Lifetime: lifetime,
		})
		if err != nil {
			return issued{}, failf("sign the Kubernetes client certificate: %w", err)
		}
		return issued{certificate: pemCert, trustBundle: trust(bundles.Current.Certs.K8s, k8sCA(bundles.Previous)), notAfter: notBefore.Add(lifetime)}, nil

	default:
		return issued{}, failf("the decision names a certificate of kind %q, which this controller does not sign", cert.Kind)
	}
}

// trust is the current CA certificate, then the previous one when a
// rotation is in progress and it differs.
func trust(current, previous *siderox509.PEMEncodedCertificateAndKey) []byte {
	out := slices.Clone(current.Crt)
	if previous != nil && len(previous.Crt) > 0 && string(previous.Crt) != string(current.Crt) {
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		out = append(out, previous.Crt...)
	}
	return out
}

func osCA(previous *secrets.Bundle) *siderox509.PEMEncodedCertificateAndKey {
	if previous == nil || previous.Certs == nil {
		return nil
	}
	return previous.Certs.OS
}

func k8sCA(previous *secrets.Bundle) *siderox509.PEMEncodedCertificateAndKey {
	if previous == nil || previous.Certs == nil {
		return nil
	}
	return previous.Certs.K8s
}

// setReady answers the request. Only an issued answer carries a
// certificate.
func setReady(tcr *ichorv1alpha1.TalosCredentialRequest, now time.Time, status metav1.ConditionStatus, reason, message string) {
	if reason != ichorv1alpha1.ReasonIssued {
		tcr.Status.Certificate, tcr.Status.TrustBundle, tcr.Status.ExpiresAt = "", "", nil
	}
	meta.SetStatusCondition(&tcr.Status.Conditions, metav1.Condition{
		Type:               ichorv1alpha1.ConditionReady,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: tcr.Generation,
		// The retention is counted from here, on the reconciler's clock.
		LastTransitionTime: metav1.NewTime(now),
	})
}
