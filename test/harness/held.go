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

// heldFinalizer is the finalizer DeleteHeld holds an object by, standing
// for another controller's.
const heldFinalizer = "example.com/hold"

// DeleteTalosClusterHeld is DeleteHeld of the TalosCluster named key.
func (e *Env) DeleteTalosClusterHeld(t testing.TB, key types.NamespacedName) {
	t.Helper()
	e.DeleteHeld(t, &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
}

// DeleteHeld deletes the object named as obj is (of its kind) while a
// finalizer of another controller keeps it, so that it stays, being
// deleted, until the test ends, which releases it. The finalizer is added
// on the object as it is (the manager may write its status meanwhile).
func (e *Env) DeleteHeld(t testing.TB, obj client.Object) {
	t.Helper()
	ctx := t.Context()
	key := client.ObjectKeyFromObject(obj)
	fresh := func() client.Object { return obj.DeepCopyObject().(client.Object) }
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o := fresh()
		if err := e.Client.Get(ctx, key, o); err != nil {
			return err
		}
		o.SetFinalizers(append(o.GetFinalizers(), heldFinalizer))
		return e.Client.Update(ctx, o)
	})
	if err != nil {
		t.Fatalf("hold %T %s: %v", obj, key, err)
	}
	t.Cleanup(func() {
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o := fresh()
			if err := e.Client.Get(context.Background(), key, o); err != nil {
				return client.IgnoreNotFound(err)
			}
			o.SetFinalizers(nil)
			return e.Client.Update(context.Background(), o)
		})
	})
	if err := e.Client.Delete(ctx, fresh()); err != nil {
		t.Fatalf("delete %T %s: %v", obj, key, err)
	}
}
