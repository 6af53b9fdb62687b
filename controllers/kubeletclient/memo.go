package kubeletclient

import (
	"slices"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ichor-dev/ichor-policy/engine"
)

// memoEntry is what is remembered of one undecided request.
type memoEntry struct {
	name string
	node string
	// resourceVersion is the version the verdict was reached on; any change
	// to the object is worth a new look.
	resourceVersion string
	// approved is set once this controller approved that version, until the
	// cache shows the approval: a stale read must not approve twice.
	approved bool
	// epoch is the machine epoch the verdict was reached in.
	epoch uint64
	// key is the pending verdict (its codes), to tell a new verdict (logged
	// at Info, backoff reset) from the same one again.
	key      string
	attempts int
	next     time.Time
}

// verdictMemo keeps the verdicts on undecided requests, keyed by UID, so that
// a request is decided again only when it, or the machines, changed, or its
// re-check is due.
type verdictMemo struct {
	mu sync.Mutex
	m  map[types.UID]*memoEntry
}

// skip reports whether the request needs no new decision yet, and when it
// does (zero: only when something changes).
func (v *verdictMemo) skip(csr *certificatesv1.CertificateSigningRequest, epoch uint64, now time.Time) (time.Duration, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.m[csr.UID]
	if !ok || e.resourceVersion != csr.ResourceVersion {
		return 0, false
	}
	if e.approved {
		// Approved at this version; the update event brings the next one.
		return 0, true
	}
	if e.epoch != epoch || !now.Before(e.next) {
		return 0, false
	}
	return e.next.Sub(now), true
}

// pending remembers a pending verdict. It reports whether the verdict is new
// for the request (worth an Info log) and when to decide again: initial, then
// doubling on each further pending verdict, up to limit. A new verdict starts
// the backoff again.
func (v *verdictMemo) pending(csr *certificatesv1.CertificateSigningRequest, node string, epoch uint64, d engine.CSRDecision, now time.Time, initial, limit time.Duration) (bool, time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[types.UID]*memoEntry{}
	}
	key := d.Action + ":" + strings.Join(d.Codes(), ",")
	e, ok := v.m[csr.UID]
	first := !ok || e.key != key
	if first {
		e = &memoEntry{key: key}
		v.m[csr.UID] = e
	}
	e.name, e.node, e.resourceVersion, e.epoch, e.approved = csr.Name, node, csr.ResourceVersion, epoch, false
	wait := initial
	for i := 0; i < e.attempts && wait < limit; i++ {
		wait *= 2
	}
	wait = min(wait, limit)
	e.attempts++
	e.next = now.Add(wait)
	return first, wait
}

// approved remembers that this controller approved the request's version.
func (v *verdictMemo) approved(csr *certificatesv1.CertificateSigningRequest, node string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[types.UID]*memoEntry{}
	}
	v.m[csr.UID] = &memoEntry{name: csr.Name, node: node, resourceVersion: csr.ResourceVersion, approved: true}
}

func (v *verdictMemo) forget(uid types.UID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.m, uid)
}

// forgetName forgets a request that no longer exists, known by name only.
func (v *verdictMemo) forgetName(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for uid, e := range v.m {
		if e.name == name {
			delete(v.m, uid)
		}
	}
}

// pendingFor is the pending requests for any of the node names, or every
// pending request when none is given.
func (v *verdictMemo) pendingFor(nodes ...string) []reconcile.Request {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []reconcile.Request
	for _, e := range v.m {
		if e.approved {
			continue
		}
		if len(nodes) == 0 || (e.node != "" && slices.Contains(nodes, e.node)) {
			out = append(out, requestFor(e.name))
		}
	}
	return out
}

// epoch counts changes of the facts machine lookups depend on.
type epoch struct {
	mu   sync.Mutex
	n    uint64
	seen map[types.UID]string
}

// note records the lookup-relevant state of an object and reports whether it
// changed, bumping the epoch when it did. A deleted object is seen with its
// last state, so deletion counts as no change: losing a machine cannot turn a
// pending request into an approved one.
func (e *epoch) note(uid types.UID, state string) bool {
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

func (e *epoch) get() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}
