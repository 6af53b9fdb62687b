package harness

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// heldFinalizer is the finalizer DeleteTalosClusterHeld holds a cluster by,
// standing for another controller's.
const heldFinalizer = "example.com/hold"

// DeleteTalosClusterHeld deletes the TalosCluster while a finalizer of
// another controller keeps it, so that it stays, being deleted, until the
// test ends, which releases it. The finalizer is added on the cluster as it
// is (the manager patches its status meanwhile).
func (e *Env) DeleteTalosClusterHeld(t testing.TB, key types.NamespacedName) {
	t.Helper()
	ctx := t.Context()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var c ichorv1alpha1.TalosCluster
		if err := e.Client.Get(ctx, key, &c); err != nil {
			return err
		}
		c.Finalizers = append(c.Finalizers, heldFinalizer)
		return e.Client.Update(ctx, &c)
	})
	if err != nil {
		t.Fatalf("hold TalosCluster %s: %v", key, err)
	}
	t.Cleanup(func() {
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var c ichorv1alpha1.TalosCluster
			if err := e.Client.Get(context.Background(), key, &c); err != nil {
				return client.IgnoreNotFound(err)
			}
			c.Finalizers = nil
			return e.Client.Update(context.Background(), &c)
		})
	})
	if err := e.Client.Delete(ctx, &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
		t.Fatalf("delete TalosCluster %s: %v", key, err)
	}
}
