package manualact

import (
	"context"
	"fmt"
	"strings"
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

// TestTheWatchRecordsARequestFoundDecidedByHand: a request the watch first
// sees (as it starts) already decided, of a signer Ichor decides, by a
// condition that is not an approver's, was decided while no manager watched.
func TestTheWatchRecordsARequestFoundDecidedByHand(t *testing.T) {
	c := &CSRDecisions{Signers: []string{certificatesv1.KubeletServingSignerName}}
	other := request(approved("by hand"))
	other.Spec.SignerName = "example.com/other"
	assert.True(t, c.foundDecidedByHand(request(approved("by ada"))))
	assert.True(t, c.foundDecidedByHand(request(certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue})))
	assert.False(t, c.foundDecidedByHand(request(approved("IchorKubeletServing: matches (decision 0b6f3c1e-2a4d-4e5f-8a9b-1c2d3e4f5a6b, policy revision sha256:0123456789abcdef)"))), "the approver's")
	assert.False(t, c.foundDecidedByHand(request()), "undecided")
	assert.False(t, c.foundDecidedByHand(other), "another signer")
	assert.False(t, c.foundDecidedByHand(nil))

	found := CSRDecision(request(approved("by ada")), nil, nil)
	assert.Equal(t, "Approved", AddedVerdict(found.CertificateRequest), "with no old request, the verdict it holds is the act its mark names")
}

func adminBinding(name, role, username string) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{"ichor.dev/admin-binding": "true"},
			Annotations: map[string]string{"ichor.dev/admin-username": username, "ichor.dev/admin-identity": "ichor-admin:u:" + username},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}},
	}
}

// TestIsAdminBinding: only Ichor's admin bindings (label, IDENTITY:NONCE,
// cluster-admin) are revoked by their deletion; the label alone anyone who
// may create bindings writes on one to a harmless role (review 3, F3).
func TestIsAdminBinding(t *testing.T) {
	assert.True(t, IsAdminBinding(adminBinding("ichor-admin:u:bob:0123456789", "cluster-admin", "bob")))
	assert.False(t, IsAdminBinding(adminBinding("ichor-admin:u:alice:aaaaaaaaaa", "system:public-info-viewer", "alice")), "another role")
	assert.False(t, IsAdminBinding(adminBinding("ichor-admin:u:alice", "cluster-admin", "alice")), "no nonce")
	assert.False(t, IsAdminBinding(adminBinding("someone-else:0123456789", "cluster-admin", "alice")), "not an admin identity")
	unlabelled := adminBinding("ichor-admin:u:bob:0123456789", "cluster-admin", "bob")
	unlabelled.Labels["ichor.dev/admin-binding"] = "yes"
	assert.False(t, IsAdminBinding(unlabelled))
	assert.False(t, IsAdminBinding(nil))
}

// TestWhomIsTheNamesIdentity: the identity is read from the binding's name,
// not from the annotation its creator wrote.
func TestWhomIsTheNamesIdentity(t *testing.T) {
	in := BindingDeletion(adminBinding("ichor-admin:u:bob:0123456789", "cluster-admin", "alice"), nil)
	assert.Equal(t, "ichor-admin:u:bob", in.Binding.Identity)
	assert.Equal(t, "alice", in.Binding.Username, "the annotation, passed as the claim it is")
	other := BindingDeletion(adminBinding("ichor-admin:u:alice:aaaaaaaaaa", "view", "alice"), nil)
	assert.Empty(t, other.Binding.Identity, "not Ichor's: no identity")
}

// TestTheWatchIgnoresALabelledBindingOfAnotherRole: the watch records no
// revocation for it (the rule is never asked).
func TestTheWatchIgnoresALabelledBindingOfAnotherRole(t *testing.T) {
	r := &Revocations{Recorder: &Recorder{Engine: panics{}}}
	r.Revoked(t.Context(), adminBinding("ichor-admin:u:alice:aaaaaaaaaa", "system:public-info-viewer", "alice"))
}

type panics struct{}

func (panics) RecordManual(context.Context, engine.ManualActInput) (engine.ManualRecord, error) {
	panic("a labelled binding to another role was taken for a revocation")
}

// TestAVerdictBehindPaddingIsKept: sixteen conditions of a person's own,
// then Approved (review 3, F1); cut in order, the verdict would leave the
// facts and the decision would go unrecorded.
func TestAVerdictBehindPaddingIsKept(t *testing.T) {
	var conds []certificatesv1.CertificateSigningRequestCondition
	for i := range 2 * MaxConditions {
		conds = append(conds, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.RequestConditionType(fmt.Sprintf("Note%d", i)), Status: corev1.ConditionTrue})
	}
	failed := certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue}
	padded := append(append(conds[:MaxConditions:MaxConditions], approved("hidden"), failed), conds[MaxConditions:]...)
	in := CSRDecision(request(padded...), request(conds...), &authenticationv1.UserInfo{Username: "ada"})
	got := in.CertificateRequest.Conditions
	assert.Len(t, got, MaxConditions)
	assert.Equal(t, engine.ManualCondition{Type: "Approved", Status: "True", Reason: "R", Message: "hidden"}, got[0])
	assert.Equal(t, "Failed", got[1].Type)
	assert.Equal(t, "Note0", got[2].Type, "then the others, in order")
	assert.True(t, decides(in))
	assert.False(t, decides(CSRDecision(request(approved("x")), request(approved("x")), nil)), "decided before the write")
	assert.False(t, decides(BindingDeletion(&rbacv1.ClusterRoleBinding{}, nil)))
}

type noDecision struct{}

func (noDecision) RecordManual(context.Context, engine.ManualActInput) (engine.ManualRecord, error) {
	return engine.ManualRecord{}, engine.ErrNoDecision
}

// TestAVerdictTheRuleMissesIsAnError: a write that decided a request and
// that the rule does not record is reported, never dropped in silence.
func TestAVerdictTheRuleMissesIsAnError(t *testing.T) {
	r := &Recorder{Engine: noDecision{}}
	in := CSRDecision(request(approved("by hand")), request(), nil)
	rec, err := r.evaluate(t.Context(), &in)
	assert.Nil(t, rec)
	assert.ErrorIs(t, err, ErrDecisionUnrecorded)
	in = CSRDecision(request(), request(), nil)
	rec, err = r.evaluate(t.Context(), &in)
	assert.Nil(t, rec)
	assert.NoError(t, err, "a write that decides nothing is not recorded, and that is no error")
}

// TestTheConditionStoredIsDigestedWhole (review 4, R4): the digest of the
// verdict a write added is over its type, reason and message, whole (before
// the bound cuts the facts), and tells two people's words apart.
func TestTheConditionStoredIsDigestedWhole(t *testing.T) {
	long := approved(strings.Repeat("m", 64<<10))
	in := CSRDecision(request(long), request(), nil)
	assert.Equal(t, ConditionDigest(long), in.CertificateRequest.VerdictConditionSHA256)
	assert.NotEqual(t, ConditionDigest(approved("by ada, by hand with ichor: ok")), ConditionDigest(approved("by cy, by hand with ichor: ok")))
	denied := approved("ok")
	denied.Type = certificatesv1.CertificateDenied
	assert.NotEqual(t, ConditionDigest(approved("ok")), ConditionDigest(denied))
	shifted := approved("k")
	shifted.Reason = "Ro"
	assert.NotEqual(t, ConditionDigest(approved("ok")), ConditionDigest(shifted), "no field runs into another")
	assert.Empty(t, CSRDecision(request(long), request(long), nil).CertificateRequest.VerdictConditionSHA256, "decided before: no verdict added")
}
