// Package approval is what the CSR approvers share: reading and writing a
// request's approval, the memo of verdicts that are not written (pending, or
// written and not yet seen), its backoff, and the epoch of the facts a
// machine lookup depends on.
package approval

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/ichor-dev/ichor-policy/engine"
)

// IsDecided reports whether the request is approved or denied, by anyone.
func IsDecided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return true
		}
	}
	return false
}

// IsApproved reports whether the request is approved.
func IsApproved(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Decision is the decision an approver's condition on a request names.
type Decision struct {
	// ID is the decision's id in the decision log.
	ID string
	// Action is engine.ActionApprove or engine.ActionDeny.
	Action string
	// At is the condition's time (whole seconds).
	At time.Time
}

// DecisionOf is the decision the request's Approved or Denied condition
// names; ok is false when the request is undecided or its condition names
// none (a person's `kubectl certificate approve`). The id is read from the
// message's tail only (engine.DecisionOfMessage): the reasons before it
// quote what a requester wrote (a node name), which may itself read
// "(decision ..." (review 17).
func DecisionOf(csr *certificatesv1.CertificateSigningRequest) (d Decision, ok bool) {
	for _, c := range csr.Status.Conditions {
		if c.Type != certificatesv1.CertificateApproved && c.Type != certificatesv1.CertificateDenied {
			continue
		}
		id, ok := engine.DecisionOfMessage(c.Message)
		if !ok {
			return Decision{}, false
		}
		d = Decision{ID: id, Action: engine.ActionApprove, At: c.LastUpdateTime.Time}
		if c.Type == certificatesv1.CertificateDenied {
			d.Action = engine.ActionDeny
		}
		return d, true
	}
	return Decision{}, false
}

// NothingReadChanged reports whether an update of a request changed nothing
// the rules read: the same request (UID), its verdict conditions (Approved,
// Denied, Failed), its certificate and its deletion as before, so only its
// labels, annotations, conditions of other types or the like (its spec
// cannot change; no input of a rule holds the rest of its status). Whoever
// may update a request, or its status (a tenant on its own API server),
// could otherwise have it decided and logged again at the rate of its
// writes (reviews of 2026-12-05, and 165 for the status); such an update
// wakes nothing, and the request is looked at again when its own wait is
// over.
//
// An informer's resync (the same version twice) is no such update: it is a
// look the approver may need, and is let through.
func NothingReadChanged(old, updated *certificatesv1.CertificateSigningRequest) bool {
	return old.UID == updated.UID && old.ResourceVersion != updated.ResourceVersion &&
		old.DeletionTimestamp.Equal(updated.DeletionTimestamp) && bytes.Equal(old.Status.Certificate, updated.Status.Certificate) &&
		equality.Semantic.DeepEqual(verdicts(old.Status.Conditions), verdicts(updated.Status.Conditions))
}

// verdicts are the conditions of a request's verdict, in their order.
func verdicts(conditions []certificatesv1.CertificateSigningRequestCondition) []certificatesv1.CertificateSigningRequestCondition {
	var out []certificatesv1.CertificateSigningRequestCondition
	for _, c := range conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			out = append(out, c)
		}
	}
	return out
}

// Approve writes the Approved condition with reason and message.
func Approve(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, reason, message string, now time.Time) error {
	return write(ctx, cs, csr, certificatesv1.CertificateApproved, reason, message, now)
}

// Deny writes the Denied condition with reason and message.
func Deny(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, reason, message string, now time.Time) error {
	return write(ctx, cs, csr, certificatesv1.CertificateDenied, reason, message, now)
}

// errNotWrittenStopping is a conflicted write not made again because the
// manager was told to stop: it was not applied.
var errNotWrittenStopping = errors.New("not written: it conflicted, and the manager is stopping")

// ErrDecidedMeanwhile is returned when a write conflicted because someone
// else decided the request in the meantime: nothing was written here.
var ErrDecidedMeanwhile = errors.New("decided by another writer meanwhile")

// conflictRetry is how often a conflicted write is tried again on the
// request as it is now, and how soon: at once (a conflict is not a failure,
// and backing off on it held a burst's verdicts back by tens of seconds),
// with a few milliseconds between tries so that a writer that keeps
// changing the request does not spin us.
var conflictRetry = wait.Backoff{Steps: 5, Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.1}

func write(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, kind certificatesv1.RequestConditionType, reason, message string, now time.Time) error {
	t := metav1.NewTime(now)
	condition := certificatesv1.CertificateSigningRequestCondition{
		Type:               kind,
		Status:             corev1.ConditionTrue,
		Reason:             reason,
		Message:            message,
		LastUpdateTime:     t,
		LastTransitionTime: t,
	}
	current := csr
	// The version the last update was made on: a write answered with an
	// error that may have been applied was made on it.
	var lastVersion string
	// last is the error of the last try: retry.OnError hands back its last
	// conflict in place of an error that wraps a context's end (a timeout,
	// a cancel), which here is a write of unknown outcome (review 21, M1).
	var last error
	err := retry.RetryOnConflict(conflictRetry, func() error {
		last = try(ctx, cs, csr, condition, &current, &lastVersion)
		return last
	})
	if err != nil && last != nil {
		err = last
	}
	if err != nil {
		verb := "approve"
		if kind == certificatesv1.CertificateDenied {
			verb = "deny"
		}
		return fmt.Errorf("%s CSR %s: %w", verb, csr.Name, err)
	}
	return nil
}

// try makes one try of a verdict write: on *current, or, after a conflict
// (*current nil), on the request read again. *lastVersion is the version
// the last update was made on.
func try(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, condition certificatesv1.CertificateSigningRequestCondition, current **certificatesv1.CertificateSigningRequest, lastVersion *string) error {
	if *current == nil {
		// A conflict: read the request as it is now. Its spec cannot
		// change (the API server refuses it), so the verdict still
		// holds for it unless someone decided it meanwhile, or it is
		// another request of the same name.
		live, err := cs.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			// The conflict may be this very write, applied by an
			// earlier try (below): nothing says it was not.
			return &UnknownOutcome{ResourceVersion: *lastVersion, Err: fmt.Errorf("read it again after a conflict: %w", err)}
		}
		switch {
		case live.UID != csr.UID:
			return fmt.Errorf("read it again after a conflict: it is another request now (uid %s, decided on %s)", live.UID, csr.UID)
		case hasCondition(live, condition):
			// This very write, applied by an earlier try whose
			// answer was lost (client-go sends a write again by
			// itself after a 5xx with Retry-After): written.
			return nil
		case IsDecided(live):
			return ErrDecidedMeanwhile
		case stopping(ctx):
			// Not written again once the manager was told to stop
			// (Finishing): another leader may be deciding the request
			// by now. Read first all the same: the conflict may be
			// this very write, applied by an earlier try (above).
			return errNotWrittenStopping
		}
		*current = live
	}
	// The resourceVersion of the object decided on (or read again
	// since): if the request changed, the update conflicts.
	updated := (*current).DeepCopy()
	updated.Status.Conditions = append(updated.Status.Conditions, condition)
	*lastVersion = (*current).ResourceVersion
	_, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, updated, metav1.UpdateOptions{})
	if err != nil && mayHaveApplied(err) {
		err = &UnknownOutcome{ResourceVersion: *lastVersion, Err: err}
	}
	*current = nil
	return err
}

// hasCondition reports whether the request carries the condition this write
// makes: its type, reason and message, which names its decision.
func hasCondition(csr *certificatesv1.CertificateSigningRequest, want certificatesv1.CertificateSigningRequestCondition) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == want.Type && c.Reason == want.Reason && c.Message == want.Message {
			return true
		}
	}
	return false
}

// UnknownOutcome is a write answered with an error that does not say the
// API server refused it (a timeout, a lost connection, a 5xx): it may have
// been applied, or may yet be (an API server still at it). It was made on
// ResourceVersion, so it can no longer commit once the request is at
// another version.
type UnknownOutcome struct {
	ResourceVersion string
	Err             error
}

func (e *UnknownOutcome) Error() string { return e.Err.Error() }
func (e *UnknownOutcome) Unwrap() error { return e.Err }

// mayHaveApplied reports whether a write answered with err may have been
// applied: anything but a refusal (a 4xx, but a 408 Request Timeout).
func mayHaveApplied(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		// No answer (a lost connection, a context that ended once the
		// request was sent).
		return true
	}
	code := status.Status().Code
	return code < 400 || code >= 500 || code == http.StatusRequestTimeout
}
