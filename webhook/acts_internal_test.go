package webhook

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
)

type staticKey []byte

func (k staticKey) Key(context.Context) ([]byte, error) { return k, nil }

// recorderOf is the webhook's act recorder on a fake API server storing b,
// and b as stored.
func recorderOf(t *testing.T, b *rbacv1.ClusterRoleBinding) (*ActRecorder, client.Client, *rbacv1.ClusterRoleBinding) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(b).Build()
	var stored rbacv1.ClusterRoleBinding
	require.NoError(t, c.Get(t.Context(), client.ObjectKeyFromObject(b), &stored))
	a := &ActRecorder{
		Recorder: &manualact.Recorder{Reader: c, Client: c, Keys: staticKey("0123456789abcdef0123456789abcdef"), Instance: "test"},
		Reader:   c,
	}
	return a, c, &stored
}

// The review of 2026-12-06: the webhook's port answers whoever reaches it,
// and a review naming a binding's stored version can be sent again and
// again. Each started a wait of its own for the binding's deletion, polling
// the API server five times a second for 30 s and holding the review's
// object: a few a second used up the manager's reads of bindings. One wait
// a binding now, whatever the reviews.
func TestReviewsOfOneDeletionStartOneWait(t *testing.T) {
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name: "ichor-admin:u:frank:0123456789", UID: "b-frank", ResourceVersion: "77",
			Labels: map[string]string{credentials.LabelAdminBinding: "true", credentials.LabelManagedBy: credentials.ManagedBy},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "ichor-admin:u:frank:0123456789"}},
	}
	a, c, stored := recorderOf(t, b)
	// The sender's copy: the stored version, with annotations of its own.
	forged := stored.DeepCopy()
	forged.Annotations = map[string]string{credentials.AnnotationRevokedBy: "someone else"}
	raw, err := json.Marshal(forged)
	require.NoError(t, err)
	review := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "r-1", Operation: admissionv1.Delete, Name: b.Name,
		UserInfo: authenticationv1.UserInfo{Username: "mallory"}, OldObject: runtime.RawExtension{Raw: raw},
	}}
	for range 100 {
		assert.True(t, a.bindingDeletion(t.Context(), review).Allowed)
	}
	assert.EqualValues(t, 1, a.waits.Load(), "a wait a review")
	// The attempt regards the binding without its version.
	var events corev1.EventList
	require.NoError(t, c.List(t.Context(), &events))
	require.Len(t, events.Items, 1, "one person's attempts take one place")
	assert.Empty(t, events.Items[0].InvolvedObject.ResourceVersion)
}

// A review's copy of a binding is its sender's: one that dresses a stored
// binding that is no admin's (any binding its sender may read, named like
// an admin's) as an admin's keeps no attempt and starts no wait (review of
// 2026-12-06, after the webhook checked the sender's copy only).
func TestAReviewOfABindingStoredAsNoAdminsKeepsNothing(t *testing.T) {
	lookalike := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ichor-admin:u:frank:0123456789", UID: "b-lookalike"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "ichor-admin:u:frank:0123456789"}},
	}
	a, c, stored := recorderOf(t, lookalike)
	forged := stored.DeepCopy()
	forged.Labels = map[string]string{credentials.LabelAdminBinding: "true", credentials.LabelManagedBy: credentials.ManagedBy}
	forged.RoleRef.Name = "cluster-admin"
	require.True(t, manualact.IsAdminBinding(forged), "the sender's copy reads as an admin's")
	raw, err := json.Marshal(forged)
	require.NoError(t, err)
	review := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "r-1", Operation: admissionv1.Delete, Name: stored.Name,
		UserInfo: authenticationv1.UserInfo{Username: "mallory"}, OldObject: runtime.RawExtension{Raw: raw},
	}}
	assert.True(t, a.bindingDeletion(t.Context(), review).Allowed)
	assert.Zero(t, a.waits.Load(), "a wait for a binding that is no admin's")
	var events corev1.EventList
	require.NoError(t, c.List(t.Context(), &events))
	assert.Empty(t, events.Items, "an attempt kept for a binding that is no admin's")
}

// A review of a binding's deletion during the wait for it moves the wait's
// deadline: a DELETE admitted near the end of another's wait (a refused
// one, or a forged review) is waited for too, and the wait reads the
// binding once more after its deadline before it ends (review of
// 2026-12-06, after the reads were spaced out).
func TestAReviewDuringAWaitMovesItsDeadline(t *testing.T) {
	a := &ActRecorder{}
	require.True(t, a.waitFor("b-1"), "no wait began")
	require.True(t, a.stillWaiting("b-1"))
	// The deadline passed, and another review came before the wait's next
	// read: the wait goes on, to revocationWait from that review.
	a.polling["b-1"] = time.Now().Add(-time.Second)
	require.False(t, a.waitFor("b-1"), "a second wait began")
	assert.WithinDuration(t, time.Now().Add(revocationWait), a.polling["b-1"], time.Second)
	assert.True(t, a.stillWaiting("b-1"), "the wait ended at its first deadline")
	// No review since: the wait ends at its read after the deadline, and
	// the next review begins another.
	a.polling["b-1"] = time.Now().Add(-time.Second)
	assert.False(t, a.stillWaiting("b-1"))
	assert.True(t, a.waitFor("b-1"), "no wait began after the last one ended")
}

// A forged review of a CSR's approval with hundreds of thousands of verdict
// conditions, against as many old ones, is answered at once: each new one
// was compared with every old one before anything asked whether the API
// server stores that version, minutes of CPU a review for anyone who
// reaches the port (review 240 F1). The API server keeps one condition of
// each type, so the first of each is the one looked at.
func TestAForgedReviewOfManyConditionsIsAnsweredAtOnce(t *testing.T) {
	a, _, _ := recorderOf(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "unrelated"}})
	a.Signers = []string{certificatesv1.KubeletServingSignerName}
	csr := func(conditions []certificatesv1.CertificateSigningRequestCondition) []byte {
		raw, err := json.Marshal(&certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "forged", UID: "u", ResourceVersion: "1"},
			Spec:       certificatesv1.CertificateSigningRequestSpec{SignerName: certificatesv1.KubeletServingSignerName},
			Status:     certificatesv1.CertificateSigningRequestStatus{Conditions: conditions},
		})
		require.NoError(t, err)
		return raw
	}
	const n = 300_000
	verdicts := make([]certificatesv1.CertificateSigningRequestCondition, n)
	others := make([]certificatesv1.CertificateSigningRequestCondition, n)
	for i := range n {
		verdicts[i] = certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateDenied}
		others[i] = certificatesv1.CertificateSigningRequestCondition{Type: "X"}
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, SubResource: "approval",
		Object: runtime.RawExtension{Raw: csr(verdicts)}, OldObject: runtime.RawExtension{Raw: csr(others)},
	}}
	answered := make(chan admission.Response, 1)
	go func() { answered <- a.csrApproval(t.Context(), req) }()
	select {
	case resp := <-answered:
		assert.True(t, resp.Allowed)
	case <-time.After(30 * time.Second):
		t.Fatal("a forged review of many conditions was not answered within 30 s")
	}

	// The first verdict of each type is still judged: one that reads as
	// Ichor's, added by a person, is refused.
	ichors := []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Message: "approved (decision 5f0c0000-0000-4000-8000-000000000000, policy revision sha256:0123456789abcdef)"}}
	req.Object.Raw, req.OldObject.Raw = csr(ichors), csr(nil)
	assert.False(t, a.csrApproval(t.Context(), req).Allowed)
}
