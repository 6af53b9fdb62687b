package approval_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
	"github.com/ichor-dev/ichor-policy/engine"
)

// After a write of unknown outcome, the condition found is recorded as the
// write's verdict only if it names that decision and action: a tenant's API
// server can answer the write with an error and write a condition naming any
// decision it has seen (review of 2026-12-05), which would have the log say
// that decision was applied to this request.
func TestAnUncertainWriteIsRecordedOnlyAsWhatItWrote(t *testing.T) {
	const mine, other = "5f0c2f4e-1d2b-4c3a-9e8f-0a1b2c3d4e5f", "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
	decided := func(typ certificatesv1.RequestConditionType, id string) *certificatesv1.CertificateSigningRequest {
		return &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "csr-1", UID: "uid-1"},
			Status: certificatesv1.CertificateSigningRequestStatus{Conditions: []certificatesv1.CertificateSigningRequestCondition{{
				Type: typ, Status: corev1.ConditionTrue, Reason: "IchorKubeletServing",
				Message: "IchorApproved: yes (decision " + id + ", policy revision sha256:abc)",
			}}},
		}
	}
	w := approval.UncertainWrite{Written: []engine.Applied{{DecisionID: mine, Object: "csr/csr-1", UID: "uid-1", Action: engine.ActionApprove, Outcome: engine.AppliedWritten}}}

	got, ok := w.Observed(decided(certificatesv1.CertificateApproved, mine))
	assert.True(t, ok)
	assert.Equal(t, engine.Applied{DecisionID: mine, Object: "csr/csr-1", UID: "uid-1", Action: engine.ActionApprove, Outcome: engine.AppliedObserved}, got)

	_, ok = w.Observed(decided(certificatesv1.CertificateApproved, other))
	assert.False(t, ok, "another decision's id")
	_, ok = w.Observed(decided(certificatesv1.CertificateDenied, mine))
	assert.False(t, ok, "the decision written as the other verdict")
	_, ok = w.Observed(&certificatesv1.CertificateSigningRequest{})
	assert.False(t, ok, "no verdict")

	// A second write of unknown outcome after the first: either may have
	// committed, and each is recorded as what it wrote.
	second := approval.UncertainWrite{Written: []engine.Applied{{DecisionID: other, Action: engine.ActionApprove}}}.After(w, true)
	for _, id := range []string{mine, other} {
		got, ok := second.Observed(decided(certificatesv1.CertificateApproved, id))
		assert.True(t, ok, id)
		assert.Equal(t, id, got.DecisionID)
	}
	assert.Len(t, w.Written, 1, "the earlier write's verdicts are not changed")

	// Written again and again with the same unknown outcome, the newest
	// sixteen are kept.
	many := w
	for range 40 {
		many = approval.UncertainWrite{Written: []engine.Applied{{DecisionID: other, Action: engine.ActionApprove}}}.After(many, true)
	}
	assert.Len(t, many.Written, 16)

	// A write kept before Written: the condition's decision, as before.
	got, ok = approval.UncertainWrite{}.Observed(decided(certificatesv1.CertificateDenied, other))
	assert.True(t, ok)
	assert.Equal(t, engine.ActionDeny, got.Action)
}

// An update that changed only what no rule reads (labels, annotations,
// conditions of other types) is told apart from one that changed the
// request's verdict, certificate or deletion, or replaced it.
func TestNothingReadChanged(t *testing.T) {
	old := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-1", UID: "uid-1", ResourceVersion: "1"}}
	relabelled := old.DeepCopy()
	relabelled.ResourceVersion, relabelled.Labels = "2", map[string]string{"loop": "1"}
	assert.True(t, approval.NothingReadChanged(old, relabelled))

	// A condition of another type, however often it changes (review 165).
	remarked := relabelled.DeepCopy()
	remarked.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: "Loop", Status: corev1.ConditionTrue, Message: "1"}}
	assert.True(t, approval.NothingReadChanged(old, remarked))
	again := remarked.DeepCopy()
	again.ResourceVersion, again.Status.Conditions[0].Message = "3", "2"
	assert.True(t, approval.NothingReadChanged(remarked, again))

	for _, verdict := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed} {
		decided := remarked.DeepCopy()
		decided.Status.Conditions = append(decided.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: verdict, Status: corev1.ConditionTrue})
		assert.False(t, approval.NothingReadChanged(old, decided), verdict)
		assert.False(t, approval.NothingReadChanged(remarked, decided), verdict)
	}
	issued := relabelled.DeepCopy()
	issued.Status.Certificate = []byte("a certificate")
	assert.False(t, approval.NothingReadChanged(old, issued))

	deleting := relabelled.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	assert.False(t, approval.NothingReadChanged(old, deleting))

	replaced := relabelled.DeepCopy()
	replaced.UID = "uid-2"
	assert.False(t, approval.NothingReadChanged(old, replaced))

	// An informer's resync: the same version, let through.
	assert.False(t, approval.NothingReadChanged(old, old.DeepCopy()))
}
