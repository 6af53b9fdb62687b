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
// changed, which starts a new epoch. A deleted object is noted with its last
// state, so a deletion is no change: losing a machine cannot turn a pending
// request into an approved one.
func (e *Epoch) Note(uid types.UID, state string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
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
