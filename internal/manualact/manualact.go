// Package manualact records, in the decision log and as an Event, what a
// person did with their own rights where Ichor's rules do not decide: a
// certificate signing request of a signer Ichor decides approved or denied
// by hand, and an admin's own ClusterRoleBinding deleted (issues 22 and 23).
//
// The API server tells only an admission webhook who makes a write, and a
// webhook is called before the write is stored, which may then be refused.
// So a request's decision is recorded from what was stored: the manager's
// webhook (package webhook, ActRecorder) keeps each write of a verdict it
// admits as an attempt, with its user (attempts.go), and the manager's watch
// records the verdict it sees stored, with the attempts kept from the
// version the stored write replaced; the rule names the person only if one
// person attempted that verdict from that version. When the webhook was not
// called (its failurePolicy is Ignore: a person's decision or a revocation
// is never blocked by the manager being away), no attempt is kept and the
// record says the actor is unknown. An admin binding's deletion is kept the
// same way: the webhook keeps each DELETE it admits as an attempt, with its
// user and its time, and the revocation is recorded once the binding is
// gone (by the leader's watch, or by the webhook's replica when no watch
// did), naming the one person who asked within RevocationWindow of it.
//
// One act is recorded once. A request's decision is marked recorded in a
// ConfigMap of the manager's namespace (marks.go), which lasts as long as
// the request: an Event expires after the API server's --event-ttl (an
// hour) while the request lives on, and a restart would then record the
// decision again (review 4, R3). The mark's key is an HMAC, made with the
// manager's admission key, of the request's UID and the verdict; it carries
// a MAC over the UID, the verdict and the record's decision id. The watch
// records through a rate-limited queue (watch.go), which tries a record
// again until it is written and marked, and never evaluates the rule twice
// for one act. A revocation's mark is the record's Event, named after the
// binding's UID, with the same MAC: the binding is gone when the act is
// seen, so nothing there is listed again at a restart. Either mark, forged
// (anyone who may create Events in namespace default can write an Event by
// that name), does not verify, so it cannot silence a record; at worst the
// act is recorded twice.
//
// What is recorded is the rule ichor/manual/record's (Go gathers, Rego
// decides); this package gathers the facts, bounded, and writes the Events.
package manualact

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ichor-dev/ichor-policy/engine"
)

// EventSource is the component the records' Events name.
const EventSource = "ichor-recorder"

// EventNamespace is where the Events of the cluster-scoped objects recorded
// (CSRs, ClusterRoleBindings) are written, as the API server's own event
// recorder does for such objects.
const EventNamespace = metav1.NamespaceDefault

// The annotations of a record's Event.
const (
	AnnotationDecisionID = "ichor.dev/decision-id"
	AnnotationObjectUID  = "ichor.dev/object-uid"
	AnnotationAct        = "ichor.dev/act"
	AnnotationMAC        = "ichor.dev/record-mac"
)

// MaxConditions bounds the conditions of a CSR gathered as facts, after and
// before the write: the API server does not bound how many a request holds.
const MaxConditions = 16

// MaxGroups bounds the groups of the user gathered (the mask cuts the logged
// list further).
const MaxGroups = 256

// The records' Events, in namespace default: get to find an act's record,
// create to write it, update to bring a person's kept DELETE of a binding up
// to their later one (the manager's events.k8s.io patch, which the event
// recorders need, reaches the same Events already). The watches read the
// requests and the admins' bindings the approvers and the issuer read
// already. The marks of requests' decisions are in one ConfigMap, by name
// (marks.go).
// +kubebuilder:rbac:groups="",resources=events,verbs=get;create;update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterrolebindings,verbs=get;list;watch

// EventName is the name of the record's Event of the object with this UID.
func EventName(uid types.UID) string {
	return "ichor-act-" + string(uid)
}

// Decider writes the record: *engine.Engine.
type Decider interface {
	RecordManual(ctx context.Context, in engine.ManualActInput) (engine.ManualRecord, error)
}

// KeySource is the admission key the records' MACs are made with
// (*credential.Keys).
type KeySource interface {
	Key(ctx context.Context) ([]byte, error)
}

// Recorder records acts: it looks for the act's verified Event, asks the
// rule for the record (which the engine logs), and writes the Event.
type Recorder struct {
	// Reader finds an act's Event (uncached: the manager's APIReader).
	Reader client.Reader
	// Client writes the Event.
	Client client.Client
	Engine Decider
	// Keys makes and checks the Events' MACs; nil records every act it is
	// given, without looking for an earlier record or reading attempts (no
	// webhook runs: every actor is unknown).
	Keys KeySource
	// Namespace is the manager's namespace, where the marks of requests'
	// decisions are kept (marks.go); empty: a request's decision is marked
	// by its Event only, which expires (--event-ttl).
	Namespace string
	// Instance names this replica in the Events (reportingInstance); the
	// host name if empty.
	Instance string
	Clock    clock.PassiveClock
}

// evaluate asks the rule for the record, which the engine logs; nil when
// the rule records nothing, and the facts hold no verdict.
func (r *Recorder) evaluate(ctx context.Context, in *engine.ManualActInput) (*engine.ManualRecord, error) {
	rec, err := r.Engine.RecordManual(ctx, *in)
	if errors.Is(err, engine.ErrNoDecision) {
		if decides(*in) {
			// The facts hold a verdict the write made, yet the rule
			// records none: say so rather than lose a person's act.
			return nil, fmt.Errorf("%w: %w", ErrDecisionUnrecorded, err)
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// ErrDecisionUnrecorded is a request's verdict, written by the act, that
// the rule did not record (a bundle whose rule misses it): the caller logs
// it as an error, since a person's decision then has no record of its own.
var ErrDecisionUnrecorded = errors.New("the act decided a certificate signing request, but the rule recorded no decision")

// decides reports whether the facts of a CSR's act hold an Approved or
// Denied condition, True, whose type the request did not hold before.
func decides(in engine.ManualActInput) bool {
	return in.Act == engine.ActCSRDecision && AddedVerdict(in.CertificateRequest) != ""
}

// recorded is the decision id of the act's verified record Event on the
// object with uid, or "" when there is none.
func (r *Recorder) recorded(ctx context.Context, key []byte, uid types.UID, act string) (string, error) {
	var ev corev1.Event
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: EventNamespace, Name: EventName(uid)}, &ev)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look for the act's record: %w", err)
	}
	id := ev.Annotations[AnnotationDecisionID]
	if !hmac.Equal([]byte(ev.Annotations[AnnotationMAC]), []byte(mac(key, uid, act, id))) || id == "" {
		log.FromContext(ctx).Info("an Event by the record's name does not verify as this act's record: the act is recorded", "event", ev.Name, "act", act)
		return "", nil
	}
	return id, nil
}

// mac binds an Event to the object's UID, the act (the verdict, or the
// revocation: a record of one verdict never stands for another) and the
// record's decision id.
func mac(key []byte, uid types.UID, act, decisionID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ichor-act\x00" + string(uid) + "\x00" + act + "\x00" + decisionID))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// event writes the record's Event, named after the object's UID; if that
// name is taken (by an Event that did not verify), under a generated name.
func (r *Recorder) event(ctx context.Context, key []byte, regarding corev1.ObjectReference, act string, rec engine.ManualRecord) error {
	now := metav1.NewTime(r.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   EventNamespace,
			Name:        EventName(regarding.UID),
			Annotations: map[string]string{AnnotationDecisionID: rec.DecisionID, AnnotationObjectUID: string(regarding.UID), AnnotationAct: act},
		},
		InvolvedObject:      regarding,
		Type:                corev1.EventTypeNormal,
		Reason:              rec.Reasons[0].Code,
		Message:             rec.EventNote(),
		Source:              corev1.EventSource{Component: EventSource},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		Action:              rec.Action,
		ReportingController: "ichor.dev/" + EventSource,
		ReportingInstance:   r.instance(),
	}
	if key != nil {
		ev.Annotations[AnnotationMAC] = mac(key, regarding.UID, act, rec.DecisionID)
	}
	err := r.Client.Create(ctx, ev)
	if apierrors.IsAlreadyExists(err) {
		if mine, lookErr := r.wroteBefore(ctx, ev); lookErr != nil || mine {
			return lookErr
		}
		ev.Name, ev.GenerateName, ev.ResourceVersion = "", EventName(regarding.UID)+"-", ""
		err = r.Client.Create(ctx, ev)
	}
	return err
}

// wroteBefore reports whether the Event under ev's name is this record's,
// stored by an earlier try whose answer was lost (a timeout): it names the
// record's decision id, a fresh one no one else knows before the record is
// written, for the same object and act. Without keys no mark is looked for
// before a try, so each such retry wrote the record twice (review 248 F8);
// with keys the look finds it first. An Event that is another's (a
// forgery, an earlier act's) leaves the record to a generated name.
func (r *Recorder) wroteBefore(ctx context.Context, ev *corev1.Event) (bool, error) {
	var there corev1.Event
	if err := r.Reader.Get(ctx, client.ObjectKeyFromObject(ev), &there); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("look at the Event under the record's name: %w", err)
	}
	for _, k := range []string{AnnotationDecisionID, AnnotationObjectUID, AnnotationAct} {
		if there.Annotations[k] != ev.Annotations[k] {
			return false, nil
		}
	}
	return ev.Annotations[AnnotationDecisionID] != "", nil
}

// instance names this replica in the Events.
func (r *Recorder) instance() string {
	if r.Instance != "" {
		return r.Instance
	}
	host, _ := os.Hostname()
	return host
}

func (r *Recorder) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return time.Now()
}

// CSRReference is a CSR as an Event's object.
func CSRReference(csr *certificatesv1.CertificateSigningRequest) corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion: certificatesv1.SchemeGroupVersion.String(), Kind: "CertificateSigningRequest",
		Name: csr.Name, UID: csr.UID, ResourceVersion: csr.ResourceVersion,
	}
}

// BindingReference is a ClusterRoleBinding as an Event's object.
func BindingReference(b *rbacv1.ClusterRoleBinding) corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding",
		Name: b.Name, UID: b.UID, ResourceVersion: b.ResourceVersion,
	}
}
