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

// remoteLimits bounds what the cache of a tenant's API server keeps: its
// CSRs, and about the memory they take (cost). A tenant's server is
// whatever the tenant runs (review 28 H1): it can list or send any number
// of CSRs, each as large as client-go decodes (16 MiB), and the cache would
// keep them all in the manager, which every tenant shares. The cache sees
// nothing but what its list and its watch bring, so these are counted on
// their way in: a list (all its pages) that holds more is refused, and a
// watch that would bring more ends with an error; client-go then lists
// again, which is refused while the server holds more. The cluster's
// watch stops being current, its start fails (the TalosCluster's
// condition says why), and no other cluster is touched.
type remoteLimits struct {
	maxCSRs  int
	maxBytes int64
	cluster  types.NamespacedName
	// exceeded keeps the last limit exceeded, for the error of a start
	// whose cache did not sync because of it.
	exceeded *atomic.Pointer[error]
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
	return toolscache.NewSharedIndexInformer(&toolscache.ListWatch{
		ListWithContextFunc:  c.list,
		WatchFuncWithContext: c.watch,
	}, obj, resync, indexers)
}

// countedCSRs is what the cache holds, as its list and watch brought it:
// each CSR's cost by the key the cache keeps it under (its name: a server
// can send many names under one UID, review 30 H1).
type countedCSRs struct {
	limits remoteLimits
	inner  toolscache.ListerWatcherWithContext

	mu    sync.Mutex
	sizes map[string]int64
	bytes int64
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

// reset forgets what was counted: a new list, or a watch that sends every
// CSR again (client-go's watch list), replaces what the cache holds.
func (c *countedCSRs) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sizes, c.bytes = map[string]int64{}, 0
}

// put counts a CSR added or changed, and says when the cache would then
// hold more than the limits.
func (c *countedCSRs) put(csr *certificatesv1.CertificateSigningRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sizes == nil {
		c.sizes = map[string]int64{}
	}
	key, size := csr.Name, cost(csr)
	c.bytes += size - c.sizes[key]
	c.sizes[key] = size
	var err error
	switch {
	case len(c.sizes) > c.limits.maxCSRs:
		err = fmt.Errorf("the API server of cluster %s holds more than %d CSRs, the most the manager keeps of a tenant's server", c.limits.cluster, c.limits.maxCSRs)
	case c.bytes > c.limits.maxBytes:
		err = fmt.Errorf("the CSRs of the API server of cluster %s are more than %d bytes, the most the manager keeps of a tenant's server", c.limits.cluster, c.limits.maxBytes)
	}
	if err != nil && c.limits.exceeded != nil {
		c.limits.exceeded.Store(&err)
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

func (c *countedCSRs) remove(csr *certificatesv1.CertificateSigningRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes -= c.sizes[csr.Name]
	delete(c.sizes, csr.Name)
}

func (c *countedCSRs) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	list, err := c.inner.ListWithContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	if opts.Continue == "" {
		// The first page of a list: the cache will hold what it brings.
		c.reset()
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	for _, item := range items {
		csr, ok := item.(*certificatesv1.CertificateSigningRequest)
		if !ok {
			return nil, fmt.Errorf("the API server of cluster %s listed a %T among its CSRs", c.limits.cluster, item)
		}
		if err := c.put(csr); err != nil {
			return nil, err
		}
	}
	return list, nil
}

func (c *countedCSRs) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := c.inner.WatchWithContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		c.reset()
	}
	return newCountingWatch(w, c), nil
}

// countingWatch passes a watch's events through, counting each CSR on its
// way into the cache, and ends it with an error event past the limits.
// apimachinery's watch.Filter would do, but its goroutine waits forever to
// hand over an event once the reader has stopped (after any error event,
// ours included), with that event (review 30 M1).
type countingWatch struct {
	inner  watch.Interface
	counts *countedCSRs
	result chan watch.Event
	done   chan struct{}
	stop   sync.Once
}

func newCountingWatch(inner watch.Interface, counts *countedCSRs) *countingWatch {
	w := &countingWatch{inner: inner, counts: counts, result: make(chan watch.Event), done: make(chan struct{})}
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
		return e // a bookmark or an error: client-go reads it
	}
	switch e.Type {
	case watch.Added, watch.Modified:
		if err := w.counts.put(csr); err != nil {
			// Counted as if kept: the list that follows counts afresh.
			return watch.Event{Type: watch.Error, Object: &metav1.Status{
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonRequestEntityTooLarge, Code: 413, Message: err.Error(),
			}}
		}
	case watch.Deleted:
		w.counts.remove(csr)
	}
	return e
}
