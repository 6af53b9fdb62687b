package manualact

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ichor-dev/ichor-policy/engine"
)

// An attempt is a person's write of a verdict on a request that the
// manager's webhook admitted. Admission runs before the write is stored,
// and several writes can pass it from one version of a request (an approve
// and a deny sent at once, a person's denial beside Ichor's approval): the
// API server stores one and refuses the others ("updates may not remove a
// condition", or a conflict). So the webhook records no decision (review 3,
// F2). It keeps the attempt, as an Event whose MAC binds it to the request's
// UID, the version the write replaces, the verdict and the user; any
// replica may take the admission call, so the attempts live in the API
// server, not in one replica's memory. The manager's watch then sees the
// change stored (the version it replaced, the verdict) and records that
// verdict, with the attempts kept from that version as facts: the rule
// names the person only if they say who.

// MaxAttempts bounds the attempts kept from one version of a request (the
// webhook's writes, the watch's reads): each has its own Event name, a
// place, and the watch reads every place.
const MaxAttempts = 4

// ReasonAttempt is the reason of an attempt's Event.
const ReasonAttempt = "ManualDecisionAttempt"

// The annotations of an attempt's Event (with AnnotationObjectUID and
// AnnotationMAC).
const (
	// AnnotationOldResourceVersion is the version a deletion's attempt
	// binds (DeletionVersion@UNIX-SECONDS); a CSR's has none (versionAt).
	AnnotationOldResourceVersion = "ichor.dev/old-resource-version"
	AnnotationVerdict            = "ichor.dev/verdict"
	AnnotationConditionSHA256    = "ichor.dev/condition-sha256"
	AnnotationUsername           = "ichor.dev/username"
	AnnotationUserUID            = "ichor.dev/user-uid"
)

// maxAttemptUser bounds the username and uid an attempt keeps; a longer one
// is cut and ends with a hash of the whole, so two long names that share
// their first bytes remain two people.
const maxAttemptUser = 512

// AttemptEventName is the name of the attempt's Event at place slot, of a
// write that replaces the version oldRV of the object with this UID: an
// HMAC of those with the records' key, so that nobody without the key can
// know the names and take the places before a person's attempt (review 4,
// R2: every kubelet may create Events in default).
func AttemptEventName(key []byte, uid types.UID, oldRV string, slot int) string {
	fields, _ := json.Marshal([]string{string(uid), oldRV, strconv.Itoa(slot)})
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ichor-attempt-name\x00"))
	m.Write(fields)
	return "ichor-attempt-" + hex.EncodeToString(m.Sum(nil))[:40]
}

// Attempt keeps, as an Event, a write of a verdict on csr that the webhook
// admits: old is the request the write replaces, user who makes it. It
// returns the attempt kept, or nil for a write that adds no verdict. An
// error is logged by the caller: the write is never refused.
func (r *Recorder) Attempt(ctx context.Context, csr, old *certificatesv1.CertificateSigningRequest, user *authenticationv1.UserInfo) (*engine.ManualAttempt, error) {
	facts := CSRDecision(csr, old, nil).CertificateRequest
	verdict := AddedVerdict(facts)
	if verdict == "" {
		return nil, nil
	}
	if old.UID == "" || old.ResourceVersion == "" {
		return nil, errors.New("the request has no UID or resourceVersion to keep the attempt under")
	}
	key, err := r.attemptKey(ctx)
	if err != nil {
		return nil, err
	}
	a := engine.ManualAttempt{Verdict: verdict, ConditionSHA256: facts.VerdictConditionSHA256, Username: boundUser(user.Username), UID: boundUser(user.UID)}
	verb := map[string]string{string(certificatesv1.CertificateApproved): "approve", string(certificatesv1.CertificateDenied): "deny"}[verdict]
	message := engine.Clip(fmt.Sprintf("%q asked to %s certificate signing request %s", a.Username, verb, old.Name),
		"; the decision log records the verdict the API server stores, and names who only if this attempt is the one stored", engine.MaxEventNote)
	// Nowhere in the Event the version it is kept at (its place's name
	// binds it through the key): whoever may read Events in its namespace
	// but not the request would learn the version a forged review must
	// name to be kept, while a write the webhook admitted and the API
	// server refused leaves it current (review 240 F4), as a deletion's
	// attempt never shows it.
	regarding := CSRReference(old)
	regarding.ResourceVersion = ""
	return r.keepAttempt(ctx, key, regarding, old.ResourceVersion, old.ResourceVersion, verb, message, a)
}

// attemptKey is the key an attempt's place and MAC are made with.
func (r *Recorder) attemptKey(ctx context.Context) ([]byte, error) {
	if r.Keys == nil {
		return nil, errors.New("no key to sign the attempt with")
	}
	key, err := r.Keys.Key(ctx)
	if err != nil {
		return nil, fmt.Errorf("the records' key: %w", err)
	}
	return key, nil
}

// DeletionVersion stands for the version a deletion replaces in the names
// of its attempts' places: a deleted object is not written again, and the
// watch is told of its deletion under a resourceVersion of the deletion's
// own, not the one the DELETE's review named. The version an attempt's MAC
// binds is DeletionVersion@UNIX-SECONDS, when it was admitted: an attempt
// counts for a deletion seen within RevocationWindow of it only.
const DeletionVersion = "deletion"

// RevocationWindow is how long before a binding was seen gone (or its
// deletion requested, for a deletion finalizers held) a DELETE's attempt
// counts for it: a DELETE refused an hour before, its attempt kept, must not
// name its sender as the revoker of a deletion the webhook did not see
// (review of 2026-12-06). Far more than an admitted DELETE takes to be
// stored, and than the webhook's replica waits before it records.
const RevocationWindow = 2 * time.Minute

// AttemptRevocation keeps, as an Event, a DELETE of an admin binding that
// the webhook admits: like a verdict's write, it is admitted before it is
// stored, and can still be refused after (another webhook, a policy, a
// timeout, a DELETE that raced it: review of 2026-12-06, when a refused
// DELETE was recorded as a revocation while the binding still granted
// cluster-admin, and its record silenced the real one's). The watch records
// the revocation once the binding is gone, naming the one person who asked.
func (r *Recorder) AttemptRevocation(ctx context.Context, b *rbacv1.ClusterRoleBinding, user *authenticationv1.UserInfo) (*engine.ManualAttempt, error) {
	if b.UID == "" {
		return nil, errors.New("the binding has no UID to keep the attempt under")
	}
	key, err := r.attemptKey(ctx)
	if err != nil {
		return nil, err
	}
	a := engine.ManualAttempt{Verdict: engine.ActionRevoke, Username: boundUser(user.Username), UID: boundUser(user.UID)}
	message := engine.Clip(fmt.Sprintf("%q asked to delete the admin binding %s", a.Username, b.Name),
		"; the decision log records the revocation once the binding is gone, and names who only if one person asked", engine.MaxEventNote)
	// Without its resourceVersion: the Event, which whoever may read Events
	// in its namespace reads, must not tell them the version a review must
	// name to be kept (stored).
	regarding := BindingReference(b)
	regarding.ResourceVersion = ""
	version := fmt.Sprintf("%s@%d", DeletionVersion, r.now().Unix())
	return r.keepAttempt(ctx, key, regarding, DeletionVersion, version, engine.ActionRevoke, message, a)
}

// keepAttempt writes the attempt's Event at the first free place of the
// object's place (a version, or DeletionVersion), binding version in its
// MAC. A place that holds this very attempt already (the same person's same
// write, sent again or several times at once) is kept, its version brought
// up to this one: one person's repeated writes take one place, and cannot
// fill the places so that the record names nobody (review of 2026-12-06).
func (r *Recorder) keepAttempt(ctx context.Context, key []byte, regarding corev1.ObjectReference, place, version, action, message string, a engine.ManualAttempt) (*engine.ManualAttempt, error) {
	for slot := range MaxAttempts {
		ev := r.attemptEvent(key, regarding, place, version, slot, action, message, a)
		err := r.Client.Create(ctx, ev)
		if err == nil {
			return &a, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("keep the attempt: %w", err)
		}
		var taken corev1.Event
		if r.Reader.Get(ctx, client.ObjectKeyFromObject(ev), &taken) != nil {
			continue
		}
		an := taken.Annotations
		if !hmac.Equal([]byte(an[AnnotationMAC]), []byte(attemptMAC(key, regarding.UID, versionAt(an, place), slot, a))) {
			// Another attempt, or no attempt of the manager's.
			continue
		}
		if versionAt(an, place) != version {
			if an == nil {
				an = map[string]string{}
				taken.Annotations = an
			}
			an[AnnotationOldResourceVersion], an[AnnotationMAC] = version, ev.Annotations[AnnotationMAC]
			if err := r.Client.Update(ctx, &taken); err != nil {
				return nil, fmt.Errorf("keep the attempt again: %w", err)
			}
		}
		return &a, nil
	}
	return nil, fmt.Errorf("the %d places of attempts on %s at version %s are taken: this attempt is not kept", MaxAttempts, regarding.Name, place)
}

// versionAt is the version an attempt's Event at place binds: its
// annotation's, written only where it is not the place itself (a
// deletion's, place DeletionVersion); the place's otherwise (a CSR's, whose
// place is the version, kept out of the Event: review 240 F4).
func versionAt(annotations map[string]string, place string) string {
	if v := annotations[AnnotationOldResourceVersion]; v != "" {
		return v
	}
	return place
}

func (r *Recorder) attemptEvent(key []byte, regarding corev1.ObjectReference, place, version string, slot int, action, message string, a engine.ManualAttempt) *corev1.Event {
	now := metav1.NewTime(r.now())
	annotations := map[string]string{
		AnnotationObjectUID:       string(regarding.UID),
		AnnotationVerdict:         a.Verdict,
		AnnotationConditionSHA256: a.ConditionSHA256,
		AnnotationUsername:        a.Username,
		AnnotationUserUID:         a.UID,
		AnnotationMAC:             attemptMAC(key, regarding.UID, version, slot, a),
	}
	if version != place {
		annotations[AnnotationOldResourceVersion] = version
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   EventNamespace,
			Name:        AttemptEventName(key, regarding.UID, place, slot),
			Annotations: annotations,
		},
		InvolvedObject:      regarding,
		Type:                corev1.EventTypeNormal,
		Reason:              ReasonAttempt,
		Message:             message,
		Source:              corev1.EventSource{Component: EventSource},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		Action:              action,
		ReportingController: "ichor.dev/" + EventSource,
		ReportingInstance:   r.instance(),
	}
}

// RevocationAttempts are the verified attempts kept of the deletion of the
// binding with uid admitted since since, and whether they may be incomplete.
func (r *Recorder) RevocationAttempts(ctx context.Context, uid types.UID, since time.Time) ([]engine.ManualAttempt, bool, error) {
	if r.Keys == nil {
		// No webhook (--webhook=false), so no attempt was kept: the
		// revoker is the annotation's, or unknown.
		return nil, false, nil
	}
	key, err := r.Keys.Key(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("the records' key: %w", err)
	}
	return r.attemptsWhere(ctx, key, uid, DeletionVersion, func(version string) bool {
		at, ok := strings.CutPrefix(version, DeletionVersion+"@")
		seconds, err := strconv.ParseInt(at, 10, 64)
		return ok && err == nil && seconds >= since.Unix()
	})
}

// attempts are the verified attempts kept from the version oldRV of the
// object with uid, and whether they may be incomplete: every place taken
// (more may have been made than are read), or an Event at a place that
// does not verify (it cannot be the manager's, or was edited: it is no
// attempt, and is logged). A place that cannot be read is an error: the
// watch's queue tries the whole record again later, rather than record a
// decision whose attempts it did not read.
func (r *Recorder) attempts(ctx context.Context, key []byte, uid types.UID, oldRV string) ([]engine.ManualAttempt, bool, error) {
	return r.attemptsWhere(ctx, key, uid, oldRV, func(version string) bool { return version == oldRV })
}

// attemptsWhere are the verified attempts at the object's place whose
// version counts.
func (r *Recorder) attemptsWhere(ctx context.Context, key []byte, uid types.UID, place string, counts func(version string) bool) ([]engine.ManualAttempt, bool, error) {
	out := []engine.ManualAttempt{}
	taken, incomplete := 0, false
	for slot := range MaxAttempts {
		var ev corev1.Event
		err := r.Reader.Get(ctx, client.ObjectKey{Namespace: EventNamespace, Name: AttemptEventName(key, uid, place, slot)}, &ev)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("read a person's attempt at place %d: %w", slot, err)
		}
		taken++
		an := ev.Annotations
		a := engine.ManualAttempt{Verdict: an[AnnotationVerdict], ConditionSHA256: an[AnnotationConditionSHA256], Username: an[AnnotationUsername], UID: an[AnnotationUserUID]}
		version := versionAt(an, place)
		if !hmac.Equal([]byte(an[AnnotationMAC]), []byte(attemptMAC(key, uid, version, slot, a))) {
			// A place's name is known once its Event is made (anyone
			// who may list Events in default reads it), and an attempt
			// edited there by whoever may update Events is lost: the
			// attempts read may miss one, so the rule names nobody
			// rather than the one left (review of 2026-12-06).
			log.FromContext(ctx).Info("an Event by an attempt's name does not verify: it is no attempt, and the attempts may be incomplete", "event", ev.Name)
			incomplete = true
			continue
		}
		if !counts(version) {
			continue
		}
		out = append(out, a)
	}
	return out, incomplete || taken == MaxAttempts, nil
}

// attemptMAC binds an attempt's Event to the object's UID, the version the
// write replaces, its place and what it says: the verdict, the digest of
// the condition written (review 4, R4) and the user. The fields are JSON,
// so that no username can be read as another field.
func attemptMAC(key []byte, uid types.UID, oldRV string, slot int, a engine.ManualAttempt) string {
	fields, _ := json.Marshal([]string{string(uid), oldRV, strconv.Itoa(slot), a.Verdict, a.ConditionSHA256, a.Username, a.UID})
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ichor-attempt\x00"))
	m.Write(fields)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// boundUser cuts a username or uid to maxAttemptUser bytes, at a rune's
// start, ending with a hash of the whole.
func boundUser(s string) string {
	if len(s) <= maxAttemptUser {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	tail := "...sha256:" + hex.EncodeToString(sum[:8])
	keep := maxAttemptUser - len(tail)
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + tail
}

// AddedVerdict is the type of the Approved or Denied condition, True, that
// the request holds after the write and did not hold before, or "".
func AddedVerdict(f *engine.ManualCSRFacts) string {
	if f == nil {
		return ""
	}
	for _, c := range f.Conditions {
		verdict := c.Type == string(certificatesv1.CertificateApproved) || c.Type == string(certificatesv1.CertificateDenied)
		if verdict && c.Status == string(corev1.ConditionTrue) && !decidedBefore(f, c.Type) {
			return c.Type
		}
	}
	return ""
}

func decidedBefore(f *engine.ManualCSRFacts, typ string) bool {
	for _, p := range f.PreviousConditions {
		if p.Type == typ {
			return true
		}
	}
	return false
}

// LogAttempt logs what Attempt returned.
func LogAttempt(ctx context.Context, kind, name string, a *engine.ManualAttempt, err error) {
	logger := log.FromContext(ctx).WithValues(kind, engine.Clip(name, "", maxLoggedName))
	if err != nil {
		logger.Error(err, "keep a person's attempt")
		return
	}
	if a != nil {
		logger.V(1).Info("kept a person's attempt; the watch records what the API server stores",
			"verdict", a.Verdict, "user", engine.Clip(a.Username, "", maxLoggedName))
	}
}
