package manualact

import (
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
)

// CSRDecision is the input of a CSR's decision by hand: the request after the
// write (csr) and before it (old, nil when unknown), seen by the webhook
// with the admission's user, or by a watch (user nil).
func CSRDecision(csr, old *certificatesv1.CertificateSigningRequest, user *authenticationv1.UserInfo) engine.ManualActInput {
	facts := &engine.ManualCSRFacts{
		Name: csr.Name, UID: string(csr.UID), SignerName: csr.Spec.SignerName, Username: csr.Spec.Username,
		Conditions: conditions(csr), PreviousConditions: []engine.ManualCondition{},
	}
	if old != nil {
		facts.PreviousConditions = conditions(old)
	}
	in := engine.ManualActInput{Act: engine.ActCSRDecision, CertificateRequest: facts}
	seen(&in, user)
	return in
}

// conditions are the request's conditions, the first MaxConditions: a
// request is decided once (the API server keeps Approved and Denied
// exclusive and never removes them), and the approver writes one condition.
func conditions(csr *certificatesv1.CertificateSigningRequest) []engine.ManualCondition {
	out := make([]engine.ManualCondition, 0, min(len(csr.Status.Conditions), MaxConditions))
	for i, c := range csr.Status.Conditions {
		if i == MaxConditions {
			break
		}
		out = append(out, engine.ManualCondition{Type: string(c.Type), Status: string(c.Status), Reason: c.Reason, Message: c.Message})
	}
	return out
}

// BindingDeletion is the input of an admin binding's deletion, seen by the
// webhook with the admission's user, or by the watch (user nil).
func BindingDeletion(b *rbacv1.ClusterRoleBinding, user *authenticationv1.UserInfo) engine.ManualActInput {
	in := engine.ManualActInput{Act: engine.ActAdminBindingDeletion, Binding: &engine.ManualBindingFacts{
		Name: b.Name, UID: string(b.UID),
		Username:  b.Annotations[credentials.AnnotationAdminUsername],
		Identity:  b.Annotations[credentials.AnnotationAdminIdentity],
		RevokedBy: b.Annotations[credentials.AnnotationRevokedBy],
		RoleRef:   engine.RoleRefFacts{APIGroup: b.RoleRef.APIGroup, Kind: b.RoleRef.Kind, Name: b.RoleRef.Name},
	}}
	seen(&in, user)
	return in
}

func seen(in *engine.ManualActInput, user *authenticationv1.UserInfo) {
	if user == nil {
		in.SeenBy = engine.SeenByWatch
		return
	}
	in.SeenBy = engine.SeenByAdmission
	u := credential.User(*user)
	if len(u.Groups) > MaxGroups {
		u.Groups = u.Groups[:MaxGroups]
	}
	in.User = &u
}

// IsAdminBinding reports whether the binding carries the admins' label as
// Ichor writes it (the webhook's objectSelector and the manager's cache select
// the same).
func IsAdminBinding(b *rbacv1.ClusterRoleBinding) bool {
	return b != nil && b.Labels[credentials.LabelAdminBinding] == "true"
}
