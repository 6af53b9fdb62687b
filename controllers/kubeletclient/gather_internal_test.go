package kubeletclient

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/ichor-dev/ichor-policy/internal/kube"
)

// The SubjectAccessReviews are asked as the requester exactly as the API
// server recorded them on the request: user, UID, groups and every extra
// key and value, odd ones included, as kube-controller-manager's approver
// asks. RBAC reads none of UID and extra, so the real API server of the
// other tests would not see one dropped; an authorizer webhook would
// (review 62, F2).
func TestTheReviewsAreAskedAsTheRequesterWhole(t *testing.T) {
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	var asked []authorizationv1.SubjectAccessReviewSpec
	c := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if review, ok := obj.(*authorizationv1.SubjectAccessReview); ok {
				asked = append(asked, review.Spec)
				review.Status.Allowed = review.Spec.ResourceAttributes.Subresource == SubresourceNodeClient
				return nil
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	extra := map[string]certificatesv1.ExtraValue{
		"a/b.c":                 {"x", "y"},
		"X-Upper":               {"v"},
		"empty":                 {},
		"authentication.k8s.io": {"credential-id=JTI=1"},
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-c", UID: "uid-c"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: SignerName, Username: "system:bootstrap:abcdef", UID: "requester-uid",
			Groups: []string{"system:bootstrappers", "system:bootstrappers:nodes", "system:authenticated"}, Extra: extra,
		},
	}
	r := &Reconciler{Client: c}
	got, err := r.authorization(t.Context(), csr)
	require.NoError(t, err)
	assert.False(t, got.SelfNodeClient.Allowed)
	assert.True(t, got.NodeClient.Allowed, "each answer is its own review's")

	require.Len(t, asked, 2)
	want := map[string]authorizationv1.ExtraValue{}
	for k, v := range extra {
		want[k] = authorizationv1.ExtraValue(v)
	}
	for i, subresource := range []string{SubresourceSelfNodeClient, SubresourceNodeClient} {
		assert.Equal(t, authorizationv1.SubjectAccessReviewSpec{
			User: csr.Spec.Username, UID: csr.Spec.UID, Groups: csr.Spec.Groups, Extra: want,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: "certificates.k8s.io", Version: "*", Resource: "certificatesigningrequests", Subresource: subresource, Verb: "create",
			},
		}, asked[i])
	}
}
