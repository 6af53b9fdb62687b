package harness

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// NodeRoleBindingName binds the group system:nodes to the built-in
// ClusterRole system:node.
const NodeRoleBindingName = "ichor-harness:nodes"

// NodesGroup is the group every kubelet's credential carries.
const NodesGroup = "system:nodes"

// bindNodeRole gives every node what the Node authorizer would (it does not run
// here): the built-in system:node role, which lets a kubelet create CSRs and
// create and update its Node. Unlike the Node authorizer it does not confine a
// node to its own objects, which tests of a compromised node may rely on.
// Start waits until the authorizer has seen the binding, so the first kubelet
// is not refused.
func (e *Env) bindNodeRole(ctx context.Context) error {
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: NodeRoleBindingName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: NodesGroup}},
	}

	if _, err := e.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("bind %s to system:node: %w", NodesGroup, err)
	}

	review := &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:node:ichor-harness-probe",
			Groups: []string{NodesGroup, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group:    certificatesv1.GroupName,
				Resource: "certificatesigningrequests",
				Verb:     "create",
			},
		},
	}

	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		got, err := e.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}

		return got.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("wait for RBAC to let %s create CSRs: %w", NodesGroup, err)
	}

	return nil
}
