// Package approval is what the CSR approvers share: reading and writing a
// request's approval, the memo of verdicts that are not written (pending, or
// written and not yet seen), its backoff, and the epoch of the facts a
// machine lookup depends on.
package approval

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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

// Approve writes the Approved condition with reason and message.
func Approve(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, reason, message string, now time.Time) error {
	return write(ctx, cs, csr, certificatesv1.CertificateApproved, reason, message, now)
}

// Deny writes the Denied condition with reason and message.
func Deny(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, reason, message string, now time.Time) error {
	return write(ctx, cs, csr, certificatesv1.CertificateDenied, reason, message, now)
}

func write(ctx context.Context, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest, kind certificatesv1.RequestConditionType, reason, message string, now time.Time) error {
	updated := csr.DeepCopy()
	t := metav1.NewTime(now)
	updated.Status.Conditions = append(updated.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type:               kind,
		Status:             corev1.ConditionTrue,
		Reason:             reason,
		Message:            message,
		LastUpdateTime:     t,
		LastTransitionTime: t,
	})
	// The resourceVersion of the object decided on: if the request changed
	// since (decided by someone else, say), the update conflicts and the
	// request is looked at again.
	if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, updated, metav1.UpdateOptions{}); err != nil {
		verb := "approve"
		if kind == certificatesv1.CertificateDenied {
			verb = "deny"
		}
		return fmt.Errorf("%s CSR %s: %w", verb, csr.Name, err)
	}
	return nil
}
