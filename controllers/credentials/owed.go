package credentials

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
)

// recordRetry is how soon an applied record the engine refused (its file
// sink full, say) is tried again.
const recordRetry = 5 * time.Second

// maxUncertain bounds the answers of unknown outcome kept for one request:
// an API server that answers every write with a timeout has the request
// decided again at each retry, and only one answer can be stored.
const maxUncertain = 16

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
	// uncertain is owed only if the request's Ready condition names the
	// decision: the answer may not have been stored. warn is the Warning
	// Event of such an answer, written once it is seen stored.
	uncertain bool
	warn      *warning
}

func (o *owedRecords) add(key types.NamespacedName, rec owedRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[types.NamespacedName][]owedRecord{}
	}
	owed := o.m[key]
	if rec.uncertain {
		// The oldest uncertain answer goes first: the newest, decided on
		// the latest version, is the likeliest stored.
		n := 0
		for _, e := range owed {
			if e.uncertain {
				n++
			}
		}
		if n >= maxUncertain {
			i := slices.IndexFunc(owed, func(e owedRecord) bool { return e.uncertain })
			owed = slices.Delete(owed, i, i+1)
		}
	}
	o.m[key] = append(owed, rec)
}

func (o *owedRecords) take(key types.NamespacedName) []owedRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	owed := o.m[key]
	delete(o.m, key)
	return owed
}

// owes reports whether a record is owed on the request uid of key: its
// answer may be stored, or is, where the cache may not show it yet.
func (o *owedRecords) owes(key types.NamespacedName, uid types.UID) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.ContainsFunc(o.m[key], func(e owedRecord) bool { return e.uid == uid })
}

// names reports whether the condition names the decision id, as the
// issuer ends every answer's message.
func names(ready *metav1.Condition, id string) bool {
	return ready != nil && strings.HasSuffix(ready.Message, "(decision "+id+")")
}

// recordOwed makes the records owed on the request key, tcr as read now
// (nil when it is gone): those in effect (refused before), whatever became
// of their request; and of an answer of unknown outcome on tcr, the one its
// Ready condition names, with its Warning Event. One of unknown outcome is
// kept while tcr shows no answer yet, and dropped when tcr shows another or
// is not its request (gone, or made again: whether it was stored, and read,
// before cannot be known now). One refused again is kept, and the result
// asks for another look after recordRetry.
func (r *Reconciler) recordOwed(ctx context.Context, key types.NamespacedName, tcr *ichorv1alpha1.TalosCredentialRequest) reconcile.Result {
	var uid types.UID
	var ready *metav1.Condition
	if tcr != nil {
		uid = tcr.UID
		ready = meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady)
	}
	var result reconcile.Result
	for _, o := range r.owed.take(key) {
		if o.uncertain {
			switch {
			case o.uid == uid && ready == nil:
				r.owed.add(key, o)
				continue
			case o.uid != uid:
				log.FromContext(ctx).Info("an answer of unknown outcome is not recorded as applied: its request is gone", "decision_id", o.record.DecisionID, "uid", o.uid)
				continue
			case !names(ready, o.record.DecisionID):
				log.FromContext(ctx).V(1).Info("an answer of unknown outcome was not stored: another is the request's", "decision_id", o.record.DecisionID)
				continue
			}
			if o.warn != nil && r.Recorder != nil {
				r.Recorder.Eventf(tcr, nil, corev1.EventTypeWarning, o.warn.reason, o.warn.action, "%s", o.warn.note)
			}
			o.uncertain, o.warn = false, nil
		}
		if err := r.Engine.RecordApplied(ctx, o.record); err != nil {
			log.FromContext(ctx).Error(err, "record the applied decision; tried again", "decision_id", o.record.DecisionID, "retry_in", recordRetry)
			r.owed.add(key, o)
			result.RequeueAfter = recordRetry
		}
	}
	return result
}
