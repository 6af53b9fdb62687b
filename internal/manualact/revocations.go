package manualact

import (
	"context"
	"errors"
	"fmt"
	"sort"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ichor-dev/ichor-policy/engine"
)

// A binding's deletion is kept as an attempt too, and recorded by the
// bindings' watch once the binding is gone: the webhook runs before the
// DELETE is stored, and the API server may still refuse it (another
// webhook or policy, a timeout after admission, the storage), so a record
// written at admission could say a person's cluster-admin was revoked while
// the binding stayed, and its mark would then silence the record of the
// deletion that did happen (the hostile review of 2026-12-05). The watch
// names the person from the attempts kept for the binding's UID when they
// say who: one person, every place read.

// deletionVersion stands for the version in a deletion attempt's name and
// MAC: a binding is deleted once, whatever its version, and no request's
// version reads so.
const deletionVersion = "deletion"

// DeletionAttempt keeps, as an Event, a person's DELETE of an admin binding
// that the webhook admits. An error is logged by the caller: the deletion is
// never refused.
func (r *Recorder) DeletionAttempt(ctx context.Context, b *rbacv1.ClusterRoleBinding, user *authenticationv1.UserInfo) (*engine.ManualAttempt, error) {
	if b.UID == "" {
		return nil, errors.New("the binding has no UID to keep the attempt under")
	}
	if r.Keys == nil {
		return nil, errors.New("no key to sign the attempt with")
	}
	key, err := r.Keys.Key(ctx)
	if err != nil {
		return nil, fmt.Errorf("the records' key: %w", err)
	}
	a := engine.ManualAttempt{Verdict: engine.ActionRevoke, Username: boundUser(user.Username), UID: boundUser(user.UID)}
	for slot := range MaxAttempts {
		err := r.Client.Create(ctx, r.deletionAttemptEvent(key, b, slot, a))
		if err == nil {
			return &a, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("keep the attempt: %w", err)
		}
	}
	return nil, fmt.Errorf("the %d places of attempts to delete %s are taken: this attempt is not kept", MaxAttempts, b.Name)
}

func (r *Recorder) deletionAttemptEvent(key []byte, b *rbacv1.ClusterRoleBinding, slot int, a engine.ManualAttempt) *corev1.Event {
	now := metav1.NewTime(r.now())
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: EventNamespace,
			Name:      AttemptEventName(key, b.UID, deletionVersion, slot),
			Annotations: map[string]string{
				AnnotationObjectUID: string(b.UID),
				AnnotationVerdict:   a.Verdict,
				AnnotationUsername:  a.Username,
				AnnotationUserUID:   a.UID,
				AnnotationMAC:       attemptMAC(key, b.UID, deletionVersion, slot, a),
			},
		},
		InvolvedObject: BindingReference(b),
		Type:           corev1.EventTypeNormal,
		Reason:         ReasonAttempt,
		Message: engine.Clip(fmt.Sprintf("%q asked to delete admin binding %s", a.Username, b.Name),
			"; the decision log records the revocation once the binding is gone, and names who only if this attempt is the only one", engine.MaxEventNote),
		Source:              corev1.EventSource{Component: EventSource},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		Action:              "delete",
		ReportingController: "ichor.dev/" + EventSource,
		ReportingInstance:   r.instance(),
	}
}

// revoker is who deleted b, from the attempts kept for it: the one person
// whose DELETE the webhook admitted, every place read; nil when the
// attempts do not say (none kept: the webhook was not called; several
// people; a place unread), and the watch records the revoker unknown.
func (r *Recorder) revoker(ctx context.Context, b *rbacv1.ClusterRoleBinding) *authenticationv1.UserInfo {
	if r.Keys == nil {
		return nil
	}
	logger := log.FromContext(ctx).WithValues("binding", engine.Clip(b.Name, "", maxLoggedName))
	key, err := r.Keys.Key(ctx)
	if err != nil {
		logger.Error(err, "read the attempts to delete an admin binding: the revoker is recorded unknown")
		return nil
	}
	attempts, incomplete, err := r.attempts(ctx, key, b.UID, deletionVersion)
	if err != nil {
		logger.Error(err, "read the attempts to delete an admin binding: the revoker is recorded unknown")
		return nil
	}
	people := map[string]engine.ManualAttempt{}
	for _, a := range attempts {
		if a.Verdict == engine.ActionRevoke && a.Username != "" {
			people[a.Username] = a
		}
	}
	if len(people) == 1 && !incomplete {
		for _, a := range people {
			return &authenticationv1.UserInfo{Username: a.Username, UID: a.UID}
		}
	}
	if len(people) > 1 || incomplete {
		names := make([]string, 0, len(people))
		for name := range people {
			names = append(names, engine.Clip(name, "", maxLoggedName))
		}
		sort.Strings(names)
		logger.Info("the attempts to delete an admin binding do not say who deleted it: the revoker is recorded unknown", "asked_by", names, "places_all_taken", incomplete)
	}
	return nil
}
