package kubeletserving

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// addsSeen is the controller's queue, with each add and its wait seen.
type addsSeen struct {
	reconcileQueue
	adds []timedAdd
}

type timedAdd struct {
	cluster string
	wait    time.Duration
}

func (q *addsSeen) Add(r reconcile.Request) { q.adds = append(q.adds, timedAdd{r.Name, 0}) }
func (q *addsSeen) AddAfter(r reconcile.Request, d time.Duration) {
	q.adds = append(q.adds, timedAdd{r.Name, d})
}

// A machine's status write that changes nothing decisions read (its
// recorded certificate) reconciles its cluster recordSettle later, so that
// a burst of records brings a reconcile about once a second; a machine that
// appears, goes, answers to another name, moves its Talos API or moves to
// another cluster reconciles at once (both clusters, if it moved), and every
// event is counted for the flood counts.
func TestARecordedCertificateReconcilesItsClusterALittleLater(t *testing.T) {
	r := &Reconciler{}
	h := machineEvents{r: r}
	ctx := context.Background()
	machine := func(cluster, node, endpoint, certRequest string) *ichorv1alpha1.TalosMachine {
		m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID("uid-m")}}
		m.Spec.ClusterName, m.Spec.Endpoint, m.Status.NodeName = cluster, endpoint, node
		if certRequest != "" {
			m.Status.KubeletServingCertificate = &ichorv1alpha1.KubeletServingCertificateStatus{Request: certRequest}
		}
		return m
	}
	queue := func() *addsSeen {
		return &addsSeen{reconcileQueue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())}
	}

	q := queue()
	first := machine("a", "n1", "10.0.0.1", "")
	h.Create(ctx, event.CreateEvent{Object: first}, q)
	assert.Equal(t, []timedAdd{{"a", 0}}, q.adds, "a new machine")

	for _, tc := range []struct {
		name string
		new  *ichorv1alpha1.TalosMachine
		want []timedAdd
	}{
		{"a certificate recorded", machine("a", "n1", "10.0.0.1", "csr-1"), []timedAdd{{"a", recordSettle}, {"a", recordSettle}}},
		{"another name", machine("a", "n2", "10.0.0.1", "csr-1"), []timedAdd{{"a", 0}, {"a", 0}}},
		{"its Talos API moved", machine("a", "n2", "10.0.0.2", "csr-1"), []timedAdd{{"a", 0}, {"a", 0}}},
		{"another certificate recorded", machine("a", "n2", "10.0.0.2", "csr-2"), []timedAdd{{"a", recordSettle}, {"a", recordSettle}}},
		{"moved to another cluster", machine("b", "n2", "10.0.0.2", "csr-2"), []timedAdd{{"a", 0}, {"b", 0}}},
	} {
		q := queue()
		before := r.machineEvents.Load()
		h.Update(ctx, event.UpdateEvent{ObjectOld: first, ObjectNew: tc.new}, q)
		assert.Equal(t, tc.want, q.adds, tc.name)
		assert.Equal(t, before+1, r.machineEvents.Load(), "%s: not counted", tc.name)
		first = tc.new
	}

	q = queue()
	h.Delete(ctx, event.DeleteEvent{Object: first}, q)
	assert.Equal(t, []timedAdd{{"b", 0}}, q.adds, "a machine gone")
	assert.Equal(t, uint64(1), r.machinesDeleted.Load())
}
