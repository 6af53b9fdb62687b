package kubeletclient

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
	"github.com/ichor-dev/ichor-policy/internal/facts/accessreview"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// The subresources of certificatesigningrequests whose "create" permission
// authorizes a kubelet client request, as kube-controller-manager's approver
// asks for them: they exist only as RBAC names, never as API endpoints.
const (
	SubresourceSelfNodeClient = "selfnodeclient"
	SubresourceNodeClient     = "nodeclient"
)

// authorization makes both SubjectAccessReviews as the requester, always
// both: which one matters is the rule's to say. A failed call is not an
// answer, so it is an error (the request is retried), never a fact.
func (r *Reconciler) authorization(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (csrinput.KubeletAuthorization, error) {
	self, err := r.review(ctx, csr, SubresourceSelfNodeClient)
	if err != nil {
		return csrinput.KubeletAuthorization{}, err
	}
	node, err := r.review(ctx, csr, SubresourceNodeClient)
	if err != nil {
		return csrinput.KubeletAuthorization{}, err
	}
	return csrinput.KubeletAuthorization{SelfNodeClient: self, NodeClient: node}, nil
}

// review asks whether the requester, exactly as the API server recorded them
// on the request (user, uid, groups, extra), may create the subresource.
func (r *Reconciler) review(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, subresource string) (csrinput.AccessReview, error) {
	attrs := ReviewAttributes(subresource)
	var extra map[string][]string
	if csr.Spec.Extra != nil {
		extra = make(map[string][]string, len(csr.Spec.Extra))
		for k, v := range csr.Spec.Extra {
			extra[k] = v
		}
	}
	user := accessreview.User{Name: csr.Spec.Username, UID: csr.Spec.UID, Groups: csr.Spec.Groups, Extra: extra}
	got, err := accessreview.Ask(ctx, r.Client, user, attrs)
	if err != nil {
		return csrinput.AccessReview{}, fmt.Errorf("SubjectAccessReview create certificatesigningrequests/%s as %q: %w", subresource, csr.Spec.Username, err)
	}
	return ReviewFact(attrs, got.Status), nil
}

// ReviewAttributes are what the approver asks of a kubelet client request's
// requester: create on the subresource of certificatesigningrequests.
// `ichor policy check-client-csr` builds the same input offline.
func ReviewAttributes(subresource string) authorizationv1.ResourceAttributes {
	return authorizationv1.ResourceAttributes{
		// Any version, "*", as kube-controller-manager asks (v1.37.2's
		// sarapprove.go, recognizers): RBAC ignores it, and an authorizer
		// webhook, or one whose match conditions test the version, sees the
		// very attributes it would have seen from kube-controller-manager.
		// 220fc8d dropped it on a wrong reading of that source (review 158).
		Group:       certificatesv1.GroupName,
		Version:     "*",
		Resource:    "certificatesigningrequests",
		Subresource: subresource,
		Verb:        "create",
	}
}

// ReviewFact is the rule's fact of a review: what was asked and the
// authorizer's answer as it gave it.
func ReviewFact(attrs authorizationv1.ResourceAttributes, answer authorizationv1.SubjectAccessReviewStatus) csrinput.AccessReview {
	return csrinput.AccessReview{
		Verb:            attrs.Verb,
		Group:           attrs.Group,
		Version:         attrs.Version,
		Resource:        attrs.Resource,
		Subresource:     attrs.Subresource,
		Allowed:         answer.Allowed,
		Denied:          answer.Denied,
		Reason:          answer.Reason,
		EvaluationError: answer.EvaluationError,
	}
}

// machineFor finds the managed machine answering to node name node (its
// status.nodeName or, before that is known, its spec.hostname, as a kubelet
// bootstraps before its Node exists) whose cluster is this API server's: a
// TalosCluster that exists, has no spec.kubeconfigRef and that the operator
// named as a judge of this API server (LocalClusters). A machine of a
// cluster judged in another API server is another node, however it is named,
// and node names such as worker-1 recur from cluster to cluster; a machine of
// a cluster the operator did not name vouches for nothing here. Nor does a
// machine being deleted (another controller's finalizer may hold it): the
// operator is taking that node away (review 225 F3). Nor does a machine
// for its hostname once its recorded node name is another: the index
// (machines.IndexNodeName) holds both names, which suits the kubelet-serving
// approver (it reads the node's name from Talos and compares), but a
// bootstrap request in a name the machine never joined as asks for a node
// identity it never had (review 225 F3).
func (r *Reconciler) machineFor(ctx context.Context, node string) (*ichorv1alpha1.TalosMachine, error) {
	return machines.Find(ctx, r.Client, node, func(m *ichorv1alpha1.TalosMachine) (bool, error) {
		if !m.DeletionTimestamp.IsZero() || (m.Status.NodeName != "" && m.Status.NodeName != node) {
			return false, nil
		}
		return r.localCluster(ctx, m.Namespace, m.Spec.ClusterName)
	})
}

// localCluster reports whether the named TalosCluster exists and judges the
// API server this controller runs against: no kubeconfigRef, named by the
// operator, and not being deleted (judgesHere).
func (r *Reconciler) localCluster(ctx context.Context, namespace, name string) (bool, error) {
	var cluster ichorv1alpha1.TalosCluster
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get cluster %s/%s: %w", namespace, name, err)
	}
	return r.judgesHere(&cluster), nil
}

// judgesHere says whether the cluster's machines are this API server's nodes
// for this approver: it judges the API server, and it is not being deleted,
// which is the operator's word that Ichor stop managing it, as the kubelet
// serving approver holds (review 224 F2). Not in LocalClusters.Judges: the
// issuer would refuse a deleting cluster's credentials as not local.
func (r *Reconciler) judgesHere(c *ichorv1alpha1.TalosCluster) bool {
	return c.DeletionTimestamp.IsZero() && r.LocalClusters.Judges(c)
}
