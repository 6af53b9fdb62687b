package kubeletserving

import (
	"sync"
	"time"
)

// uncertainWriteMaxAge is how long a write answered with an error that may
// have been applied (approval.UnknownOutcome) is taken to be able to commit
// still, while the request stays at the version it was made on: an API
// server gives up a request after its request timeout (a minute by
// default), and a proposal etcd has not committed by then is dropped.
const uncertainWriteMaxAge = 5 * time.Minute

// uncertain are the requests whose verdict written here may be in effect
// without its applied record: a write answered with an error that may have
// been applied all the same, or may yet be (approval.UnknownOutcome), or a
// verdict whose record the decision log refused. Their next look records
// the verdict the request's condition names (settle). It is not the
// failures memo: a decided request whose handling failed otherwise (its
// certificate could not be recorded on its machine) has nothing to record
// again, and taking every failure for a write recorded its verdict once more
// at each retry (review 14, M2); nor is a write the API server refused (a
// conflict, a 403, a 422) uncertain: it was not applied (review 15).
type uncertain struct {
	mu  sync.Mutex
	gen uint64
	m   map[memoKey]uncertainWrite
}

// uncertainWrite is what is known of a request's uncertain verdict.
type uncertainWrite struct {
	// resourceVersion is the version a write of unknown outcome was made
	// on; "" for a verdict written whose record failed.
	resourceVersion string
	// at is when it became uncertain.
	at time.Time
	// gen orders the additions: a pass forgets as gone only what was added
	// before it listed the requests (review 15, H1).
	gen uint64
	// settle settles its act on the shard's hold it was made under (nil
	// when the clusters are not shared out).
	settle func()
}

// settleAct says the act is settled on its hold: its verdict is recorded,
// or it cannot be in effect, or nothing is left to record of it.
func (w uncertainWrite) settleAct() {
	if w.settle != nil {
		w.settle()
	}
}

// cannotCommit reports whether a write of unknown outcome can no longer
// commit, its request found undecided at version resourceVersion at now:
// it was made on another version (the API server refuses it for that), or
// long enough ago that no API server is still at it.
func (w uncertainWrite) cannotCommit(resourceVersion string, now time.Time) bool {
	return w.resourceVersion == "" || resourceVersion != w.resourceVersion || now.Sub(w.at) >= uncertainWriteMaxAge
}

// add makes k uncertain with w, replacing what was known of it.
func (u *uncertain) add(k memoKey, w uncertainWrite) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[memoKey]uncertainWrite{}
	}
	u.gen++
	w.gen = u.gen
	u.m[k] = w
}

func (u *uncertain) get(k memoKey) (uncertainWrite, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	w, ok := u.m[k]
	return w, ok
}

func (u *uncertain) has(k memoKey) bool {
	_, ok := u.get(k)
	return ok
}

// take forgets k and returns what was known of it, at once: of callers
// taking the same k (the reconcile and a worker), one is told ok.
func (u *uncertain) take(k memoKey) (uncertainWrite, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	w, ok := u.m[k]
	delete(u.m, k)
	return w, ok
}

// generation is the count of additions so far: forgetIf with it spares
// what is added after.
func (u *uncertain) generation() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gen
}

// forgetIf forgets every key drop reports true for that was added at or
// before generation upTo, and returns what was known of them.
func (u *uncertain) forgetIf(drop func(memoKey, struct{}) bool, upTo uint64) []uncertainWrite {
	u.mu.Lock()
	defer u.mu.Unlock()
	var dropped []uncertainWrite
	for k, w := range u.m {
		if w.gen <= upTo && drop(k, struct{}{}) {
			delete(u.m, k)
			dropped = append(dropped, w)
		}
	}
	return dropped
}
