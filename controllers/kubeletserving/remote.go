package kubeletserving

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// ReasonKubeconfigRefUnsupported is the reason of a False
// KubeletServingCertificates condition on a cluster whose CSRs live in
// another API server: this controller judges only the API server it runs
// against, and says so rather than approving nothing silently.
const ReasonKubeconfigRefUnsupported = "KubeconfigRefUnsupported"

func (r *Reconciler) refuseRemote(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) error {
	before := cluster.DeepCopy()
	meta.SetStatusCondition(&cluster.Status.Conditions, metav1.Condition{
		Type:               ichorv1alpha1.ConditionKubeletServingCertificates,
		Status:             metav1.ConditionFalse,
		Reason:             ReasonKubeconfigRefUnsupported,
		Message:            "spec.kubeconfigRef is set, but this manager approves kubelet serving certificates only in the API server it runs against; run a manager in the target cluster",
		ObservedGeneration: cluster.Generation,
	})
	if !statusChanged(before.Status, cluster.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, cluster, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("update cluster conditions: %w", err)
	}
	return nil
}
