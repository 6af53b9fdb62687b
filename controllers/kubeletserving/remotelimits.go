package kubeletserving

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
)

// remoteLimits bounds what the caches of a tenant's API servers keep: their
// CSRs, and about the memory they take (cost). A tenant's server is
// whatever the tenant runs (review 28 H1): it can list or send any number
// of CSRs, each as large as client-go decodes (16 MiB), and the cache would
// keep them all in the manager, which every tenant shares. The cache sees
// nothing but what its list and its watch bring, so these are counted on
// their way in: a list (all its pages) that holds more is refused, and a
// watch that would bring more ends with an error; client-go then lists (or
// watch-lists) again, which is refused while the server holds more. The
// cluster's watch stops being current. A start that crosses them fails, and one that
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
	// exceeded keeps the last limit exceeded (or connection refused,
	// unreached), for the error of a start whose cache did not sync
	// because of it.
	exceeded *atomic.Pointer[error]
	// afterStart is told of every limit crossed once the start is over:
	// client-go would list again and again, each list refused, and keep
	// the cache as it last was, so that the cluster's new requests would
	// go unseen with nothing said (the manager's log aside).
	afterStart *atomic.Pointer[func(error)]
}

// exceededAfterStart has f told of each limit crossed from now on, and of
// each refusal of what no API server sends (countedCSRs.told).
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
// each CSR's cost by the key the cache keeps it under (its namespace and
// name: a server can send many names under one UID, review 30 H1, and one
// name in many namespaces, review 31 H1). A change is counted as the
// cache takes it: a CSR a watch brings before its event is handed over
// (to weigh it), taken back if it is not; a removal, and the end of a
// watch list's first events, once handed over (review 32 H3).
type countedCSRs struct {
	limits remoteLimits
	inner  toolscache.ListerWatcherWithContext

	mu sync.Mutex
	// held is what the cache holds (nil: nothing yet). A list that
	// replaces it replaces the pointer, so that a change counted in the
	// one it replaced is not taken back out of it (review 33 L1).
	held *tally
	// listing is what the list under way brought so far (nil when none):
	// it replaces held once all its pages are in, or a watch list's first
	// events once their bookmark is in. A list refused or broken off
	// leaves held as it was, as client-go leaves its cache.
	listing *tally
	// tenantCSRs and tenantBytes are what this cache adds to its tenant's
	// totals: the larger of held and listing, which is what it holds
	// once a list is in or given up.
	tenantCSRs  int
	tenantBytes int64
	// released: the cache has ended, and its counts were given back to
	// the tenant; nothing more is counted.
	released bool
	// failingSince is when a list or the start of a watch first failed
	// with none succeeding since (zero while the server answers), and
	// refusedSince when the failures became the server refusing the
	// manager's credential (401, 403), with no other failure since.
	failingSince, refusedSince time.Time
	// overdue is how long past the time it was asked for the server may
	// keep a watch open, and listFor how long a list's page may take;
	// zero: watchOverdue, listTimeout (set by the tests alone).
	overdue, listFor time.Duration
}

// How long past the time it was asked for a tenant's API server may keep a
// watch open, and how long a list's page may take, before it is given up:
// an API server ends a watch then, and a list of the most CSRs the manager
// keeps of a tenant (a few MiB) comes in seconds.
const (
	watchOverdue = time.Minute
	listTimeout  = 2 * time.Minute
)

// errOverdue ends a watch kept open past its time.
var errOverdue = errors.New("the watch was kept open past the time it was asked for")

// tally is a set of CSRs by the cache's key, with their costs.
type tally struct {
	sizes map[string]int64
	bytes int64
	// uids are the keys' UIDs, and owners the key each UID is held under:
	// one UID under two names is refused (admissible), as a request is
	// told from another by its UID (review 195 F1).
	uids   map[string]types.UID
	owners map[types.UID]string
}

// set counts key, of UID uid, at size, and returns what to call to undo it.
func (t *tally) set(key string, uid types.UID, size int64) (undo func()) {
	if t.sizes == nil {
		t.sizes, t.uids, t.owners = map[string]int64{}, map[string]types.UID{}, map[types.UID]string{}
	}
	old, had := t.sizes[key]
	oldUID, hadUID := t.uids[key]
	t.sizes[key] = size
	t.bytes += size - old
	t.release(key)
	t.uids[key], t.owners[uid] = uid, key
	return func() {
		t.bytes -= size - old
		t.release(key)
		if had {
			t.sizes[key] = old
		} else {
			delete(t.sizes, key)
		}
		if hadUID {
			t.uids[key], t.owners[oldUID] = oldUID, key
		}
	}
}

// unset forgets key.
func (t *tally) unset(key string) {
	if size, had := t.sizes[key]; had {
		delete(t.sizes, key)
		t.bytes -= size
	}
	t.release(key)
}

// release forgets key's UID.
func (t *tally) release(key string) {
	if uid, ok := t.uids[key]; ok {
		delete(t.uids, key)
		if t.owners[uid] == key {
			delete(t.owners, uid)
		}
	}
}

// heldElsewhere is the key other than key that holds uid, if any.
func (t *tally) heldElsewhere(uid types.UID, key string) (string, bool) {
	other, ok := t.owners[uid]
	return other, ok && other != key
}

// storeKey is the key the cache keeps a CSR under.
func storeKey(csr *certificatesv1.CertificateSigningRequest) string {
	return toolscache.MetaObjectToName(csr).String()
}

// settle brings this cache's share of its tenant's totals up to date and
// returns the totals; counting alone (no tenant), they are the share.
// Called with c.mu held.
func (c *countedCSRs) settle() (int, int64) {
	var csrs int
	var bytes int64
	if c.held != nil {
		csrs, bytes = len(c.held.sizes), c.held.bytes
	}
	if c.listing != nil {
		csrs, bytes = max(csrs, len(c.listing.sizes)), max(bytes, c.listing.bytes)
	}
	if c.released {
		csrs, bytes = 0, 0
	}
	dc, db := csrs-c.tenantCSRs, bytes-c.tenantBytes
	c.tenantCSRs, c.tenantBytes = csrs, bytes
	if c.limits.tenant == nil {
		return csrs, bytes
	}
	return c.limits.tenant.add(dc, db)
}

// release gives what the cache counted back to the tenant.
func (c *countedCSRs) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = true
	c.held, c.listing = nil, nil
	c.settle()
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

// told tells whoever watches the limits that one was crossed, or that the
// server sent what no API server sends (outside the counts' lock): either
// way the cache is not current until it stops, which the cluster must say.
// It returns err.
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

// tooLarge is err, told as a limit crossed when it is an answer larger than
// the manager reads of a tenant's server (kubeconfig.AnswerTooLargeError):
// client-go alone would list again and again, each answer refused, with
// nothing said. A watch's event past its bound is told by the transport
// (watch).
func (c *countedCSRs) tooLarge(err error) error {
	if errors.As(err, new(*kubeconfig.AnswerTooLargeError)) {
		return c.told(limitError{err})
	}
	return err
}

// unreached is err, told as a limit crossed is when it is a connection the
// manager would not make (netguard): the probe reached the server, and a
// later connection's address (DNS answered otherwise) is in a denied
// network. client-go alone would say only that the cache did not sync, or
// list again and again with the cache stale and nothing said.
func (c *countedCSRs) unreached(err error) error {
	if errors.As(err, new(*netguard.RefusedError)) {
		return c.told(err)
	}
	return err
}

// remoteUnansweredFor is how long a tenant's API server may fail the lists
// and watches of its CSRs (unreachable, answering 5xx) before its cluster
// says so; remoteRefusedFor, how long it may refuse the manager's
// credential (401, 403: a role binding made again, an API server
// restarting before its authorizer is ready recover within it).
const (
	remoteUnansweredFor = time.Minute
	remoteRefusedFor    = 10 * time.Second
)

// unanswered is err, told as a limit crossed is when the server has not
// answered the watch of its CSRs: after remoteRefusedFor when it refuses
// the manager's credential (401, 403: a token revoked, a role taken away),
// after remoteUnansweredFor for any other failure. client-go alone lists again and
// again while its cache keeps what it held and still says it is synced: a
// request made meanwhile is never seen, never decided, and the cluster said
// nothing (review of 2026-12-06). The watch is then stopped, and started
// again after a backoff, as for a limit crossed; the cluster says why
// (ReasonKubeconfigUnreadable).
func (c *countedCSRs) unanswered(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		// The cache stopping: no answer was asked of the server.
		return err
	}
	if errors.As(err, new(limitError)) || errors.As(err, new(invalidAnswerError)) || errors.As(err, new(*netguard.RefusedError)) ||
		errors.Is(err, kubeconfig.ErrListsTooLarge) {
		// Told already, as what it is, or the manager's own bound on
		// what it reads at once: not the server's failure.
		return err
	}
	now := time.Now()
	refused := apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
	c.mu.Lock()
	if c.failingSince.IsZero() {
		c.failingSince = now
	}
	switch {
	case !refused:
		c.refusedSince = time.Time{}
	case c.refusedSince.IsZero():
		c.refusedSince = now
	}
	since, refusedSince := c.failingSince, c.refusedSince
	c.mu.Unlock()
	if refused && now.Sub(refusedSince) >= remoteRefusedFor || now.Sub(since) >= remoteUnansweredFor {
		return c.told(unansweredError{cluster: c.limits.cluster, since: since, err: err})
	}
	return err
}

// answered notes a list or a watch the server answered.
func (c *countedCSRs) answered() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failingSince, c.refusedSince = time.Time{}, time.Time{}
}

// unansweredError is a tenant's API server that does not answer the watch
// of its CSRs.
type unansweredError struct {
	cluster types.NamespacedName
	since   time.Time
	err     error
}

func (e unansweredError) Error() string {
	return fmt.Sprintf("the API server of cluster %s does not answer the watch of its CSRs (since %s): %v; requests made there meanwhile are not seen", e.cluster, e.since.UTC().Format(time.RFC3339), e.err)
}

func (e unansweredError) Unwrap() error { return e.err }

// admissible refuses a CSR in a namespace (CSRs have none) or without a UID
// (an API server gives every object one): a request is told from another of
// the same name by its UID, in the memos and in the decision log's records
// (review 190 F2).
func (c *countedCSRs) admissible(csr *certificatesv1.CertificateSigningRequest) error {
	if csr.Namespace != "" {
		return invalidAnswer("the API server of cluster %s sent the CSR %q in namespace %q: CSRs have none", c.limits.cluster, csr.Name, csr.Namespace)
	}
	if csr.UID == "" {
		return invalidAnswer("the API server of cluster %s sent the CSR %q without a metadata.uid: an API server gives every object one", c.limits.cluster, csr.Name)
	}
	if len(csr.UID) > maxUID {
		return invalidAnswer("the API server of cluster %s sent the CSR %q with a metadata.uid of %d bytes: an API server's are UUIDs", c.limits.cluster, csr.Name, len(csr.UID))
	}
	return nil
}

// maxUID is the longest metadata.uid taken from a tenant's server: an API
// server's are UUIDs, 36 bytes; the UID is a key of every memo and is put
// in Events (review 195 F2).
const maxUID = 128

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
		return limitError{fmt.Errorf("the API server of cluster %s holds more than %s (%s--tenant-max-csrs)", c.limits.cluster, csrs, most)}
	case t.bytes > c.limits.maxBytes:
		return limitError{fmt.Errorf("the CSRs of the API server of cluster %s are more than %s (%s--tenant-max-csr-mib)", c.limits.cluster, bytes, most)}
	case tenantCSRs > c.limits.maxCSRs:
		return limitError{tenantBoundError{fmt.Errorf("the API servers of the clusters of namespace %s hold more than %s together (%s--tenant-max-csrs)", c.limits.cluster.Namespace, csrs, most)}}
	case tenantBytes > c.limits.maxBytes:
		return limitError{tenantBoundError{fmt.Errorf("the CSRs of the API servers of the clusters of namespace %s are more than %s together (%s--tenant-max-csr-mib)", c.limits.cluster.Namespace, bytes, most)}}
	}
	return nil
}

// limitError is a limit the manager keeps of a tenant's servers, crossed
// (ReasonRemoteServerTooLarge).
type limitError struct{ error }

func (e limitError) Unwrap() error { return e.error }

// tenantBoundError is a limit crossed by a tenant's caches together, the
// cluster's own within it: it may pass once another of the tenant's watches
// ends and gives its share back (remoteStarts.wake).
type tenantBoundError struct{ error }

func (e tenantBoundError) Unwrap() error { return e.error }

// invalidAnswerError is what no Kubernetes API server sends
// (ReasonRemoteServerInvalid).
type invalidAnswerError struct{ error }

func (e invalidAnswerError) Unwrap() error { return e.error }

// invalidAnswer is an invalidAnswerError of the message.
func invalidAnswer(format string, args ...any) error {
	return invalidAnswerError{fmt.Errorf(format, args...)}
}

// put counts a CSR into the tally into (what the cache holds, or a list
// under way; one that is neither any more counts nothing), and says when
// that would be past the limits: then it is not counted, and whoever
// watches the limits is told. undo takes a counted CSR back out (an event
// the cache did not take after all), if into is still the cache's.
func (c *countedCSRs) put(into *tally, csr *certificatesv1.CertificateSigningRequest) (undo func(), _ error) {
	c.mu.Lock()
	if !c.current(into) {
		c.mu.Unlock()
		return func() {}, nil
	}
	key := storeKey(csr)
	err := c.admissible(csr)
	if other, held := into.heldElsewhere(csr.UID, key); err == nil && held {
		err = invalidAnswer("the API server of cluster %s sent the CSRs %q and %q under one metadata.uid: an API server gives each object its own", c.limits.cluster, other, key)
	}
	var back func()
	if err == nil {
		back = into.set(key, csr.UID, cost(csr))
		csrs, bytes := c.settle()
		if err = c.crossed(into, csrs, bytes); err != nil {
			back()
			c.settle()
		}
	}
	c.mu.Unlock()
	if err != nil {
		return nil, c.told(err)
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.current(into) {
			back()
			c.settle()
		}
	}, nil
}

// remove forgets a CSR of the tally into (as put).
func (c *countedCSRs) remove(into *tally, csr *certificatesv1.CertificateSigningRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current(into) {
		into.unset(storeKey(csr))
		c.settle()
	}
}

// current says whether t is what the cache holds or the list under way.
// Called with c.mu held.
func (c *countedCSRs) current(t *tally) bool {
	return !c.released && t != nil && (t == c.held || t == c.listing)
}

// heldTally is what the cache holds now.
func (c *countedCSRs) heldTally() *tally {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil && !c.released {
		c.held = &tally{}
	}
	return c.held
}

// list counts a list's pages as they come. What the list brings replaces
// what the cache held once its last page is in; until then the larger of
// the two counts.
func (c *countedCSRs) list(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	var l *tally
	if opts.Continue == "" {
		l = c.beginListing()
	} else {
		c.mu.Lock()
		l = c.listing
		c.mu.Unlock()
		if l == nil {
			// A list refused, or given up: client-go asks no more of it.
			return nil, c.told(invalidAnswer("the API server of cluster %s sent a page of a list not under way", c.limits.cluster))
		}
	}
	// What the list's answer takes of its tenant's budget is held until
	// the list is decoded (client-go closes the answer before it decodes).
	leased, release := kubeconfig.WithListLease(ctx)
	defer release()
	// client-go lists without a deadline: a server that sends a page's
	// headers and then nothing (while it answers the connection's pings)
	// held the relist, and the cache synced on what it held, for good
	// (review 192). The failure is the server's, counted as unanswered.
	leased, cancel := context.WithTimeout(leased, cmp.Or(c.listFor, listTimeout))
	defer cancel()
	list, err := c.inner.ListWithContext(leased, opts)
	if err != nil {
		err = c.unanswered(ctx, c.unreached(c.tooLarge(err)))
	} else if err = c.listPage(l, list, opts); err == nil {
		if listed, lerr := meta.ListAccessor(list); lerr == nil && listed.GetContinue() == "" {
			// A list answered whole: a first page alone, the rest
			// failing at each list, is no answer.
			c.answered()
		}
	}
	if err != nil {
		// A list broken off or refused: the cache keeps what it held.
		c.endListing(l, false)
		return nil, err
	}
	return list, nil
}

// listPage counts one page of the list l.
func (c *countedCSRs) listPage(l *tally, list runtime.Object, opts metav1.ListOptions) error {
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	listed, err := meta.ListAccessor(list)
	if err != nil {
		return err
	}
	if opts.Limit == 0 && listed.GetContinue() != "" {
		// client-go takes an answer it did not ask to be paged whole,
		// and would never count its end (review 32 H2).
		return c.told(invalidAnswer("the API server of cluster %s paged a list it was not asked to", c.limits.cluster))
	}
	for _, item := range items {
		csr, ok := item.(*certificatesv1.CertificateSigningRequest)
		if !ok {
			return c.told(invalidAnswer("the API server of cluster %s listed a %T among its CSRs", c.limits.cluster, item))
		}
		// A list's pages are kept whole until the last (client-go's
		// pager appends them): a CSR listed twice (fresh pages of the
		// same few) is refused, as a real server lists each once.
		c.mu.Lock()
		_, twice := l.sizes[storeKey(csr)]
		c.mu.Unlock()
		if twice {
			return c.told(invalidAnswer("the API server of cluster %s listed the CSR %q twice", c.limits.cluster, csr.Name))
		}
		if _, err := c.put(l, csr); err != nil {
			return err
		}
	}
	if listed.GetContinue() == "" {
		c.endListing(l, true)
	}
	return nil
}

// beginListing starts the count of a list, or of a watch that sends every
// CSR first (client-go's watch list), and returns it.
func (c *countedCSRs) beginListing() *tally {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listing = &tally{}
	c.settle()
	return c.listing
}

// endListing ends the count of the list l, if it is still under way: what
// it brought is what the cache now holds (done), or it is forgotten and
// the cache holds what it held.
func (c *countedCSRs) endListing(l *tally, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listing != l || l == nil {
		return
	}
	if done {
		c.held = l
	}
	c.listing = nil
	c.settle()
}

func (c *countedCSRs) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	// An event past its bound ends the stream inside client-go, which keeps
	// only its message: the transport tells it here.
	ctx = kubeconfig.WithAnswerTooLarge(ctx, func(err error) { _ = c.told(limitError{err}) })
	// An API server ends a watch when the time it was asked for is up: one
	// that keeps it open past that, sending nothing while it answers the
	// connection's pings, held the cache synced on nothing for good
	// (review 191). Ended then, and said. The time counts from the watch's
	// answer, as the server's own does: client-go's retries of its start
	// (timeouts, 429s) are no part of it (review 192).
	watchCtx, cancel := context.WithCancelCause(ctx)
	w, err := c.inner.WatchWithContext(watchCtx, opts)
	if err != nil {
		cancel(nil)
		return nil, c.unanswered(ctx, c.unreached(c.tooLarge(err)))
	}
	c.answered()
	var initial *tally
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		// Every CSR first, then a bookmark: counted as a list is, and
		// what the cache holds until then is kept, as client-go keeps it.
		initial = c.beginListing()
	}
	cw := newCountingWatch(w, c, initial)
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		cw.overdue(watchCtx, cancel, time.Duration(*opts.TimeoutSeconds)*time.Second, cmp.Or(c.overdue, watchOverdue))
	} else {
		go func() {
			<-cw.done
			cancel(nil)
		}()
	}
	return cw, nil
}

// countingWatch passes a watch's events through, counting each CSR on its
// way into the cache, and ends it with an error event past the limits.
// apimachinery's watch.Filter would do, but its goroutine waits forever to
// hand over an event once the reader has stopped (after any error event,
// ours included), with that event (review 30 M1).
type countingWatch struct {
	inner  watch.Interface
	counts *countedCSRs
	// initial is the count of the watch list's first events, until the
	// bookmark that ends them (nil for a plain watch, and after it).
	initial *tally
	result  chan watch.Event
	done    chan struct{}
	stop    sync.Once
}

func newCountingWatch(inner watch.Interface, counts *countedCSRs, initial *tally) *countingWatch {
	w := &countingWatch{inner: inner, counts: counts, initial: initial, result: make(chan watch.Event), done: make(chan struct{})}
	go w.loop()
	return w
}

// overdue ends the watch, whose stream runs under ctx, when it is still open
// grace past until, the time it was asked for, counted from now: the
// server's answer is then refused, as what no API server does. cancel ends
// ctx when the watch ends either way.
func (w *countingWatch) overdue(ctx context.Context, cancel context.CancelCauseFunc, until, grace time.Duration) {
	timer := time.AfterFunc(until+grace, func() { cancel(errOverdue) })
	go func() {
		defer cancel(nil)
		defer timer.Stop()
		select {
		case <-w.done:
		case <-ctx.Done():
		}
		// Whichever came first: the deadline also ends the stream, and
		// the loop with it.
		if errors.Is(context.Cause(ctx), errOverdue) {
			_ = w.counts.told(invalidAnswer("the API server of cluster %s kept a watch of its CSRs open past the %s it was asked for, sending nothing that ended it: an API server ends a watch then", w.counts.limits.cluster, until))
		}
		w.Stop()
	}()
}

func (w *countingWatch) ResultChan() <-chan watch.Event { return w.result }

func (w *countingWatch) Stop() {
	w.stop.Do(func() { close(w.done) })
	w.inner.Stop()
}

func (w *countingWatch) loop() {
	defer close(w.result)
	// Done when the stream ends too, not only when stopped: what waits on
	// the watch (overdue) ends with it.
	defer w.stop.Do(func() { close(w.done) })
	// Ended before all its first events came: the cache keeps what it
	// held.
	defer func() { w.counts.endListing(w.initial, false) }()
	for {
		var e watch.Event
		var undo, taken func()
		select {
		case <-w.done:
			return
		case got, ok := <-w.inner.ResultChan():
			if !ok {
				return
			}
			e, undo, taken = w.count(got)
		}
		select {
		case <-w.done:
			// Not handed over: the cache did not take it.
			if undo != nil {
				undo()
			}
			return
		case w.result <- e:
			if taken != nil {
				taken()
			}
		}
	}
}

// maxRemoteStatusMessage bounds the message of an error event a tenant's
// API server sends on a watch: an API server's is a line.
const maxRemoteStatusMessage = 1 << 10

// boundedStatus is an error event's object as the watch hands it on: a
// Status with its message cut to maxRemoteStatusMessage, or, for anything
// else (a CSR of megabytes, which client-go would print whole), a Status
// that names its type.
func boundedStatus(obj runtime.Object) runtime.Object {
	st, ok := obj.(*metav1.Status)
	if !ok {
		return &metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: fmt.Sprintf("the server sent an error event carrying a %T, not a Status", obj)}
	}
	if len(st.Message) <= maxRemoteStatusMessage {
		return st
	}
	cut := st.DeepCopy()
	cut.Message = servingcert.Clip(st.Message, maxRemoteStatusMessage)
	return cut
}

// count weighs a CSR an event brings or takes away. A CSR brought is
// counted now (undo takes it back if the event is not handed over); past
// the limits the event is an error, which ends the watch, and the CSR is
// not counted. What takes a CSR away, or ends a watch list's first events,
// is counted once the event is handed over (taken): a reader that stopped
// at the event before never sees it (review 32 H3).
func (w *countingWatch) count(e watch.Event) (out watch.Event, undo, taken func()) {
	if e.Type == watch.Error {
		// client-go reads an error event's object, and wraps and logs it
		// whole at each retry: a Status's message, or any other object
		// printed field by field. The tenant's server wrote it, up to an
		// event's bound (review 62).
		return watch.Event{Type: watch.Error, Object: boundedStatus(e.Object)}, nil, nil
	}
	csr, ok := e.Object.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return e, nil, nil // client-go reads what no CSR watch brings
	}
	into := w.initial
	if into == nil {
		into = w.counts.heldTally()
	}
	switch e.Type {
	case watch.Bookmark:
		if l := w.initial; l != nil && csr.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
			return e, nil, func() {
				w.initial = nil
				w.counts.endListing(l, true)
			}
		}
	case watch.Added, watch.Modified:
		undo, err := w.counts.put(into, csr)
		if err != nil {
			return watch.Event{Type: watch.Error, Object: &metav1.Status{
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonRequestEntityTooLarge, Code: 413, Message: err.Error(),
			}}, nil, nil
		}
		return e, undo, nil
	case watch.Deleted:
		return e, nil, func() { w.counts.remove(into, csr) }
	}
	return e, nil, nil
}
