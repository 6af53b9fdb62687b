package approval

import (
	"slices"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/engine"
)

// UncertainWriteMaxAge is how long a write answered with an error that may
// have been applied (UnknownOutcome) is taken to be able to commit still,
// while its request stays at the version the write was made on: an API
// server gives a request up after its request timeout (a minute by
// default), and a proposal etcd has not committed by then is dropped.
const UncertainWriteMaxAge = 5 * time.Minute

// Uncertain are the requests, by key K, whose verdict written by an
// approver may be in effect without its applied record in the decision log:
// a write answered with an error that may have been applied all the same,
// or may yet be (UnknownOutcome), or a verdict whose record the decision
// log refused. The approver's next look at such a request records the
// verdict its condition names (DecisionOf) as observed. It is not the memo
// of failures: a request whose handling failed otherwise has nothing to
// record again, and a write the API server refused (a conflict, a 403, a
// 422) was not applied.
type Uncertain[K comparable] struct {
	mu  sync.Mutex
	gen uint64
	m   map[K]UncertainWrite
}

// UncertainWrite is what is known of a request's uncertain verdict.
type UncertainWrite struct {
	// ResourceVersion is the version a write of unknown outcome was made
	// on; "" for a verdict written whose record failed.
	ResourceVersion string
	// At is when it became uncertain.
	At time.Time
	// Settle, if not nil, is called once the verdict is recorded, cannot
	// be in effect, or is left to nobody (SettleAct).
	Settle func()
	// Record, if not nil, is the record owed of a verdict known to be in
	// effect (its write succeeded, and its record was refused): it is
	// owed whatever becomes of the request afterwards.
	Record *engine.Applied
	// Written are the verdicts of writes of unknown outcome made since the
	// request was last settled, as their records would be (Outcome
	// AppliedWritten): the condition found later is recorded as one of
	// them only if it names it (Observed). Two writes in a row may both
	// time out, and the first commit (After keeps the earlier ones).
	Written []engine.Applied

	// gen orders the additions (Generation).
	gen uint64
}

// Observed is the record of the verdict the request's condition names, once
// a write of unknown outcome was made: the write's own verdict when the
// condition names its decision and action, as seen rather than written.
// A condition that names another decision was written by someone else (a
// person, another approver, or a tenant's API server, which may answer a
// write with an error and write a condition naming any decision id it has
// seen): nothing of this approver's is recorded of it (review of
// 2026-12-05). Without Written (a write made before it was kept), the
// condition's decision, as before.
func (w UncertainWrite) Observed(csr *certificatesv1.CertificateSigningRequest) (engine.Applied, bool) {
	d, named := DecisionOf(csr)
	if !named {
		return engine.Applied{}, false
	}
	written := len(w.Written) == 0 || slices.ContainsFunc(w.Written, func(a engine.Applied) bool {
		return a.DecisionID == d.ID && a.Action == d.Action
	})
	if !written {
		return engine.Applied{}, false
	}
	return engine.Applied{DecisionID: d.ID, Object: "csr/" + csr.Name, UID: string(csr.UID), Action: d.Action, Outcome: engine.AppliedObserved}, true
}

// After is this write of unknown outcome, made after earlier (if any),
// which may still commit: the verdicts written by both are kept.
// The newest maxWritten are kept: a request written again and again with
// the same unknown outcome (a tenant's server answering every write with a
// 504) is written at most every few minutes by then, and a write older
// than UncertainWriteMaxAge can no longer commit.
func (w UncertainWrite) After(earlier UncertainWrite, hadEarlier bool) UncertainWrite {
	if hadEarlier {
		w.Written = append(slices.Clone(earlier.Written), w.Written...)
	}
	if len(w.Written) > maxWritten {
		w.Written = slices.Clone(w.Written[len(w.Written)-maxWritten:])
	}
	return w
}

// maxWritten bounds UncertainWrite.Written.
const maxWritten = 16

// SettleAct calls Settle, if any.
func (w UncertainWrite) SettleAct() {
	if w.Settle != nil {
		w.Settle()
	}
}

// CannotCommit reports whether a write of unknown outcome can no longer
// commit, its request found undecided at version resourceVersion at now:
// it was made on another version (the API server refuses it on this one),
// or long enough ago that no API server is still at it.
func (w UncertainWrite) CannotCommit(resourceVersion string, now time.Time) bool {
	return w.ResourceVersion == "" || resourceVersion != w.ResourceVersion || now.Sub(w.At) >= UncertainWriteMaxAge
}

// Add makes k uncertain with w, replacing what was known of it.
func (u *Uncertain[K]) Add(k K, w UncertainWrite) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[K]UncertainWrite{}
	}
	u.gen++
	w.gen = u.gen
	u.m[k] = w
}

// Get is what is known of k, if it is uncertain.
func (u *Uncertain[K]) Get(k K) (UncertainWrite, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	w, ok := u.m[k]
	return w, ok
}

// Has reports whether k is uncertain.
func (u *Uncertain[K]) Has(k K) bool {
	_, ok := u.Get(k)
	return ok
}

// Take forgets k and returns what was known of it, at once: of callers
// taking the same k, one is told ok.
func (u *Uncertain[K]) Take(k K) (UncertainWrite, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	w, ok := u.m[k]
	delete(u.m, k)
	return w, ok
}

// Generation is the count of additions so far: ForgetIf with it spares
// what is added after (a request made after a list that is taken for gone).
func (u *Uncertain[K]) Generation() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gen
}

// ForgetIf forgets every key drop reports true for that was added at or
// before generation upTo, and returns what was known of them.
func (u *Uncertain[K]) ForgetIf(drop func(K) bool, upTo uint64) map[K]UncertainWrite {
	u.mu.Lock()
	defer u.mu.Unlock()
	dropped := map[K]UncertainWrite{}
	for k, w := range u.m {
		if w.gen <= upTo && drop(k) {
			delete(u.m, k)
			dropped[k] = w
		}
	}
	return dropped
}
