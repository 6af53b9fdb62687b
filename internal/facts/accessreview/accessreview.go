// Package accessreview asks the authorizer whether a user, exactly as the API
// server recorded them (name, uid, groups and extra), may do something. It is
// the SubjectAccessReview the kubelet client approver makes as a CSR's
// requester, and the credential webhook and issuer make as a
// TalosCredentialRequest's: its answer is a fact the rules decide on.
package accessreview

import (
	"context"

	authorizationv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// User is who the review asks about.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Ask makes the review and returns it as sent, with the authorizer's answer
// in its status. An error is a review that could not be made (the caller
// retries or fails closed), never an answer.
func Ask(ctx context.Context, c client.Client, u User, attrs authorizationv1.ResourceAttributes) (*authorizationv1.SubjectAccessReview, error) {
	var extra map[string]authorizationv1.ExtraValue
	if u.Extra != nil {
		extra = make(map[string]authorizationv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               u.Name,
		UID:                u.UID,
		Groups:             u.Groups,
		Extra:              extra,
		ResourceAttributes: &attrs,
	}}
	if err := c.Create(ctx, sar); err != nil {
		return nil, err
	}
	return sar, nil
}
