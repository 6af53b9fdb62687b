package approval

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Epoch counts the changes of the facts a machine lookup depends on (which
// node names a machine answers to, its cluster, its endpoint). A verdict
// reached in one epoch holds until the next: one left pending because no
// machine has the node name is worth deciding again only after a change.
type Epoch struct {
	mu   sync.Mutex
	n    uint64
	seen map[types.UID]string
}

// Note records the lookup-relevant state of an object and reports whether it
// changed, which starts a new epoch.
func (e *Epoch) Note(uid types.UID, state string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.note(uid, state)
}

// Forget notes a deleted object's last state, as Note does, and then forgets
// the object: a deletion is no change of its own (losing a machine cannot
// turn a pending request into an approved one), and what was seen of
// deleted objects is not kept for the life of the process.
func (e *Epoch) Forget(uid types.UID, lastState string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	changed := e.note(uid, lastState)
	delete(e.seen, uid)
	return changed
}

// Drop forgets an object that no longer counts (a cluster that does not
// judge this API server), and reports, as a change, whether it counted
// until now. One that never counted changes nothing, however often it
// changes.
func (e *Epoch) Drop(uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.seen[uid]; !ok {
		return false
	}
	delete(e.seen, uid)
	e.n++
	return true
}

func (e *Epoch) note(uid types.UID, state string) bool {
	if e.seen == nil {
		e.seen = map[types.UID]string{}
	}
	if old, ok := e.seen[uid]; ok && old == state {
		return false
	}
	e.seen[uid] = state
	e.n++
	return true
}

// Get is the current epoch.
func (e *Epoch) Get() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}
