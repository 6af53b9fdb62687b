package approval

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

type fixedRevision string

func (f fixedRevision) Revision() string { return string(f) }

// Another bundle wakes the controller once; the bundle in service polled
// again, an empty revision or any number of activations before the wake is
// taken do not add wakes (the requests are listed when it is taken).
func TestOnlyAnotherBundleWakesAndWakesAreCoalesced(t *testing.T) {
	b := NewRebundle(fixedRevision("r1"))
	woken := func() int {
		n := 0
		for {
			select {
			case <-b.woken:
				n++
			default:
				return n
			}
		}
	}
	b.Activated("r1")
	b.Activated("")
	assert.Zero(t, woken(), "the bundle in service, polled again")

	b.Activated("r2")
	b.Activated("r3")
	b.Activated("r2")
	assert.Equal(t, 1, woken(), "three activations before the wake is taken")
	b.Activated("r2")
	assert.Zero(t, woken(), "r2 is in service")
	b.Activated("r1")
	assert.Equal(t, 1, woken(), "back to r1 is another bundle")

	var unset *Rebundle
	assert.NotPanics(t, func() { unset.Activated("r4") }, "a controller not set up")
	assert.Equal(t, "", ActiveRevision(struct{}{}), "a decider that does not say")
}

// A wake told before the controller started is delivered once it starts, and
// the requests are listed when it is taken, not when it was told: those made
// meanwhile are woken too.
func TestAWakeBeforeTheStartIsDeliveredAndListsThen(t *testing.T) {
	b := NewRebundle(fixedRevision("r1"))
	var mu sync.Mutex
	pending := []string{"a"}
	src := b.Source(func(context.Context) []reconcile.Request {
		mu.Lock()
		defer mu.Unlock()
		var out []reconcile.Request
		for _, n := range pending {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		}
		return out
	})
	b.Activated("r2")
	mu.Lock()
	pending = append(pending, "b")
	mu.Unlock()

	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	require.NoError(t, src.Start(t.Context(), q))
	require.Eventually(t, func() bool { return q.Len() == 2 }, 10*time.Second, 10*time.Millisecond)
	got := map[string]bool{}
	for range 2 {
		item, _ := q.Get()
		got[item.Name] = true
		q.Done(item)
	}
	assert.Equal(t, map[string]bool{"a": true, "b": true}, got)
}
