package bench

import (
	"context"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// RubberStamp approves every kubelet-serving CSR without looking at it: no
// machine lookup, no Talos read, no policy, no Event, no log line. It is the
// fastest a controller can get approvals through this API server, the
// ceiling the Ichor manager is measured against. Never run it anywhere else.
type RubberStamp struct {
	Client    client.Client
	Clientset kubernetes.Interface
}

// SetupWithManager registers it, keyed by CSR, with workers reconciles at
// a time.
func (r *RubberStamp) SetupWithManager(mgr ctrl.Manager, workers int) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("rubberstamp").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			csr, ok := o.(*certificatesv1.CertificateSigningRequest)
			return ok && csr.Spec.SignerName == certificatesv1.KubeletServingSignerName
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}

// Reconcile approves the request unless it is decided already.
func (r *RubberStamp) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var csr certificatesv1.CertificateSigningRequest
	if err := r.Client.Get(ctx, req.NamespacedName, &csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return reconcile.Result{}, nil
		}
	}
	now := metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "RubberStamp", Message: "approved without any check (benchmark baseline)",
		LastUpdateTime: now, LastTransitionTime: now,
	})
	_, err := r.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, &csr, metav1.UpdateOptions{})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("approve %s: %w", csr.Name, err)
	}
	return reconcile.Result{}, nil
}
