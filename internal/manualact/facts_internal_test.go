package manualact

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/ichor-policy/engine"
)

func request(conditions ...certificatesv1.CertificateSigningRequestCondition) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-1"},
		Spec:       certificatesv1.CertificateSigningRequestSpec{SignerName: certificatesv1.KubeletServingSignerName, Username: "system:node:worker-1"},
		Status:     certificatesv1.CertificateSigningRequestStatus{Conditions: conditions},
	}
}

func approved(message string) certificatesv1.CertificateSigningRequestCondition {
	return certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "R", Message: message}
}

// TestFactsAreBounded: a request can hold any number of conditions and a
// user any number of groups; the facts keep a bounded number of each.
func TestFactsAreBounded(t *testing.T) {
	var many []certificatesv1.CertificateSigningRequestCondition
	for i := range 1000 {
		many = append(many, certificatesv1.CertificateSigningRequestCondition{Type: "Custom", Status: corev1.ConditionTrue, Message: fmt.Sprint(i)})
	}
	groups := make([]string, 10000)
	for i := range groups {
		groups[i] = fmt.Sprintf("group-%d", i)
	}
	in := CSRDecision(request(many...), request(many...), &authenticationv1.UserInfo{Username: "ada", Groups: groups})
	assert.Len(t, in.CertificateRequest.Conditions, MaxConditions)
	assert.Len(t, in.CertificateRequest.PreviousConditions, MaxConditions)
	assert.Len(t, in.User.Groups, MaxGroups)
	assert.Equal(t, engine.SeenByAdmission, in.SeenBy)

	watched := CSRDecision(request(), nil, nil)
	assert.Equal(t, engine.SeenByWatch, watched.SeenBy)
	assert.Nil(t, watched.User, "a watch never names a user")
	assert.NotNil(t, watched.CertificateRequest.PreviousConditions)
}

// TestTheWatchRecordsOnlyADecisionByHand: the transition from undecided to
// decided, of a signer Ichor decides, by a condition that is not an
// approver's.
func TestTheWatchRecordsOnlyADecisionByHand(t *testing.T) {
	c := &CSRDecisions{Signers: []string{certificatesv1.KubeletServingSignerName}}
	own := approved("IchorKubeletServing: matches (decision 0b6f3c1e-2a4d-4e5f-8a9b-1c2d3e4f5a6b, policy revision sha256:0123456789abcdef)")
	other := request(approved("by hand"))
	other.Spec.SignerName = "example.com/other"
	for name, tc := range map[string]struct {
		old, csr *certificatesv1.CertificateSigningRequest
		want     bool
	}{
		"by hand":                {request(), request(approved("by ada, by hand with ichor: moved")), true},
		"the approver's":         {request(), request(own), false},
		"decided before":         {request(approved("x")), request(approved("x")), false},
		"still undecided":        {request(), request(), false},
		"another signer":         {request(), other, false},
		"a denial by hand":       {request(), request(certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Message: "no"}), true},
		"not True is no verdict": {request(), request(certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionFalse}), false},
	} {
		assert.Equal(t, tc.want, c.decidedByHand(tc.old, tc.csr), name)
	}
}

func TestIsAdminBinding(t *testing.T) {
	assert.True(t, IsAdminBinding(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"ichor.dev/admin-binding": "true"}}}))
	assert.False(t, IsAdminBinding(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"ichor.dev/admin-binding": "yes"}}}))
	assert.False(t, IsAdminBinding(nil))
}
