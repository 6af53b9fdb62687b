package credentials

import (
	"context"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ichor-dev/ichor-policy/engine"
)

// recordRetry is how soon an applied record the engine refused (its file
// sink full, say) is tried again.
const recordRetry = 5 * time.Second

// owedRecords are the applied records this issuer owes, by request: one the
// engine refused, of an answer stored (the decision is in effect), and one
// of an answer whose write had an unknown outcome and could not be read
// back stored or not (review 226 F3), owed once the request's Ready
// condition names its decision. Before, a retry that found the answer
// stored went on to its expiry, and a delivered credential had no applied
// record; a refused record was logged and forgotten. Kept until recorded,
// or until the request shows another decision or is gone; a restart
// forgets them (docs/decision-log.md).
type owedRecords struct {
	mu sync.Mutex
	m  map[types.NamespacedName][]owedRecord
}

type owedRecord struct {
	uid    types.UID
	record engine.Applied
	// ifNamed is owed only if the request's Ready condition names the
	// decision: the answer may not have been stored.
	ifNamed bool
}

func (o *owedRecords) add(key types.NamespacedName, rec owedRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[types.NamespacedName][]owedRecord{}
	}
	o.m[key] = append(o.m[key], rec)
}

func (o *owedRecords) take(key types.NamespacedName) []owedRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	owed := o.m[key]
	delete(o.m, key)
	return owed
}

// names reports whether the condition names the decision id, as the
// issuer writes it in every answer's message.
func names(ready *metav1.Condition, id string) bool {
	return ready != nil && strings.Contains(ready.Message, "(decision "+id+")")
}

// recordOwed makes the records owed on the request key: of the request uid
// answered as ready says, those in effect (refused before, or of the
// decision ready names); of a request gone or made again (uid empty, or
// another), those refused before, whose answer was stored, whatever became
// of it. A record owed only if named and not named is dropped: another
// answer is the one stored. One refused again is kept, and the result asks
// for another look after recordRetry.
func (r *Reconciler) recordOwed(ctx context.Context, key types.NamespacedName, uid types.UID, ready *metav1.Condition) reconcile.Result {
	var result reconcile.Result
	for _, o := range r.owed.take(key) {
		switch {
		case o.uid == uid && o.ifNamed && !names(ready, o.record.DecisionID):
			log.FromContext(ctx).V(1).Info("an answer of unknown outcome was not stored: another is the request's", "decision_id", o.record.DecisionID)
			continue
		case o.uid != uid && o.ifNamed:
			log.FromContext(ctx).Info("an answer of unknown outcome is not recorded as applied: its request is gone", "decision_id", o.record.DecisionID, "uid", o.uid)
			continue
		}
		if err := r.Engine.RecordApplied(ctx, o.record); err != nil {
			log.FromContext(ctx).Error(err, "record the applied decision; tried again", "decision_id", o.record.DecisionID, "retry_in", recordRetry)
			o.ifNamed = false
			r.owed.add(key, o)
			result.RequeueAfter = recordRetry
		}
	}
	return result
}
