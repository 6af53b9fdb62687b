package approval

import (
	"sync"
	"time"
)

// Verdict is what a remembered verdict was reached on, and what it was.
type Verdict struct {
	// ResourceVersion is the request's version: any change to the request is
	// worth a new look.
	ResourceVersion string
	// Epoch is the machines' epoch (Epoch.Get).
	Epoch uint64
	// Revision is the policy bundle's revision the verdict was reached
	// under (ActiveRevision): another bundle may decide otherwise.
	Revision string
	// Key tells one verdict from another (its codes): a new verdict is worth
	// a log line or an Event and starts the backoff again; the same one is
	// not.
	Key string
}

// WithKey is the verdict key reached on v's facts.
func (v Verdict) WithKey(key string) Verdict {
	v.Key = key
	return v
}

// Memo remembers verdicts by key K (a request's UID, or a cluster and a UID),
// with data V of the caller's, so that a request nothing changed is not
// decided, logged and written again in a loop: only once it, the machines or
// the bundle change, or when its wait is over.
type Memo[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]*entry[V]
	// gen orders the entries' writes (Generation).
	gen uint64
}

type entry[V any] struct {
	verdict  Verdict
	data     V
	attempts int
	// next is when to decide again; zero: only on a change.
	next time.Time
	// decided is when the verdict was reached.
	decided time.Time
	// applied is set once the verdict was written at this version, until
	// the cache shows it: a stale read must not write twice.
	applied bool
	// gen is the Memo's generation when the entry was last written.
	gen uint64
}

// Skip reports whether the request, at version resourceVersion in epoch and
// under bundle revision, needs no new decision yet, and how long until it
// does (zero: only on a change).
func (m *Memo[K, V]) Skip(k K, resourceVersion string, epoch uint64, revision string, now time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[k]
	switch {
	case !ok:
		return 0, false
	case e.applied:
		// Written; the update event brings the decided version. An
		// undecided copy of any version is stale (the API server never
		// removes an Approved or Denied condition): the version written
		// may be newer than the one decided on (a relabel's conflict
		// re-read), so it is not compared.
		return 0, true
	case e.verdict.ResourceVersion != resourceVersion:
		return 0, false
	case e.verdict.Epoch != epoch || e.verdict.Revision != revision:
		return 0, false
	case e.next.IsZero():
		return 0, true
	case now.Before(e.next):
		return e.next.Sub(now), true
	}
	return 0, false
}

// Pending remembers a verdict that was not written and says whether it is
// new for the request and how long to wait before deciding again: wait is
// given the number of earlier attempts at the same verdict (a new verdict
// starts from none) and returns zero to wait for a change only.
func (m *Memo[K, V]) Pending(k K, v Verdict, data V, now time.Time, wait func(attempts int) time.Duration) (first bool, after time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[K]*entry[V]{}
	}
	e, ok := m.m[k]
	first = !ok || e.applied || e.verdict.Key != v.Key
	if first {
		e = &entry[V]{}
		m.m[k] = e
	}
	m.gen++
	e.verdict, e.data, e.decided, e.gen = v, data, now, m.gen
	after = wait(e.attempts)
	e.attempts++
	e.next = time.Time{}
	if after > 0 {
		e.next = now.Add(after)
	}
	return first, after
}

// Applied remembers that the verdict on the request's version was written.
func (m *Memo[K, V]) Applied(k K, resourceVersion string, data V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[K]*entry[V]{}
	}
	m.gen++
	m.m[k] = &entry[V]{verdict: Verdict{ResourceVersion: resourceVersion}, data: data, applied: true, gen: m.gen}
}

// Generation is the count of writes so far: ForgetIf with it spares what is
// written after (a request made after a list that is taken for gone).
func (m *Memo[K, V]) Generation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// Hold keeps a pending verdict for another wait, and reports true, when the
// request is at the same version, epoch and revision, its verdict is v.Key
// and was reached less than maxAge ago: nothing new to decide on.
func (m *Memo[K, V]) Hold(k K, v Verdict, maxAge, wait time.Duration, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[k]
	if !ok || e.applied || e.verdict != v || now.Sub(e.decided) >= maxAge {
		return false
	}
	e.next = now.Add(wait)
	return true
}

// Verdict is the verdict remembered of k, if any, written or not.
func (m *Memo[K, V]) Verdict(k K) (Verdict, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[k]
	if !ok {
		return Verdict{}, false
	}
	return e.verdict, true
}

// Has reports whether anything is remembered of k.
func (m *Memo[K, V]) Has(k K) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.m[k]
	return ok
}

// Take forgets k and reports whether anything was remembered of it, at
// once: of callers taking the same k, one is told true.
func (m *Memo[K, V]) Take(k K) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.m[k]
	delete(m.m, k)
	return ok
}

// Forget forgets k.
func (m *Memo[K, V]) Forget(k K) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, k)
}

// ForgetIf forgets every key drop reports true for that was written at or
// before generation upTo (math.MaxUint64: whenever).
func (m *Memo[K, V]) ForgetIf(drop func(K, V) bool, upTo uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.m {
		if e.gen <= upTo && drop(k, e.data) {
			delete(m.m, k)
		}
	}
}

// Waiting is the data of every verdict not written that keep accepts.
func (m *Memo[K, V]) Waiting(keep func(V) bool) []V {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []V
	for _, e := range m.m {
		if !e.applied && keep(e.data) {
			out = append(out, e.data)
		}
	}
	return out
}
