package manualact

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ichor-dev/ichor-policy/engine"
)

// A binding's deletion is recorded once it is stored, never at admission:
// the webhook runs before the DELETE is stored, and the API server may
// still refuse it (another webhook, a timeout after admission, the
// storage), so a record written at admission could say a person's
// cluster-admin was revoked while the binding stayed, and its mark would
// then silence the record of the deletion that did happen (the hostile
// review of 2026-12-05). The replica whose webhook admits the DELETE keeps
// it as an attempt, then waits for the binding to be gone and records the
// revocation itself (ConfirmDeletion), whichever replica leads: the
// bindings' watch runs on the leader only, and a deletion during a leader
// change would reach no watch. It names the person only when the attempts
// kept for the binding name no one else: several people, or someone whose
// DELETE was refused earlier, leave the revoker unknown rather than name
// the wrong one. The bindings' watch records, with the revoker unknown, what
// no webhook confirmed (a binding held by finalizers past the wait, a
// webhook that was not called).

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
			"; the decision log records the revocation once the binding is gone, and names who only if no one else asked", engine.MaxEventNote),
		Source:              corev1.EventSource{Component: EventSource},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		Action:              "delete",
		ReportingController: "ichor.dev/" + EventSource,
		ReportingInstance:   r.instance(),
	}
}

// Waiting for a DELETE the webhook admitted to be stored: the API server
// stores it within its request's timeout; a binding held by finalizers (or
// a refused DELETE) is still there after, and left to the bindings' watch.
// At most maxConfirming wait at once: DELETEs refused after the webhook
// (by another webhook) would otherwise each hold a goroutine polling the
// API server; one beyond is left to the bindings' watch.
const (
	confirmWait     = 70 * time.Second
	confirmInterval = 500 * time.Millisecond
	maxConfirming   = 64
	// confirmSlack is how much longer the bindings' watch waits for a
	// confirmation before it records the revocation itself.
	confirmSlack = 15 * time.Second
)

// attempted reports whether a webhook kept an attempt to delete b (every
// place that does not verify is no attempt). An attempt that cannot be
// read is taken as none: the watch then records at once.
func (r *Recorder) attempted(ctx context.Context, b *rbacv1.ClusterRoleBinding) bool {
	if r.Keys == nil {
		return false
	}
	key, err := r.Keys.Key(ctx)
	if err != nil {
		return false
	}
	attempts, incomplete, err := r.attempts(ctx, key, b.UID, deletionVersion)
	return err == nil && (incomplete || len(attempts) > 0)
}

// ConfirmDeletion waits, in the background, for the admin binding b whose
// DELETE by user the webhook admitted to be gone, then records its
// revocation: naming user when the attempts kept for it name no one else,
// the revoker unknown otherwise. A binding still there after confirmWait is
// not recorded here (refused, or held): the bindings' watch records it when
// it goes. Another DELETE of a binding already waited for extends the wait
// rather than start a second one, which would record it twice.
func (r *Recorder) ConfirmDeletion(b *rbacv1.ClusterRoleBinding, user *authenticationv1.UserInfo, logger logr.Logger) {
	deadline := r.now().Add(confirmWait)
	r.confirmMu.Lock()
	if r.confirming == nil {
		r.confirming = map[types.UID]time.Time{}
	}
	if _, ok := r.confirming[b.UID]; ok {
		r.confirming[b.UID] = deadline
		r.confirmMu.Unlock()
		return
	}
	if len(r.confirming) >= maxConfirming {
		r.confirmMu.Unlock()
		logger.Info("too many admitted deletions of admin bindings are waiting to be confirmed: the bindings' watch records this one, the revoker unknown", "waiting", maxConfirming)
		return
	}
	r.confirming[b.UID] = deadline
	r.confirmMu.Unlock()

	b = b.DeepCopy()
	user = user.DeepCopy()
	go func() {
		defer func() {
			r.confirmMu.Lock()
			delete(r.confirming, b.UID)
			r.confirmMu.Unlock()
		}()
		ctx := log.IntoContext(context.Background(), logger)
		if !r.waitGone(ctx, b, logger) {
			logger.Info("an admin binding whose deletion was admitted is still there (refused, or held): not recorded as revoked; the bindings' watch records it once it is gone", "wait", confirmWait.String())
			return
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if !r.onlyAttempter(ctx, b, user.Username, logger) {
			user = nil
		}
		Log(ctx, "binding", b.Name)(r.Record(ctx, BindingReference(b), BindingDeletion(b, user)))
	}()
}

// waitGone reports whether b was seen gone (or replaced) before its
// deadline, which another DELETE may extend.
func (r *Recorder) waitGone(ctx context.Context, b *rbacv1.ClusterRoleBinding, logger logr.Logger) bool {
	t := time.NewTicker(confirmInterval)
	defer t.Stop()
	for {
		readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var now rbacv1.ClusterRoleBinding
		err := r.Reader.Get(readCtx, client.ObjectKeyFromObject(b), &now)
		cancel()
		switch {
		case apierrors.IsNotFound(err) || (err == nil && now.UID != b.UID):
			return true
		case err != nil:
			logger.V(1).Info("read an admin binding whose deletion was admitted; tried again", "error", err.Error())
		}
		r.confirmMu.Lock()
		deadline := r.confirming[b.UID]
		r.confirmMu.Unlock()
		if r.now().After(deadline) {
			return false
		}
		<-t.C
	}
}

// onlyAttempter reports whether the attempts kept for b name username and
// no one else, every place read.
func (r *Recorder) onlyAttempter(ctx context.Context, b *rbacv1.ClusterRoleBinding, username string, logger logr.Logger) bool {
	if r.Keys == nil {
		return false
	}
	key, err := r.Keys.Key(ctx)
	if err != nil {
		logger.Error(err, "read the attempts to delete an admin binding: the revoker is recorded unknown")
		return false
	}
	attempts, incomplete, err := r.attempts(ctx, key, b.UID, deletionVersion)
	if err != nil {
		logger.Error(err, "read the attempts to delete an admin binding: the revoker is recorded unknown")
		return false
	}
	people := map[string]bool{}
	for _, a := range attempts {
		if a.Verdict == engine.ActionRevoke {
			people[a.Username] = true
		}
	}
	if incomplete || len(people) != 1 || !people[boundUser(username)] {
		names := make([]string, 0, len(people))
		for name := range people {
			names = append(names, engine.Clip(name, "", maxLoggedName))
		}
		sort.Strings(names)
		logger.Info("the attempts to delete an admin binding do not say who deleted it: the revoker is recorded unknown", "asked_by", names, "places_all_taken", incomplete)
		return false
	}
	return true
}
