package manualact

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
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
	if c := addedVerdictCondition(csr, old); c != nil {
		facts.VerdictConditionSHA256 = ConditionDigest(*c)
	}
	in := engine.ManualActInput{Act: engine.ActCSRDecision, CertificateRequest: facts}
	seen(&in, user)
	return in
}

// addedVerdictCondition is the Approved or Denied condition, True, that csr
// holds and old (nil: none) did not hold, whole (before any bound), or nil.
func addedVerdictCondition(csr, old *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	for i, c := range csr.Status.Conditions {
		if c.Type != certificatesv1.CertificateApproved && c.Type != certificatesv1.CertificateDenied || c.Status != corev1.ConditionTrue {
			continue
		}
		if old == nil || !slices.ContainsFunc(old.Status.Conditions, func(o certificatesv1.CertificateSigningRequestCondition) bool { return o.Type == c.Type }) {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

// ConditionDigest is the hex sha256 of a verdict condition as written: its
// type, reason and message, as a JSON array, so that no field runs into
// another. Its status is True for every verdict, and its times the API
// server may fill in, so neither is part of it. The webhook binds each
// attempt to it, and the watch compares it with the condition stored
// (review 4, R4): a person is named only for the condition their own write
// added. Two people who write the same words (kubectl certificate approve
// writes one message for everyone) are not told apart by it; ichor approve
// writes the person's name into the message.
func ConditionDigest(c certificatesv1.CertificateSigningRequestCondition) string {
	fields, _ := json.Marshal([]string{string(c.Type), c.Reason, c.Message})
	sum := sha256.Sum256(fields)
	return hex.EncodeToString(sum[:])
}

// conditions are the request's conditions, at most MaxConditions: the
// Approved, Denied and Failed ones first (the first of each type), then the
// others in order until the bound. A person can write any number of
// conditions of their own before their verdict; cut in order, they would
// push the verdict out of the facts and the decision would go unrecorded
// (review 3, F1).
func conditions(csr *certificatesv1.CertificateSigningRequest) []engine.ManualCondition {
	out := make([]engine.ManualCondition, 0, min(len(csr.Status.Conditions), MaxConditions))
	kept := make([]bool, len(csr.Status.Conditions))
	for _, t := range verdictTypes {
		for i, c := range csr.Status.Conditions {
			if c.Type == t {
				out, kept[i] = append(out, condition(c)), true
				break
			}
		}
	}
	for i, c := range csr.Status.Conditions {
		if len(out) == MaxConditions {
			break
		}
		if !kept[i] {
			out = append(out, condition(c))
		}
	}
	return out
}

// verdictTypes are the conditions that say what became of a request, kept
// in the facts whatever else it holds.
var verdictTypes = []certificatesv1.RequestConditionType{
	certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed,
}

func condition(c certificatesv1.CertificateSigningRequestCondition) engine.ManualCondition {
	return engine.ManualCondition{Type: string(c.Type), Status: string(c.Status), Reason: c.Reason, Message: c.Message}
}

// BindingDeletion is the input of an admin binding's deletion, seen by the
// webhook with the admission's user, or by the watch (user nil). The
// identity is the one its name carries (credentials.AdminBindingIdentity),
// a fact; the username is the manager's annotation, a claim whoever made
// the binding may have written (review 3, F3).
func BindingDeletion(b *rbacv1.ClusterRoleBinding, user *authenticationv1.UserInfo) engine.ManualActInput {
	identity, _ := credentials.AdminBindingIdentity(b)
	in := engine.ManualActInput{Act: engine.ActAdminBindingDeletion, Binding: &engine.ManualBindingFacts{
		Name: b.Name, UID: string(b.UID),
		Username:  b.Annotations[credentials.AnnotationAdminUsername],
		Identity:  identity,
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

// IsAdminBinding reports whether the binding is one of Ichor's admin
// bindings, whose deletion is a revocation: labelled, named IDENTITY:NONCE
// and bound to cluster-admin (credentials.AdminBindingIdentity). The label
// alone, which the webhook's objectSelector and the manager's cache select
// on, anyone who may create bindings can write on a binding to a harmless
// role (review 3, F3).
func IsAdminBinding(b *rbacv1.ClusterRoleBinding) bool {
	if b == nil {
		return false
	}
	_, ok := credentials.AdminBindingIdentity(b)
	return ok
}
