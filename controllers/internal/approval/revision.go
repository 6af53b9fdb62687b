package approval

import (
	"context"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// revisioner is a decider that says which policy bundle is active (the
// engine).
type revisioner interface{ Revision() string }

// ActiveRevision is the revision of the bundle decider serves, or "" when it
// does not say (then a verdict lasts as long as the facts it was reached on).
// A verdict remembered under one revision is reached again under another:
// an operator's new bundle judges the requests left pending by the last one.
func ActiveRevision(decider any) string {
	if r, ok := decider.(revisioner); ok {
		return r.Revision()
	}
	return ""
}

// Rebundle wakes a controller's undecided requests when another bundle is
// activated, so that their verdicts, remembered under the last one, are
// reached again at once rather than at each one's next look (a resync, a
// recheck, or none at all for a request waiting for a machine).
type Rebundle struct {
	mu   sync.Mutex
	last string
	// woken holds at most one wake not yet taken, which stands for any
	// number of activations: the requests are listed when it is taken.
	woken chan event.TypedGenericEvent[string]
}

// NewRebundle is a Rebundle that knows decider's bundle as the one in
// service: only another one wakes.
func NewRebundle(decider any) *Rebundle {
	return &Rebundle{last: ActiveRevision(decider), woken: make(chan event.TypedGenericEvent[string], 1)}
}

// Activated tells of the bundle now in service (every activation attempt
// that succeeded, the same bundle polled again included); another revision
// than the last wakes the controller. Never blocks. Does nothing on a nil
// Rebundle (a Reconciler never set up).
func (b *Rebundle) Activated(revision string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	changed := revision != "" && revision != b.last
	if changed {
		b.last = revision
	}
	b.mu.Unlock()
	if !changed {
		return
	}
	select {
	case b.woken <- event.TypedGenericEvent[string]{Object: revision}:
	default:
	}
}

// Source enqueues, at each wake, what requests lists then.
func (b *Rebundle) Source(requests func(context.Context) []reconcile.Request) source.TypedSource[reconcile.Request] {
	return source.Channel(b.woken, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
		return requests(ctx)
	}))
}
