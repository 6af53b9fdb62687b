package kubeletserving

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// remoteLimits bounds what the caches of a tenant's API servers keep: their
// CSRs, and about the memory they take (cost). A tenant's server is
// whatever the tenant runs (review 28 H1): it can list or send any number
// of CSRs, each as large as client-go decodes (16 MiB), and the cache would
// keep them all in the manager, which every tenant shares. The cache sees
// nothing but what its list and its watch bring, so these are counted on
// their way in: a list (all its pages) that holds more is refused, and a
// watch that would bring more ends with an error; client-go then lists (or
// watch-lists) again, which is refused while the server holds more. The cluster's
// watch stops being current. A start that crosses them fails, and one that
// crosses them later is stopped (see exceededAfterStart): either way the
// TalosCluster's condition says why, and no other tenant is touched.
//
// The limits hold for each tenant (the clusters with a kubeconfigRef in one
// namespace) as a whole, and so for each of its clusters: a tenant that
// made a hundred clusters would otherwise be kept a hundred times over.
type remoteLimits struct {
	maxCSRs  int
	maxBytes int64
	cluster  types.NamespacedName
	// tenant is what the caches of the cluster's tenant hold together;
	// nil counts the cluster alone.
	tenant *tenantUsage
	// caches are the counts of this cluster's caches, given back to the
	// tenant when its watch ends (release).
	caches *countedSet
	// exceeded keeps the last limit exceeded, for the error of a start
	// whose cache did not sync because of it.
	exceeded *atomic.Pointer[error]
	// afterStart is told of every limit crossed once the start is over:
	// client-go would list again and again, each list refused, and keep
	// the cache as it last was, so that the cluster's new requests would
	// go unseen with nothing said (the manager's log aside).
	afterStart *atomic.Pointer[func(error)]
}

// exceededAfterStart has f told of each limit crossed from now on.
func (l remoteLimits) exceededAfterStart(f func(error)) {
	if l.afterStart != nil {
		l.afterStart.Store(&f)
	}
}

// newInformer is the cache's informer constructor (cache.Options.NewInformer)
// with the limits around its list and watch.
func (l remoteLimits) newInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	if l.maxCSRs <= 0 {
		l.maxCSRs = DefaultTenantMaxCSRs
	}
	if l.maxBytes <= 0 {
		l.maxBytes = DefaultTenantMaxCSRBytes
	}
	c := &countedCSRs{limits: l, inner: toolscache.ToListerWatcherWithContext(lw)}
	if l.caches != nil {
		l.caches.add(c)
	}
	return toolscache.NewSharedIndexInformer(&toolscache.ListWatch{
		ListWithContextFunc:  c.list,
		WatchFuncWithContext: c.watch,
	}, obj, resync, indexers)
}

// release gives what the cluster's caches counted back to its tenant: its
// watch has ended, and what they held with it.
func (l remoteLimits) release() {
	if l.caches != nil {
		l.caches.release()
	}
}

// tenantUsage is what the caches of one tenant's API servers hold together.
type tenantUsage struct {
	mu    sync.Mutex
	csrs  int
	bytes int64
	// holders counts the tenant's watches that may still count here
	// (targets.mu guards it).
	holders int
}

// add counts csrs and bytes more (or fewer) and returns the totals.
func (u *tenantUsage) add(csrs int, bytes int64) (int, int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.csrs += csrs
	u.bytes += bytes
	return u.csrs, u.bytes
}

// countedSet is the counts of one cluster's caches.
type countedSet struct {
	mu       sync.Mutex
	counted  []*countedCSRs
	released bool
}

func (s *countedSet) add(c *countedCSRs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		c.release()
	}
	s.counted = append(s.counted, c)
}

func (s *countedSet) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = true
	for _, c := range s.counted {
		c.release()
	}
}

// countedCSRs is what the cache holds, as its list and watch brought it:
// each CSR's cost by the key the cache keeps it under (its name: a server
// can send many names under one UID, review 30 H1).
type countedCSRs struct {
	limits remoteLimits
	inner  toolscache.ListerWatcherWithContext

	mu sync.Mutex
	// held is what the cache holds.
	held tally
	// listing is what the list under way brought so far (nil when none):
	// it replaces held once all its pages are in, and a list refused
	// leaves held as it was, as client-go leaves its cache.
	listing *tally
	// released: the cache has ended, and its counts were given back to
	// the tenant; nothing more is counted.
	released bool
}

// tally is a set of CSRs by name, with their costs.
type tally struct {
	sizes map[string]int64
	bytes int64
}

// set counts name at size, and says how many CSRs and bytes that adds.
func (t *tally) set(name string, size int64) (int, int64) {
	if t.sizes == nil {
		t.sizes = map[string]int64{}
	}
	old, had := t.sizes[name]
	t.sizes[name] = size
	t.bytes += size - old
	if had {
		return 0, size - old
	}
	return 1, size
}

// unset forgets name, and says how many CSRs and bytes that took away.
func (t *tally) unset(name string) (int, int64) {
	size, had := t.sizes[name]
	if !had {
		return 0, 0
	}
	delete(t.sizes, name)
	t.bytes -= size
	return 1, size
}

// tenantAdd counts a change of this cache in its tenant's totals and
// returns them; counting alone (no tenant), the totals are the cache's.
// Called with c.mu held.
func (c *countedCSRs) tenantAdd(csrs int, bytes int64) (int, int64) {
	if c.limits.tenant == nil {
		n, b := len(c.held.sizes), c.held.bytes
		if c.listing != nil {
			n, b = n+len(c.listing.sizes), b+c.listing.bytes
		}
		return n, b
	}
	return c.limits.tenant.add(csrs, bytes)
}

// release gives what the cache counted back to the tenant.
func (c *countedCSRs) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	c.dropListing()
	c.tenantAdd(-len(c.held.sizes), -c.held.bytes)
	c.held = tally{}
}

// cost is what a CSR takes in memory, about: its protobuf size, and the
// header of each string of its lists and maps, which protobuf writes in two
// bytes and Go holds in sixteen (review 30 L1: 32M empty groups).
func cost(csr *certificatesv1.CertificateSigningRequest) int64 {
	strs := len(csr.Spec.Groups) + len(csr.Spec.Usages) + len(csr.Spec.Extra) + len(csr.Status.Conditions)*4 +
		len(csr.Labels)*2 + len(csr.Annotations)*2 + len(csr.Finalizers) + len(csr.OwnerReferences)*5
	for _, values := range csr.Spec.Extra {
		strs += len(values)
	}
	return int64(csr.Size()) + 16*int64(strs)
}

// told tells whoever watches the limits that one was crossed (outside the
// counts' lock), and returns the crossing.
func (c *countedCSRs) told(err error) error {
	if c.limits.exceeded != nil {
		c.limits.exceeded.Store(&err)
	}
	if c.limits.afterStart != nil {
		if f := c.limits.afterStart.Load(); f != nil {
			(*f)(err)
		}
	}
	return err
}

// why is the last limit exceeded, if one was.
func (l remoteLimits) why() error {
	if l.exceeded == nil {
		return nil
	}
	if err := l.exceeded.Load(); err != nil {
		return *err
	}
	return nil
}

// put counts a CSR a watch adds or changes, and says when the cache would
// then hold more than the limits: the event is not passed on, so the CSR
// is not counted.
func (c *countedCSRs) put(csr *certificatesv1.CertificateSigningRequest) error {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return nil
	}
	if err := c.admissible(csr); err != nil {
		c.mu.Unlock()
		return c.told(err)
	}
	before, had := c.held.sizes[csr.Name]
	n, b := c.held.set(csr.Name, cost(csr))
	csrs, bytes := c.tenantAdd(n, b)
	err := c.crossed(&c.held, csrs, bytes)
	if err != nil {
		c.held.unset(csr.Name)
		if had {
			c.held.set(csr.Name, before)
		}
		c.tenantAdd(-n, -b)
	}
	c.mu.Unlock()
	if err != nil {
		return c.told(err)
	}
	return nil
}

// admissible refuses a CSR in a namespace: CSRs have none, and the cache
// would keep one of each namespace under a name counted once.
func (c *countedCSRs) admissible(csr *certificatesv1.CertificateSigningRequest) error {
	if csr.Namespace != "" {
		return fmt.Errorf("the API server of cluster %s sent the CSR %q in namespace %q: CSRs have none", c.limits.cluster, csr.Name, csr.Namespace)
	}
	return nil
}

// crossed says which limit, if any, a cache's tally t or its tenant's
// totals are past. Called with c.mu held.
func (c *countedCSRs) crossed(t *tally, tenantCSRs int, tenantBytes int64) error {
	csrs := fmt.Sprintf("%d CSRs", c.limits.maxCSRs)
	bytes := fmt.Sprintf("%d bytes", c.limits.maxBytes)
	if c.limits.maxBytes%(1<<20) == 0 {
		bytes = fmt.Sprintf("%d MiB", c.limits.maxBytes>>20)
	}
	const most = "the most the manager keeps of a tenant's servers: "
	switch {
	case len(t.sizes) > c.limits.maxCSRs:
		return fmt.Errorf("the API server of cluster %s holds more than %s (%s--tenant-max-csrs)", c.limits.cluster, csrs, most)
	case t.bytes > c.limits.maxBytes:
		return fmt.Errorf("the CSRs of the API server of cluster %s are more than %s (%s--tenant-max-csr-mib)", c.limits.cluster, bytes, most)
	case tenantCSRs > c.limits.maxCSRs:
		return fmt.Errorf("the API servers of the clusters of namespace %s hold more than %s together (%s--tenant-max-csrs)", c.limits.cluster.Namespace, csrs, most)
	case tenantBytes > c.limits.maxBytes:
		return fmt.Errorf("the CSRs of the API servers of the clusters of namespace %s are more than %s together (%s--tenant-max-csr-mib)", c.limits.cluster.Namespace, bytes, most)
	}
	return nil
}

func (c *countedCSRs) remove(csr *certificatesv1.CertificateSigningRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	n, b := c.held.unset(csr.Name)
	c.tenantAdd(-n, -b)
}

// removeListed forgets a CSR a watch list's first events brought.
func (c *countedCSRs) removeListed(csr *certificatesv1.CertificateSigningRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listing == nil {
		return
	}
	n, b := c.listing.unset(csr.Name)
	c.tenantAdd(-n, -b)
}

// list counts a list's pages as they come. What the list brings replaces
// what the cache held once its last page is in; until then both are
// counted in the tenant's totals, but a list is weighed without what it
// replaces.
func (c *countedCSRs) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if opts.Continue == "" {
		c.beginListing()
	}
	list, err := c.inner.ListWithContext(ctx, opts)
	if err != nil {
		// A list broken off: the cache keeps what it held.
		c.endListing(false)
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		c.endListing(false)
		return nil, err
	}
	listed, err := meta.ListAccessor(list)
	if err != nil {
		c.endListing(false)
		return nil, err
	}
	for _, item := range items {
		csr, ok := item.(*certificatesv1.CertificateSigningRequest)
		if !ok {
			c.endListing(false)
			return nil, fmt.Errorf("the API server of cluster %s listed a %T among its CSRs", c.limits.cluster, item)
		}
		if err := c.putListed(csr, true); err != nil {
			return nil, err
		}
	}
	if listed.GetContinue() == "" {
		c.endListing(true)
	}
	return list, nil
}

// beginListing starts the count of a list, or of a watch that sends every
// CSR first (client-go's watch list).
func (c *countedCSRs) beginListing() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropListing()
	if !c.released {
		c.listing = &tally{}
	}
}

// putListed counts a CSR a list (or a watch list's first events) brings,
// weighed without what the list replaces. Past the limits the list is
// refused, and forgotten. A list's pages are kept whole until the last
// (client-go's pager appends them), so a CSR listed twice (fresh pages of
// the same few) is refused, not counted once: once is all a real server
// lists it.
func (c *countedCSRs) putListed(csr *certificatesv1.CertificateSigningRequest, paged bool) error {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return nil
	}
	if c.listing == nil {
		// A page of a list begun before this cache's time, or after
		// its list was refused: counted as a first.
		c.listing = &tally{}
	}
	err := c.admissible(csr)
	if _, twice := c.listing.sizes[csr.Name]; err == nil && paged && twice {
		err = fmt.Errorf("the API server of cluster %s listed the CSR %q twice", c.limits.cluster, csr.Name)
	}
	if err == nil {
		n, b := c.listing.set(csr.Name, cost(csr))
		csrs, bytes := c.tenantAdd(n, b)
		err = c.crossed(c.listing, csrs-len(c.held.sizes), bytes-c.held.bytes)
	}
	if err != nil {
		c.dropListing()
	}
	c.mu.Unlock()
	if err != nil {
		return c.told(err)
	}
	return nil
}

// endListing ends the count of a list: what it brought is what the cache
// now holds (done), or it is forgotten and the cache holds what it held.
func (c *countedCSRs) endListing(done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listing == nil {
		return
	}
	if !done {
		c.dropListing()
		return
	}
	c.tenantAdd(-len(c.held.sizes), -c.held.bytes)
	c.held, c.listing = *c.listing, nil
}

// dropListing forgets a list under way. Called with c.mu held.
func (c *countedCSRs) dropListing() {
	if c.listing == nil {
		return
	}
	c.tenantAdd(-len(c.listing.sizes), -c.listing.bytes)
	c.listing = nil
}

func (c *countedCSRs) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := c.inner.WatchWithContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	if initial {
		// Every CSR first, then a bookmark: counted as a list is, and
		// what the cache holds until then is kept, as client-go keeps it.
		c.beginListing()
	}
	return newCountingWatch(w, c, initial), nil
}

// countingWatch passes a watch's events through, counting each CSR on its
// way into the cache, and ends it with an error event past the limits.
// apimachinery's watch.Filter would do, but its goroutine waits forever to
// hand over an event once the reader has stopped (after any error event,
// ours included), with that event (review 30 M1).
type countingWatch struct {
	inner  watch.Interface
	counts *countedCSRs
	// initial: the watch sends every CSR first, until the bookmark that
	// ends them (loop's goroutine only).
	initial bool
	result  chan watch.Event
	done    chan struct{}
	stop    sync.Once
}

func newCountingWatch(inner watch.Interface, counts *countedCSRs, initial bool) *countingWatch {
	w := &countingWatch{inner: inner, counts: counts, initial: initial, result: make(chan watch.Event), done: make(chan struct{})}
	go w.loop()
	return w
}

func (w *countingWatch) ResultChan() <-chan watch.Event { return w.result }

func (w *countingWatch) Stop() {
	w.stop.Do(func() { close(w.done) })
	w.inner.Stop()
}

func (w *countingWatch) loop() {
	defer close(w.result)
	defer func() {
		if w.initial {
			// Ended before all its first events came: the cache keeps
			// what it held.
			w.counts.endListing(false)
		}
	}()
	for {
		var e watch.Event
		select {
		case <-w.done:
			return
		case got, ok := <-w.inner.ResultChan():
			if !ok {
				return
			}
			e = w.count(got)
		}
		select {
		case <-w.done:
			return
		case w.result <- e:
		}
	}
}

// count counts a CSR an event brings or takes away; past the limits the
// event is an error, which ends the watch.
func (w *countingWatch) count(e watch.Event) watch.Event {
	csr, ok := e.Object.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return e // an error: client-go reads it
	}
	put, remove := w.counts.put, w.counts.remove
	if w.initial {
		// The watch list's first events go to a store of their own,
		// which keeps one of each name, as the cache does.
		put = func(csr *certificatesv1.CertificateSigningRequest) error { return w.counts.putListed(csr, false) }
		remove = w.counts.removeListed
	}
	switch e.Type {
	case watch.Bookmark:
		if w.initial && csr.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
			w.initial = false
			w.counts.endListing(true)
		}
	case watch.Added, watch.Modified:
		if err := put(csr); err != nil {
			// Not passed on, so not counted: the cache keeps what it
			// held, and the watch ends.
			return watch.Event{Type: watch.Error, Object: &metav1.Status{
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonRequestEntityTooLarge, Code: 413, Message: err.Error(),
			}}
		}
	case watch.Deleted:
		remove(csr)
	}
	return e
}
