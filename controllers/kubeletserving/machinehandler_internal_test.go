package kubeletserving

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// A machine's status write that leaves its epoch as it was (its recorded
// certificate) reconciles its cluster recordSettle later, so that a burst of
// records brings a reconcile about once a second; a machine that appears,
// goes, answers to another node name or hostname, or moves its Talos API
// reconciles it at once, and starts a new machine epoch (what the flood
// counts' judged node names are kept on).
func TestARecordedCertificateReconcilesItsClusterALittleLater(t *testing.T) {
	r := &Reconciler{}
	h := machineHandler{r: r}
	ctx := context.Background()
	machine := func(node, hostname, endpoint, certRequest string) *ichorv1alpha1.TalosMachine {
		m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID("uid-m")}}
		m.Spec.ClusterName, m.Spec.Hostname, m.Spec.Endpoint, m.Status.NodeName = "a", hostname, endpoint, node
		if certRequest != "" {
			m.Status.KubeletServingCertificate = &ichorv1alpha1.KubeletServingCertificateStatus{Request: certRequest}
		}
		return m
	}
	// The queue's Add and AddAfter are seen, and nothing else is called.
	queue := func() *addsSeen { return &addsSeen{} }

	q := queue()
	last := machine("n1", "h1", "10.0.0.1", "")
	epoch := r.machineEpoch.Get()
	h.Create(ctx, event.CreateEvent{Object: last}, q)
	assert.Equal(t, []timedAdd{{"a", 0}}, q.adds, "a new machine")
	assert.NotEqual(t, epoch, r.machineEpoch.Get(), "a new machine started no epoch")

	for _, tc := range []struct {
		name string
		new  *ichorv1alpha1.TalosMachine
		wait time.Duration
	}{
		{"a certificate recorded", machine("n1", "h1", "10.0.0.1", "csr-1"), recordSettle},
		{"another node name", machine("n2", "h1", "10.0.0.1", "csr-1"), 0},
		{"another hostname", machine("n2", "h2", "10.0.0.1", "csr-1"), 0},
		{"its Talos API moved", machine("n2", "h2", "10.0.0.2", "csr-1"), 0},
		{"another certificate recorded", machine("n2", "h2", "10.0.0.2", "csr-2"), recordSettle},
		{"its certificate gone", machine("n2", "h2", "10.0.0.2", ""), recordSettle},
	} {
		q := queue()
		before := r.machineEpoch.Get()
		h.Update(ctx, event.UpdateEvent{ObjectOld: last, ObjectNew: tc.new}, q)
		assert.Equal(t, []timedAdd{{"a", tc.wait}}, q.adds, tc.name)
		assert.Equal(t, tc.wait == 0, r.machineEpoch.Get() != before, "%s: a new epoch or not", tc.name)
		last = tc.new
	}

	q = queue()
	epoch = r.machineEpoch.Get()
	h.Delete(ctx, event.DeleteEvent{Object: last}, q)
	assert.Equal(t, []timedAdd{{"a", 0}}, q.adds, "a machine gone")
	assert.Equal(t, uint64(1), r.machinesDeleted.Load())
	assert.Equal(t, epoch, r.machineEpoch.Get(), "a deletion changed the epoch")
	assert.True(t, r.noteMachine(last), "a deleted machine is still remembered")

	// A machine deleted and made again under its name while the watch was
	// down comes as an update from the informer's relist: the old one is
	// gone, and counted so.
	r = &Reconciler{}
	h = machineHandler{r: r}
	old := machine("n1", "h1", "10.0.0.1", "")
	h.Create(ctx, event.CreateEvent{Object: old}, queue())
	replaced := machine("n1", "h1", "10.0.0.1", "")
	replaced.UID, replaced.Spec.ClusterName = "uid-m-again", "b"
	q = queue()
	h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: replaced}, q)
	assert.Equal(t, []timedAdd{{"a", 0}, {"b", 0}}, q.adds, "a machine made again, in another cluster")
	assert.Equal(t, uint64(1), r.machinesDeleted.Load(), "the machine replaced was not counted as deleted")
	assert.False(t, r.noteMachine(replaced), "the new machine is not remembered")
	assert.True(t, r.noteMachine(old), "the machine replaced is still remembered")
}
