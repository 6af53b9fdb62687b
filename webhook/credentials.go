// Package webhook is the validating admission webhook of TalosCredentialRequest
// (ADR 0124, KEP-4214).
//
// For each CREATE it gathers the facts: who asks (the admission request's user),
// who the request says asks (spec.requester, which must be that user), what the
// purpose requires (the requirements decision: which grant, which Event),
// whether the requester holds that grant (a SubjectAccessReview made as the
// requester, with their user, groups, uid and extra, on the cluster's
// subresource), whether the cluster exists and which API server it judges,
// what the public key is, and whether the request is a dry run. The admission
// decision is the policy's. When it allows and names an Event, the Event is
// written on the TalosCluster with the manager's own client, synchronously,
// before the request is admitted: a credential that cannot be recorded is not
// issued, so a failed write refuses the request. The Event is also the proof of
// admission the issuer requires (package internal/facts/credential): it is
// named after the request's UID and carries a MAC only the manager can make.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// Path is where the webhook server serves the validation of
// TalosCredentialRequest; the marker below and deploy/webhook name it too.
const Path = "/validate-ichor-dev-v1alpha1-taloscredentialrequest"

// Name is the webhook's name in the ValidatingWebhookConfiguration; the API
// server prefixes its refusals with it.
const Name = "vtaloscredentialrequest.ichor.dev"

// EventSource is the component an issuance Event names as its source.
const EventSource = "ichor-credentials-webhook"

// sideEffects=NoneOnDryRun: the webhook writes an Event, except for a dry run;
// with Some the API server would refuse every dry run without asking.
// failurePolicy=fail: no answer is no credential.

// +kubebuilder:webhook:path=/validate-ichor-dev-v1alpha1-taloscredentialrequest,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups=ichor.dev,resources=taloscredentialrequests,verbs=create,versions=v1alpha1,name=vtaloscredentialrequest.ichor.dev,admissionReviewVersions=v1,matchPolicy=Equivalent,timeoutSeconds=10

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=events,verbs=create
// +kubebuilder:rbac:groups=ichor.dev,resources=talosclusters,verbs=get
// +kubebuilder:rbac:groups=ichor.dev,resources=taloscredentialrequests,verbs=get

// Decider is what the webhook asks of the policy engine: *engine.Engine, or
// a test's (engine/enginetest).
type Decider interface {
	credential.Requirer
	Admission(context.Context, engine.CredentialAdmissionInput) (engine.CredentialAdmission, error)
}

// CredentialRequestValidator admits TalosCredentialRequests.
type CredentialRequestValidator struct {
	// Reader reads the TalosCluster; uncached (the manager's APIReader), so a
	// cluster created a moment ago is seen.
	Reader client.Reader
	// Client is the manager's own client: it makes the SubjectAccessReview
	// and writes the Event.
	Client client.Client
	Engine Decider
	// Keys holds the admission key the Event's MAC is made with.
	Keys *credential.Keys
	// LocalClusters are the clusters of the API server the manager runs
	// against, the only ones Kubernetes credentials are issued for.
	LocalClusters *cluster.Local
	// AcceptUnpinned admits under a bundle whose decision names no
	// credential, writing a record that pins none, as a webhook from before
	// the pin did (--require-admission-pins=false). Otherwise such a request
	// is refused here, since the issuer would refuse its record.
	AcceptUnpinned bool
	// ComponentNamespaces are the namespaces of Ichor's own
	// ServiceAccounts, the only requesters of the purposes not for people;
	// none, any (engine.AdmissionSettings).
	ComponentNamespaces []string
	// Instance names this replica in the Events it writes (reportingInstance);
	// the host name if empty.
	Instance string
	// Clock is the clock of the Events' timestamps; the real one if nil.
	Clock clock.PassiveClock
}

var _ admission.Handler = (*CredentialRequestValidator)(nil)

// SetupWithManager registers the webhook at Path on the manager's webhook
// server.
func (v *CredentialRequestValidator) SetupWithManager(mgr ctrl.Manager) error {
	if v.Reader == nil {
		v.Reader = mgr.GetAPIReader()
	}
	if v.Client == nil {
		v.Client = mgr.GetClient()
	}
	if v.Engine == nil {
		return errors.New("credential request webhook: no engine")
	}
	if v.Keys == nil {
		return errors.New("credential request webhook: no admission key")
	}
	mgr.GetWebhookServer().Register(Path, &crwebhook.Admission{Handler: v})
	return nil
}

// Handle decides one admission request.
func (v *CredentialRequestValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	// controller-runtime's admission logger already names the object, the
	// user and the request.
	logger := log.FromContext(ctx)

	var tcr ichorv1alpha1.TalosCredentialRequest
	if err := json.Unmarshal(req.Object.Raw, &tcr); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode TalosCredentialRequest: %w", err))
	}
	if why := oversizedUser(req.UserInfo); why != "" {
		return admission.Denied(why)
	}
	in, cluster, err := v.facts(ctx, req, &tcr)
	if err != nil {
		logger.Error(err, "gather the facts of a credential request")
		return admission.Errored(http.StatusInternalServerError, err)
	}
	// The server runs each request in a new goroutine: its stack is grown
	// for the admission decision while it is shallow, not doubled and
	// copied under OPA's evaluator. Only now, just before the decision: a
	// request that fails before holds no more stack than it did, and a
	// collection while the facts were gathered would have shrunk it again.
	engine.GrowStack()
	d, err := v.Engine.Admission(ctx, in)
	if err != nil {
		logger.Error(err, "decide a credential request")
		return admission.Errored(http.StatusInternalServerError, err)
	}
	logger = logger.WithValues("decision_id", d.DecisionID, "allowed", d.Allowed, "purpose", d.Purpose)
	if !d.Allowed {
		logger.Info("refused")
		return admission.Denied(fmt.Sprintf("%s (decision %s)", d.Reasons.String(), d.DecisionID))
	}
	if d.Event == nil && !in.DryRun {
		// The rule names the Event of every admitted request; without it
		// the admission could not be recorded, and a credential that
		// cannot be recorded is not issued (ADR 0124).
		logger.Error(nil, "refused: the decision admits without naming its issuance Event")
		return admission.Denied(fmt.Sprintf(
			"the request was allowed but is refused because the policy names no Event to record its issuance (a broken bundle?) (decision %s)", d.DecisionID))
	}
	if len(d.Credential) == 0 && !v.AcceptUnpinned {
		// The issuer would refuse the record, which would pin no
		// credential: refused here, a dry run alike, so that it says
		// what a create would meet.
		logger.Error(nil, "refused: the decision admits without naming the credential to pin")
		return admission.Denied(fmt.Sprintf(
			"the request was allowed but is refused because the policy's admission decision names no credential to pin, and the manager requires admission pins (--require-admission-pins): activate a bundle of policy epoch 6 or later (decision %s)", d.DecisionID))
	}
	// A dry run has no side effect (sideEffects=NoneOnDryRun), whatever a
	// bundle says.
	if d.Event != nil && !in.DryRun {
		if err := v.record(ctx, cluster, &tcr, req.Namespace, d); err != nil {
			logger.Error(err, "refused: the issuance Event could not be written")
			// A failure, not the rules' answer: 503, not a denial's 403,
			// so that a client does not take it for a refusal to hold
			// (the exec plugin holds those; review 259 F2).
			return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf(
				"the request was allowed but is refused because its issuance could not be recorded: the Event on TalosCluster %s/%s could not be written: %w (decision %s)",
				tcr.Namespace, tcr.Spec.ClusterName, err, d.DecisionID))
		}
	}
	logger.Info("admitted", "event", d.Event != nil)
	return admission.Allowed(fmt.Sprintf("%s (decision %s)", d.Reasons.String(), d.DecisionID))
}

// facts gathers the admission input. An error is a fact that could not be
// gathered (the API server did not answer), never a refusal: the caller
// fails the request closed and the API server reports the error.
func (v *CredentialRequestValidator) facts(ctx context.Context, req admission.Request, tcr *ichorv1alpha1.TalosCredentialRequest) (engine.CredentialAdmissionInput, *ichorv1alpha1.TalosCluster, error) {
	// The namespace of the admission request, not of the object: the API
	// server fills it in when the object omits it. The object carries the
	// generated name and the UID: the API server assigns both before
	// validating admission.
	namespace := req.Namespace
	user := credential.User(req.UserInfo)
	in := engine.CredentialAdmissionInput{
		Operation: string(req.Operation),
		DryRun:    req.DryRun != nil && *req.DryRun,
		User:      user,
		Requester: credential.Requester(tcr.Spec.Requester),
		Request:   credential.Request(tcr, namespace),
	}
	if len(v.ComponentNamespaces) > 0 {
		in.Settings = &engine.AdmissionSettings{ComponentNamespaces: v.ComponentNamespaces}
	}

	// The review and the cluster's read are two round trips to the API
	// server that need nothing of each other: made at once, the request
	// waits for the slower only (the admission's latency is the API
	// server's create's).
	var (
		wg                    sync.WaitGroup
		cl                    *ichorv1alpha1.TalosCluster
		reviewErr, clusterErr error
	)
	wg.Go(panicAsError(ctx, &reviewErr, func() {
		in.Authorization, reviewErr = credential.ReviewPurpose(ctx, v.Client, v.Engine, user, namespace, tcr.Spec.ClusterName, tcr.Spec.Purpose)
	}))
	wg.Go(panicAsError(ctx, &clusterErr, func() {
		in.Cluster, cl, clusterErr = credential.Cluster(ctx, v.Reader, namespace, tcr.Spec.ClusterName, v.LocalClusters)
	}))
	wg.Wait()
	if err := errors.Join(reviewErr, clusterErr); err != nil {
		return in, nil, err
	}
	return in, cl, nil
}

// panicAsError runs f, a part of a request's handling in a goroutine of its
// own, turning a panic in it into *err: controller-runtime recovers a
// handler's panic as a failed request, but a goroutine's would end the
// manager. The stack goes to the manager's log, not to the requester.
func panicAsError(ctx context.Context, err *error, f func()) func() {
	return func() {
		defer func() {
			if p := recover(); p != nil {
				*err = fmt.Errorf("panic: %v", p)
				log.FromContext(ctx).Error(*err, "a panic while gathering a credential request's facts", "stack", string(debug.Stack()))
			}
		}()
		f()
	}
}

// maxLifetimeSeconds bounds a lifetime the webhook records: what a
// time.Duration holds in whole seconds (the issuer signs for that long).
const maxLifetimeSeconds = float64(math.MaxInt64 / int64(time.Second))

// record writes the decision's Event on the cluster, as a core/v1 Event
// created directly: an asynchronous recorder would admit before knowing
// whether the record exists. The Event is the admission record the issuer
// verifies: named after the request's UID, with the MAC of the request and the
// decision.
func (v *CredentialRequestValidator) record(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, tcr *ichorv1alpha1.TalosCredentialRequest, namespace string, d engine.CredentialAdmission) error {
	if cluster == nil {
		// The policy only allows a request whose cluster exists.
		return errors.New("the cluster was not found")
	}
	if tcr.UID == "" {
		return errors.New("the request has no UID to record its admission under")
	}
	if err := v.notStoredYet(ctx, namespace, tcr); err != nil {
		return err
	}
	key, err := v.Keys.Key(ctx)
	if err != nil {
		return err
	}
	// The lifetime admitted, which the issuer holds the signing to: whole
	// seconds, as the rule admits them, checked in range before Go converts
	// it (the conversion of a float beyond int64 differs by platform).
	if d.LifetimeSeconds < 1 || d.LifetimeSeconds > maxLifetimeSeconds || d.LifetimeSeconds != math.Trunc(d.LifetimeSeconds) {
		return fmt.Errorf("the decision admits a lifetime of %v seconds, not a whole number from 1 to %d", d.LifetimeSeconds, int64(maxLifetimeSeconds))
	}
	lifetime := int64(d.LifetimeSeconds)
	mac, err := credential.MAC(key, tcr, namespace, cluster.UID, d.DecisionID)
	if err != nil {
		return err
	}
	lifetimeMAC, err := credential.LifetimeMAC(key, tcr, namespace, cluster.UID, d.DecisionID, lifetime)
	if err != nil {
		return err
	}
	annotations := map[string]string{
		credential.AnnotationDecisionID:  d.DecisionID,
		credential.AnnotationRequest:     tcr.Name,
		credential.AnnotationRequestUID:  string(tcr.UID),
		credential.AnnotationMAC:         mac,
		credential.AnnotationLifetime:    strconv.FormatInt(lifetime, 10),
		credential.AnnotationLifetimeMAC: lifetimeMAC,
	}
	if err := pinCredential(annotations, key, tcr, namespace, cluster.UID, d); err != nil {
		return err
	}
	now := metav1.NewTime(v.now())
	instance := v.Instance
	if instance == "" {
		instance, _ = os.Hostname()
	}
	event := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   cluster.Namespace,
			Name:        credential.RecordName(tcr.UID),
			Annotations: annotations,
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion:      ichorv1alpha1.GroupVersion.String(),
			Kind:            "TalosCluster",
			Namespace:       cluster.Namespace,
			Name:            cluster.Name,
			UID:             cluster.UID,
			ResourceVersion: cluster.ResourceVersion,
		},
		Type:   d.Event.Type,
		Reason: d.Event.Reason,
		// It names the requester, whose name the authenticator chose: escaped
		// as every note, on one line, so that a name holding a newline cannot
		// write a second record under it in `kubectl describe`.
		Message:             engine.Clip(termsafe.EscapeLine(d.Event.Message), "", engine.MaxEventNote),
		Source:              corev1.EventSource{Component: EventSource},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "ichor.dev/" + EventSource,
		ReportingInstance:   instance,
	}
	return v.Client.Create(ctx, event)
}

// The bounds of spec.requester in the CRD, which the admission policy holds
// to the creator's identity: a user past them cannot make a request, and a
// review naming one (which only a sender other than the API server could
// post, or an authenticator's extreme) is refused before it reaches the
// access check, the policy and the log.
const (
	maxUsername   = 1024
	maxUserGroups = 256
	maxUserExtra  = 64
)

// oversizedUser says why a review's user is past those bounds, or "".
func oversizedUser(u authenticationv1.UserInfo) string {
	switch {
	case utf8.RuneCountInString(u.Username) > maxUsername || utf8.RuneCountInString(u.UID) > maxUsername:
		// In characters, as the CRD's maxLength counts them.
		return fmt.Sprintf("the user's name or UID is longer than %d characters, which spec.requester cannot hold", maxUsername)
	case len(u.Groups) > maxUserGroups:
		return fmt.Sprintf("the user is in %d groups, more than the %d spec.requester holds", len(u.Groups), maxUserGroups)
	case len(u.Extra) > maxUserExtra:
		return fmt.Sprintf("the user has %d extra attributes, more than the %d spec.requester holds", len(u.Extra), maxUserExtra)
	}
	return ""
}

// notStoredYet refuses to record the admission of a request the API server
// already stores. It calls the webhook before it stores a request, so a
// review of a stored one (its UID) is not the API server's: the webhook's
// port answers whoever reaches it, and whoever can read a request stored
// while the webhook was not called (its configuration missing) could
// otherwise post a review of it and get the record the issuer trusts, in
// the name of anyone it writes as the user. Read past the cache: a request
// stored a moment ago must be seen. A request of that name with another UID
// is no concern here: the create under review will meet it as AlreadyExists.
func (v *CredentialRequestValidator) notStoredYet(ctx context.Context, namespace string, tcr *ichorv1alpha1.TalosCredentialRequest) error {
	var stored ichorv1alpha1.TalosCredentialRequest
	err := v.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: tcr.Name}, &stored)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read the request to check it is not stored yet: %w", err)
	case stored.UID == tcr.UID:
		return fmt.Errorf("the request %s/%s (UID %s) is stored already, and the API server reviews a request before it stores it: this review is not the API server's", namespace, tcr.Name, tcr.UID)
	default:
		return nil
	}
}

// pinCredential adds the credential the decision admits, and its MAC, to a
// record's annotations, so that the issuer signs what the Event names. A
// bundle from before the pin names none: the record then pins none, as an
// older webhook's (Handle lets such a decision through only where unpinned
// records are accepted).
func pinCredential(annotations map[string]string, key []byte, tcr *ichorv1alpha1.TalosCredentialRequest, namespace string, clusterUID types.UID, d engine.CredentialAdmission) error {
	if len(d.Credential) == 0 {
		return nil
	}
	// Compact, as the MAC and the issuer read it; only an object is a
	// credential.
	var compact bytes.Buffer
	if err := json.Compact(&compact, d.Credential); err != nil || compact.Len() == 0 || compact.Bytes()[0] != '{' {
		return fmt.Errorf("the decision names a credential that is not a JSON object: %.100q", d.Credential)
	}
	if compact.Len() > credential.MaxCredential {
		return fmt.Errorf("the decision names a credential of %d bytes, more than the %d a record holds", compact.Len(), credential.MaxCredential)
	}
	credentialMAC, err := credential.CredentialMAC(key, tcr, namespace, clusterUID, d.DecisionID, compact.String())
	if err != nil {
		return err
	}
	annotations[credential.AnnotationCredential] = compact.String()
	annotations[credential.AnnotationCredentialMAC] = credentialMAC
	return nil
}

func (v *CredentialRequestValidator) now() time.Time {
	if v.Clock != nil {
		return v.Clock.Now()
	}
	return time.Now()
}
