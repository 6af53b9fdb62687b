package manualact

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/ichor-dev/ichor-policy/engine"
)

// A record's Event stored by a write whose answer was lost is not written
// again by the next try, keys or none: without keys no mark is looked for
// first, and each such retry wrote the record twice (review 248 F8). An
// Event under the record's name that is not this record's (another
// decision) leaves the record to a generated name, as before.
func TestARecordsEventStoredByATimedOutWriteIsNotWrittenAgain(t *testing.T) {
	ctx := context.Background()
	binding := adasBinding()
	regarding := BindingReference(binding)
	rec := engine.ManualRecord{Action: "revoke", DecisionID: "d-1", Reasons: engine.Reasons{{Code: "AdminRevoked", Message: "revoked"}}}
	records := func(t *testing.T, c client.Client) []corev1.Event {
		t.Helper()
		var events corev1.EventList
		require.NoError(t, c.List(ctx, &events, client.InNamespace(EventNamespace)))
		return events.Items
	}

	t.Run("its own, stored", func(t *testing.T) {
		var lost atomic.Bool
		c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := c.Create(ctx, obj, opts...); err != nil {
				return err
			}
			if !lost.Swap(true) {
				return apierrors.NewTimeoutError("injected: stored, and the answer lost", 1)
			}
			return nil
		}}).Build()
		r := &Recorder{Reader: c, Client: c}
		require.Error(t, r.event(ctx, nil, regarding, "revoke", rec), "the first try's answer is lost")
		require.NoError(t, r.event(ctx, nil, regarding, "revoke", rec), "the next try finds the record written")
		got := records(t, c)
		require.Len(t, got, 1, "one record Event")
		assert.Equal(t, EventName(binding.UID), got[0].Name)
	})

	t.Run("another decision's under its name", func(t *testing.T) {
		other := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: EventNamespace, Name: EventName(binding.UID),
			Annotations: map[string]string{AnnotationDecisionID: "d-other", AnnotationObjectUID: string(binding.UID), AnnotationAct: "revoke"}}}
		c := fake.NewClientBuilder().WithObjects(other).Build()
		r := &Recorder{Reader: c, Client: c}
		require.NoError(t, r.event(ctx, nil, regarding, "revoke", rec))
		got := records(t, c)
		require.Len(t, got, 2, "the record is written beside the other")
		var ids []string
		for _, ev := range got {
			ids = append(ids, ev.Annotations[AnnotationDecisionID])
		}
		assert.ElementsMatch(t, []string{"d-other", "d-1"}, ids)
	})
}
