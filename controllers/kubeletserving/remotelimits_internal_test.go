package kubeletserving

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/ichor-dev/ichor-policy/internal/netguard"
)

// A connection of the remote client refused for its address (the probe
// passed, and DNS answered otherwise since) is why the start's cache did
// not sync, and once the start is over it is told as a limit crossed is, so
// the cluster says so rather than client-go listing again with the cache
// stale; any other error is client-go's to retry.
func TestARefusedConnectionIsWhyTheCacheIsNotCurrent(t *testing.T) {
	refused := &url.Error{Op: "Get", URL: "https://tenant.example/apis", Err: &net.OpError{Op: "dial", Net: "tcp", Err: &netguard.RefusedError{Addr: netip.MustParseAddr("127.0.0.1"), Network: netip.MustParsePrefix("127.0.0.0/8")}}}
	var fail error
	inner := &toolscache.ListWatch{
		ListWithContextFunc:  func(context.Context, metav1.ListOptions) (runtime.Object, error) { return nil, fail },
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return nil, fail },
	}
	l := remoteLimits{maxCSRs: 3, maxBytes: 2000, exceeded: &atomic.Pointer[error]{}, afterStart: &atomic.Pointer[func(error)]{}}
	c := &countedCSRs{limits: l, inner: inner}

	fail = errors.New("connection reset by peer")
	_, err := c.list(t.Context(), metav1.ListOptions{})
	require.Error(t, err)
	require.NoError(t, l.why(), "another error is not the cluster's to say")

	fail = refused
	_, err = c.list(t.Context(), metav1.ListOptions{})
	require.ErrorAs(t, err, new(*netguard.RefusedError))
	require.ErrorAs(t, l.why(), new(*netguard.RefusedError))
	reason, message := refusal(fmt.Errorf("watch CSRs of cluster t/c: %w", l.why()))
	assert.Equal(t, ReasonRemoteServerAddressRefused, reason)
	assert.Contains(t, message, "is in 127.0.0.0/8")

	told := make(chan error, 1)
	l.exceededAfterStart(func(err error) { told <- err })
	_, err = c.watch(t.Context(), metav1.ListOptions{})
	require.ErrorAs(t, err, new(*netguard.RefusedError))
	select {
	case got := <-told:
		require.ErrorAs(t, got, new(*netguard.RefusedError))
	default:
		t.Fatal("a refused watch after the start was not told")
	}
}

func limitedCSR(uid string, request int) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-" + uid, UID: types.UID(uid)},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Request: make([]byte, request)},
	}
}

// What a tenant's server brings to the cache is counted on its way in, by
// its list and its watch alike: past the limits a list is refused and a
// watch ends with an error, a deletion makes room again, and a watch that
// sends everything again counts afresh.
func TestATenantServerIsCountedOnItsWayIn(t *testing.T) {
	w := watch.NewFakeWithChanSize(16, false)
	var items []runtime.Object
	inner := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			list := &certificatesv1.CertificateSigningRequestList{}
			for _, o := range items {
				list.Items = append(list.Items, *o.(*certificatesv1.CertificateSigningRequest))
			}
			return list, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return w, nil },
	}
	l := remoteLimits{
		maxCSRs: 3, maxBytes: 2000, cluster: types.NamespacedName{Namespace: "t", Name: "c"},
		exceeded: &atomic.Pointer[error]{}, afterStart: &atomic.Pointer[func(error)]{},
	}
	c := &countedCSRs{limits: l, inner: inner}
	ctx := t.Context()

	items = []runtime.Object{limitedCSR("a", 100), limitedCSR("b", 100), limitedCSR("c", 100), limitedCSR("d", 100)}
	_, err := c.list(ctx, metav1.ListOptions{})
	require.Error(t, err, "a list of more CSRs than kept")
	assert.Contains(t, err.Error(), "holds more than 3 CSRs")
	require.Error(t, l.why())

	items = items[:2]
	_, err = c.list(ctx, metav1.ListOptions{})
	require.NoError(t, err, "a new list counts afresh")
	// The start is over: a limit crossed from now on is told, which
	// stops the cluster's watch (remoteExceeded).
	told := make(chan error, 8)
	l.exceededAfterStart(func(err error) { told <- err })

	watched, err := c.watch(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	defer watched.Stop()
	next := func(e watch.Event) watch.Event {
		t.Helper()
		w.Action(e.Type, e.Object)
		select {
		case got := <-watched.ResultChan():
			return got
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s event was not passed on", e.Type)
			return watch.Event{}
		}
	}
	assert.Equal(t, watch.Added, next(watch.Event{Type: watch.Added, Object: limitedCSR("c", 100)}).Type)
	assert.Equal(t, watch.Modified, next(watch.Event{Type: watch.Modified, Object: limitedCSR("c", 200)}).Type, "a change is counted once")
	got := next(watch.Event{Type: watch.Added, Object: limitedCSR("d", 100)})
	require.Equal(t, watch.Error, got.Type, "a fourth CSR")
	assert.Contains(t, got.Object.(*metav1.Status).Message, "holds more than 3 CSRs")
	select {
	case err := <-told:
		assert.Contains(t, err.Error(), "holds more than 3 CSRs")
	default:
		t.Fatal("a limit crossed by a watch after the start was not told")
	}

	// After a deletion there is room, by count; not by size.
	assert.Equal(t, watch.Deleted, next(watch.Event{Type: watch.Deleted, Object: limitedCSR("d", 100)}).Type)
	assert.Equal(t, watch.Deleted, next(watch.Event{Type: watch.Deleted, Object: limitedCSR("c", 200)}).Type)
	assert.Equal(t, watch.Added, next(watch.Event{Type: watch.Added, Object: limitedCSR("e", 100)}).Type)
	got = next(watch.Event{Type: watch.Modified, Object: limitedCSR("e", 3000)})
	require.Equal(t, watch.Error, got.Type, "a CSR grown past the bytes kept")
	assert.True(t, strings.Contains(got.Object.(*metav1.Status).Message, "more than 2000 bytes"), got.Object)

	// A watch that sends every CSR first (a watch list) replaces what the
	// cache held at the bookmark that ends them; ended before it, it
	// leaves the cache as it was, as client-go does.
	held := func() []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		return slices.Sorted(maps.Keys(c.held.sizes))
	}
	before := held()
	assert.Equal(t, []string{"csr-a", "csr-b", "csr-e"}, before, "a CSR past the limits is not counted")
	watchList := func(events ...watch.Event) watch.Interface {
		t.Helper()
		w = watch.NewFakeWithChanSize(16, false)
		listed, err := c.watch(ctx, metav1.ListOptions{SendInitialEvents: ptr.To(true)})
		require.NoError(t, err)
		for _, e := range events {
			w.Action(e.Type, e.Object)
			select {
			case <-listed.ResultChan():
			case <-time.After(10 * time.Second):
				t.Fatalf("the %s event was not passed on", e.Type)
			}
		}
		return listed
	}
	end := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	broken := watchList(watch.Event{Type: watch.Added, Object: limitedCSR("x", 10)})
	broken.Stop()
	for range broken.ResultChan() {
	}
	assert.Equal(t, before, held(), "a watch list ended before its bookmark")
	listed := watchList(watch.Event{Type: watch.Added, Object: limitedCSR("x", 10)}, watch.Event{Type: watch.Added, Object: limitedCSR("y", 10)},
		watch.Event{Type: watch.Bookmark, Object: end})
	listed.Stop()
	for range listed.ResultChan() {
	}
	assert.Equal(t, []string{"csr-x", "csr-y"}, held())

	// The cache keeps CSRs by name: many names under one UID are many
	// CSRs, and a deletion of a name it does not hold frees nothing
	// (review 30 H1).
	items = []runtime.Object{limitedCSR("a", 10), limitedCSR("a", 10), limitedCSR("a", 10), limitedCSR("a", 10)}
	for i, o := range items {
		o.(*certificatesv1.CertificateSigningRequest).Name = "csr-" + string(rune('w'+i))
	}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.Error(t, err, "four names under one UID")
	assert.Len(t, told, 2, "the CSR grown past the bytes, and a list refused after the start, are told too")
	items = items[:1]
	_, err = c.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w = watch.NewFakeWithChanSize(16, false)
	watched, err = c.watch(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	defer watched.Stop()
	for _, name := range []string{"x", "y"} {
		assert.Equal(t, watch.Added, next(watch.Event{Type: watch.Added, Object: limitedCSR(name, 10)}).Type)
		gone := limitedCSR(name, 10)
		gone.Name = "csr-never-" + name
		assert.Equal(t, watch.Deleted, next(watch.Event{Type: watch.Deleted, Object: gone}).Type)
	}
	require.Equal(t, watch.Error, next(watch.Event{Type: watch.Added, Object: limitedCSR("z", 10)}).Type, "deletions of names never held freed room")

	// Many empty strings are small on the wire and not in memory (review
	// 30 L1): they count at what Go holds.
	groups := limitedCSR("g", 0)
	groups.Spec.Groups = make([]string, 200)
	assert.Greater(t, cost(groups), int64(200*16))
}

// A watch stopped while an event waits to be handed over ends, without
// the event (review 30 M1: apimachinery's watch.Filter kept its goroutine
// and the event).
func TestACountingWatchStoppedWithAnEventWaitingEnds(t *testing.T) {
	inner := watch.NewFakeWithChanSize(2, false)
	c := &countedCSRs{limits: remoteLimits{maxCSRs: 10, maxBytes: 1 << 20}}
	w := newCountingWatch(inner, c, nil)
	inner.Add(limitedCSR("a", 10))
	inner.Add(limitedCSR("b", 10))
	w.Stop()
	require.Eventually(t, func() bool {
		select {
		case _, ok := <-w.ResultChan():
			return !ok
		default:
			return false
		}
	}, 10*time.Second, 10*time.Millisecond, "the watch did not end")
}

// An error event's message is the tenant's server's, which client-go wraps
// and logs whole at each retry: it is cut to a line's length (review 62).
func TestAWatchErrorsMessageIsCut(t *testing.T) {
	inner := watch.NewFakeWithChanSize(2, false)
	c := &countedCSRs{limits: remoteLimits{maxCSRs: 10, maxBytes: 1 << 20}}
	w := newCountingWatch(inner, c, nil)
	defer w.Stop()
	long := &metav1.Status{Status: metav1.StatusFailure, Code: 500, Message: strings.Repeat("x", 1<<20)}
	inner.Error(long)
	inner.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone, Message: "too old resource version"})
	// Not a Status: client-go would print the object whole.
	inner.Error(limitedCSR("huge", 1<<20))
	for _, want := range []func(*metav1.Status){
		func(st *metav1.Status) {
			assert.LessOrEqual(t, len(st.Message), maxRemoteStatusMessage+32)
			assert.Contains(t, st.Message, "bytes more)")
			assert.Equal(t, int32(500), st.Code, "the rest of the Status kept")
		},
		func(st *metav1.Status) {
			assert.Equal(t, "too old resource version", st.Message, "an ordinary message kept whole")
			assert.Equal(t, metav1.StatusReasonGone, st.Reason)
		},
		func(st *metav1.Status) {
			assert.Equal(t, "the server sent an error event carrying a *v1.CertificateSigningRequest, not a Status", st.Message)
		},
	} {
		select {
		case e := <-w.ResultChan():
			require.Equal(t, watch.Error, e.Type)
			st, ok := e.Object.(*metav1.Status)
			require.True(t, ok, "%T", e.Object)
			want(st)
		case <-time.After(10 * time.Second):
			t.Fatal("no error event")
		}
	}
	assert.Len(t, long.Message, 1<<20, "the event's own object is not changed")
}

// The limits hold for a tenant's clusters together: a tenant's second
// cluster is refused what its first already holds, and given it back when
// the first's watch ends; another tenant is not touched.
func TestATenantsClustersAreCountedTogether(t *testing.T) {
	var r Reconciler
	ctx := t.Context()
	lister := func(items ...*certificatesv1.CertificateSigningRequest) toolscache.ListerWatcherWithContext {
		return &toolscache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			list := &certificatesv1.CertificateSigningRequestList{}
			for _, o := range items {
				list.Items = append(list.Items, *o)
			}
			return list, nil
		}}
	}
	cluster := func(namespace, name string, items ...*certificatesv1.CertificateSigningRequest) (*countedCSRs, func()) {
		usage, unhold := r.targets.holdUsage(namespace)
		l := remoteLimits{maxCSRs: 3, maxBytes: 2000, cluster: types.NamespacedName{Namespace: namespace, Name: name}, tenant: usage, caches: &countedSet{}}
		c := &countedCSRs{limits: l, inner: lister(items...)}
		l.caches.add(c)
		return c, func() { l.release(); unhold() }
	}

	first, endFirst := cluster("t", "first", limitedCSR("a", 10), limitedCSR("b", 10))
	_, err := first.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	second, endSecond := cluster("t", "second", limitedCSR("a", 10), limitedCSR("b", 10))
	defer endSecond()
	_, err = second.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, "the API servers of the clusters of namespace t hold more than 3 CSRs together")

	other, endOther := cluster("u", "other", limitedCSR("a", 10), limitedCSR("b", 10), limitedCSR("c", 10))
	defer endOther()
	_, err = other.list(ctx, metav1.ListOptions{})
	require.NoError(t, err, "another tenant has its own")

	// A list again counts afresh, not twice.
	_, err = first.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)

	endFirst()
	_, err = second.list(ctx, metav1.ListOptions{})
	require.NoError(t, err, "the first cluster's watch ended, and what it held with it")
	endFirst()
	_, err = first.list(ctx, metav1.ListOptions{})
	require.NoError(t, err, "an ended cache counts nothing more")
	r.targets.mu.Lock()
	assert.Equal(t, 2, r.targets.usage["t"].csrs)
	r.targets.mu.Unlock()

	// The bytes are the tenant's too.
	// One CSR of just under the bytes, alone within them.
	big, endBig := cluster("t", "big", limitedCSR("x", 2000-int(cost(limitedCSR("x", 0)))-10))
	defer endBig()
	_, err = big.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, "are more than 2000 bytes together")

	endSecond()
	endBig()
	endOther()
	r.targets.mu.Lock()
	assert.Empty(t, r.targets.usage, "a tenant whose watches all ended is forgotten")
	r.targets.mu.Unlock()
}

// A list in pages replaces what the cache held once its last page is in:
// it is weighed without what it replaces, and a list refused in its second
// page leaves the count as the cache is left, with what it held.
func TestAListInPagesReplacesWhatTheCacheHeld(t *testing.T) {
	var r Reconciler
	ctx := t.Context()
	pages := map[string][]*certificatesv1.CertificateSigningRequest{}
	next := map[string]string{"": "2"}
	inner := &toolscache.ListWatch{ListWithContextFunc: func(_ context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		list := &certificatesv1.CertificateSigningRequestList{ListMeta: metav1.ListMeta{Continue: next[opts.Continue]}}
		for _, o := range pages[opts.Continue] {
			list.Items = append(list.Items, *o)
		}
		return list, nil
	}}
	usage, unhold := r.targets.holdUsage("t")
	defer unhold()
	l := remoteLimits{maxCSRs: 3, maxBytes: 1 << 20, cluster: types.NamespacedName{Namespace: "t", Name: "c"}, tenant: usage, caches: &countedSet{}}
	defer l.release()
	c := &countedCSRs{limits: l, inner: inner}
	l.caches.add(c)
	held := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.held.sizes)
	}

	pages[""], pages["2"] = []*certificatesv1.CertificateSigningRequest{limitedCSR("a", 1), limitedCSR("b", 1)}, []*certificatesv1.CertificateSigningRequest{limitedCSR("c", 1)}
	for _, page := range []string{"", "2", "", "2"} {
		_, err := c.list(ctx, metav1.ListOptions{Limit: 2, Continue: page})
		require.NoError(t, err, "page %q: three CSRs, listed again", page)
	}
	assert.Equal(t, 3, held())
	assert.Equal(t, 3, usage.csrs)

	pages["2"] = append(pages["2"], limitedCSR("d", 1))
	_, err := c.list(ctx, metav1.ListOptions{Limit: 2})
	require.NoError(t, err)
	_, err = c.list(ctx, metav1.ListOptions{Limit: 2, Continue: "2"})
	require.ErrorContains(t, err, "holds more than 3 CSRs")
	assert.Equal(t, 3, held(), "a refused list leaves the cache as it was")
	assert.Equal(t, 3, usage.csrs)
}

// What a real server never sends is refused, not counted once while the
// cache keeps many (review 31 H1, H3): a CSR in a namespace (the cache
// keys by namespace and name), and a CSR listed twice (client-go's pager
// keeps every page until the last). A list broken off leaves the count
// as the cache is left (review 31 M2).
func TestWhatARealServerNeverSendsIsRefused(t *testing.T) {
	ctx := t.Context()
	var pages map[string][]*certificatesv1.CertificateSigningRequest
	var fail map[string]bool
	inner := &toolscache.ListWatch{ListWithContextFunc: func(_ context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		if fail[opts.Continue] {
			return nil, errors.New("connection reset")
		}
		list := &certificatesv1.CertificateSigningRequestList{}
		if _, more := pages[opts.Continue+"+"]; more {
			list.Continue = opts.Continue + "+"
		}
		for _, o := range pages[opts.Continue] {
			list.Items = append(list.Items, *o)
		}
		return list, nil
	}}
	usage := &tenantUsage{}
	c := &countedCSRs{limits: remoteLimits{maxCSRs: 3, maxBytes: 1 << 20, cluster: types.NamespacedName{Namespace: "t", Name: "c"}, tenant: usage}, inner: inner}
	namespaced := limitedCSR("n", 1)
	namespaced.Namespace = "x1"

	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1), namespaced}}
	_, err := c.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, `sent the CSR "csr-n" in namespace "x1": CSRs have none`)
	// Nor a CSR without a UID, which would be told from another of its
	// name by its name alone (review 190 F2).
	anonymous := limitedCSR("u", 1)
	anonymous.UID = ""
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1), anonymous}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, `sent the CSR "csr-u" without a metadata.uid`)
	long := limitedCSR(strings.Repeat("u", maxUID+1), 1)
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {long}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, "with a metadata.uid of 129 bytes")
	// Nor two CSRs under one UID, which the memos would take for one
	// (review 195 F1): by a list, or by a watch.
	twin := limitedCSR("a", 1)
	twin.Name = "csr-twin"
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1), twin}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, `sent the CSRs "csr-a" and "csr-twin" under one metadata.uid`)
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1)}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	tw := watch.NewFakeWithChanSize(4, false)
	twinWatch := newCountingWatch(tw, c, nil)
	defer twinWatch.Stop()
	tw.Modify(limitedCSR("a", 2))
	require.Equal(t, watch.Modified, (<-twinWatch.ResultChan()).Type, "a CSR changed under its own UID")
	tw.Add(twin)
	require.Equal(t, watch.Error, (<-twinWatch.ResultChan()).Type, "a second CSR under a held UID by a watch")
	// An empty list leaves the cache as the rest of the test expects it.
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, usage.csrs)

	w := watch.NewFakeWithChanSize(4, false)
	watched := newCountingWatch(w, c, nil)
	defer watched.Stop()
	w.Add(namespaced)
	got := <-watched.ResultChan()
	require.Equal(t, watch.Error, got.Type, "a namespaced CSR by a watch")

	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1)}, "+": {limitedCSR("a", 1)}}
	_, err = c.list(ctx, metav1.ListOptions{Limit: 1})
	require.NoError(t, err)
	_, err = c.list(ctx, metav1.ListOptions{Limit: 1, Continue: "+"})
	require.ErrorContains(t, err, `listed the CSR "csr-a" twice`)
	assert.Equal(t, 0, usage.csrs)

	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1), limitedCSR("b", 1)}, "+": {limitedCSR("c", 1)}}
	fail = map[string]bool{"+": true}
	_, err = c.list(ctx, metav1.ListOptions{Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, 2, usage.csrs, "a first page is counted")
	_, err = c.list(ctx, metav1.ListOptions{Limit: 2, Continue: "+"})
	require.Error(t, err)
	assert.Equal(t, 0, usage.csrs, "a list broken off counts nothing")

	// What no real server does (review 32): a list paged though it was
	// not asked to be, a page of a list not under way, a deletion in a
	// namespace taking away the CSR of that name.
	fail = nil
	_, err = c.list(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, "paged a list it was not asked to")
	_, err = c.list(ctx, metav1.ListOptions{Limit: 2, Continue: "+"})
	require.ErrorContains(t, err, "a page of a list not under way")
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1), limitedCSR("b", 1)}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w = watch.NewFakeWithChanSize(4, false)
	watched = newCountingWatch(w, c, nil)
	defer watched.Stop()
	gone := limitedCSR("a", 1)
	gone.Namespace = "x"
	w.Delete(gone)
	<-watched.ResultChan()
	w.Add(limitedCSR("c", 1))
	<-watched.ResultChan()
	assert.Equal(t, 3, usage.csrs, "the deletion of x/csr-a took nothing away")

	// A refusal of what no server sends is told as a limit is: the
	// cluster says it (review 33 L3).
	told := make(chan error, 1)
	c.limits.afterStart = &atomic.Pointer[func(error)]{}
	c.limits.exceededAfterStart(func(err error) { told <- err })
	_, err = c.list(ctx, metav1.ListOptions{Continue: "x"})
	require.Error(t, err)
	assert.Equal(t, err, <-told)

	// A change counted in what the cache held before a list replaced it
	// is not taken back out of the list's (review 33 L1).
	old := c.heldTally()
	undo, err := c.put(old, limitedCSR("c", 2))
	require.NoError(t, err)
	pages = map[string][]*certificatesv1.CertificateSigningRequest{"": {limitedCSR("a", 1), limitedCSR("b", 1), limitedCSR("c", 1)}}
	_, err = c.list(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	undo()
	c.remove(old, limitedCSR("a", 1))
	assert.Equal(t, []string{"csr-a", "csr-b", "csr-c"}, slices.Sorted(maps.Keys(c.heldTally().sizes)))
	assert.Equal(t, 3, usage.csrs)
}

// A server that answers its start small and grows after it is started
// again at a doubling interval, not every bound (review 31 M1).
func TestAServerGrowingAfterEachStartBacksOff(t *testing.T) {
	var s remoteStarts
	key := types.NamespacedName{Namespace: "t", Name: "c"}
	sum := [32]byte{1}
	now := time.Unix(0, 0)
	const bound = 30 * time.Second
	var waits []time.Duration
	for range 4 {
		end, err := s.begin(key, sum, "r1", now, time.Second)
		require.NoError(t, err)
		end(now, bound, nil)
		s.fail(key, sum, "r1", now, bound, errors.New("grew"))
		_, err = s.begin(key, sum, "r1", now, time.Second)
		var deferred *startDeferredError
		require.ErrorAs(t, err, &deferred)
		waits = append(waits, deferred.wait)
		now = now.Add(deferred.wait)
	}
	assert.Equal(t, []time.Duration{bound, 2 * bound, 4 * bound, 8 * bound}, waits)

	// A start that fails after one that grew keeps doubling (review 32
	// L1); a count with no failure for maxBackoff past its wait is
	// forgotten (L2).
	end, err := s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, errors.New("listed too many"))
	_, err = s.begin(key, sum, "r1", now, time.Second)
	var deferred *startDeferredError
	require.ErrorAs(t, err, &deferred)
	assert.Equal(t, maxBackoff, deferred.wait, "16 bounds, capped")
	now = now.Add(deferred.wait)
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, nil)
	now = now.Add(maxBackoff + time.Second)
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, nil)
	s.fail(key, sum, "r1", now, bound, errors.New("grew"))
	_, err = s.begin(key, sum, "r1", now, time.Second)
	require.ErrorAs(t, err, &deferred)
	assert.Equal(t, bound, deferred.wait, "forgotten after a quiet while, noticed by a start")
	s.fail(key, sum, "r1", now, bound, errors.New("grew"))
	now = now.Add(2*bound + maxBackoff + time.Second)
	s.fail(key, sum, "r1", now, bound, errors.New("grew"))
	_, err = s.begin(key, sum, "r1", now, time.Second)
	require.ErrorAs(t, err, &deferred)
	assert.Equal(t, bound, deferred.wait, "forgotten after a quiet while, noticed by a running watch")

	// Another content starts at once, and the count stays with the
	// cluster: a rewrite of the kubeconfig does not undo it.
	end, err = s.begin(key, [32]byte{2}, "r1", now, time.Second)
	require.NoError(t, err, "another content waited for the old one's backoff")
	end(now, bound, nil)
	now = now.Add(bound)
	s.fail(key, [32]byte{2}, "r1", now, bound, errors.New("grew"))
	_, err = s.begin(key, [32]byte{2}, "r1", now, time.Second)
	require.ErrorAs(t, err, &deferred)
	assert.Equal(t, 2*bound, deferred.wait, "a rewritten kubeconfig started the count afresh")
}

// A watch already replaced (its kubeconfig rotated) that crosses the limits
// while it winds down counts no failure of the cluster's current one
// (review 31 L1); the current one's crossing stops it.
func TestAReplacedWatchCountsNoFailure(t *testing.T) {
	r := &Reconciler{Clock: clock.RealClock{}, TenantRequestTimeout: time.Second}
	key := types.NamespacedName{Namespace: "t", Name: "c"}
	var stopped []string
	old := &target{cancel: func() { stopped = append(stopped, "old") }}
	current := &target{cancel: func() { stopped = append(stopped, "current") }}
	r.targets.remote = map[types.NamespacedName]*target{key: current}
	failed := func() bool {
		r.targets.starts.mu.Lock()
		defer r.targets.starts.mu.Unlock()
		_, ok := r.targets.starts.failed[key]
		return ok
	}

	r.remoteExceeded(key, old, [32]byte{1}, "r", errors.New("grew"))
	assert.False(t, failed())
	assert.Same(t, current, r.targets.remote[key])
	assert.Empty(t, stopped)

	r.remoteExceeded(key, current, [32]byte{1}, "r", errors.New("grew"))
	assert.True(t, failed())
	assert.NotContains(t, r.targets.remote, key)
	assert.Equal(t, []string{"current"}, stopped)
}

// A cluster whose API server holds more than the manager keeps says so
// with a reason of its own, as does one whose server sent what no API
// server sends, however the cause was wrapped on its way (a failed start,
// or the backoff that remembers it); a kubeconfig that cannot be used
// stays KubeconfigUnreadable.
func TestARemoteServersRefusalHasAReasonOfItsOwn(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	c := &countedCSRs{limits: remoteLimits{maxCSRs: 1, maxBytes: 1 << 20, cluster: key}}
	held := &tally{sizes: map[string]int64{"a": 1, "b": 1}}
	tooMany := c.crossed(held, 2, 2)
	together := c.crossed(&tally{sizes: map[string]int64{}}, 2, 2)
	invalid := c.admissible(&certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a"}})
	for name, tc := range map[string]struct {
		cause  error
		reason string
	}{
		"too many, at the start":      {fmt.Errorf("watch CSRs of cluster %s: %w", key, tooMany), ReasonRemoteServerTooLarge},
		"together, while backing off": {&startDeferredError{wait: time.Second, cause: fmt.Errorf("watch CSRs of cluster %s: %w", key, together)}, ReasonRemoteServerTooLarge},
		"what no server sends":        {fmt.Errorf("watch CSRs of cluster %s: %w", key, invalid), ReasonRemoteServerInvalid},
		"a Secret that is missing":    {errors.New(`kubeconfig of cluster ns/c: get Secret "missing": not found`), ReasonKubeconfigUnreadable},
		// Waiting for room: nothing is decided meanwhile (review 203 F2).
		"waiting for its turn to start": {&startDeferredError{wait: time.Second}, ReasonRemoteWatchStarting},
		// The bundle's fault, not the tenant's Secret (review 203 F3).
		"the kubeconfig rule failed": {&startDeferredError{wait: time.Second, cause: ownFailure{errors.New("kubeconfig of cluster ns/c: evaluate: the bundle is broken")}}, ReasonPolicyEvaluationFailed},
	} {
		reason, message := refusal(tc.cause)
		assert.Equal(t, tc.reason, reason, name)
		assert.NotEmpty(t, message, name)
	}
	assert.ErrorAs(t, together, new(tenantBoundError), "a crossing together no longer wakes a sibling")
}

// A tenant's API server that keeps a watch open past the time it was asked
// for, sending nothing (while it answers the connection's pings), had the
// cache synced on nothing for good: the watch is ended, and the cluster
// told why (review 191). The time counts from the watch's answer: a start
// that took long (client-go's retries) is not counted against the server
// (review 192). One that ends in time is not told.
func TestAWatchKeptOpenPastItsTimeIsEndedAndSaid(t *testing.T) {
	var endsItself atomic.Bool
	inner := &toolscache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		// An answer that takes longer than the grace to start.
		time.Sleep(1500 * time.Millisecond)
		w := watch.NewFake()
		go func() {
			// The stream ends with its context, as client-go's does; a
			// server that keeps its word ends it at the time asked.
			var asked <-chan time.Time
			if endsItself.Load() {
				asked = time.After(time.Duration(*opts.TimeoutSeconds) * time.Second)
			}
			select {
			case <-ctx.Done():
			case <-asked:
			}
			w.Stop()
		}()
		return w, nil
	}}
	c := &countedCSRs{limits: remoteLimits{maxCSRs: 3, maxBytes: 1 << 20, cluster: types.NamespacedName{Namespace: "t", Name: "c"}, tenant: &tenantUsage{}},
		inner: inner, overdue: time.Second}
	told := make(chan error, 1)
	c.limits.afterStart = &atomic.Pointer[func(error)]{}
	c.limits.exceededAfterStart(func(err error) { told <- err })
	timeout := int64(1)
	drain := func() {
		w, err := c.watch(t.Context(), metav1.ListOptions{TimeoutSeconds: &timeout})
		require.NoError(t, err)
		defer w.Stop()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case _, ok := <-w.ResultChan():
				if !ok {
					return
				}
			case <-deadline:
				t.Fatal("the watch was never ended")
			}
		}
	}

	drain()
	select {
	case err := <-told:
		assert.ErrorContains(t, err, "kept a watch of its CSRs open past the 1s it was asked for")
	case <-time.After(30 * time.Second):
		t.Fatal("a watch kept open past its time was never said")
	}

	endsItself.Store(true)
	drain()
	// Its overdue check ends with it: nothing told, then or later.
	require.Never(t, func() bool { return len(told) > 0 }, 3*time.Second, 50*time.Millisecond, "a watch ended in time was said to be kept open")
}

// A list's page that never comes (a server that sends its headers and then
// nothing, while it answers the connection's pings) is given up and counted
// as the server not answering: client-go lists without a deadline, and the
// relist held the cache synced on what it held for good (review 192).
func TestAListThatNeverEndsIsGivenUp(t *testing.T) {
	inner := &toolscache.ListWatch{ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	c := &countedCSRs{limits: remoteLimits{maxCSRs: 3, maxBytes: 1 << 20, cluster: types.NamespacedName{Namespace: "t", Name: "c"}, tenant: &tenantUsage{}},
		inner: inner, listFor: 200 * time.Millisecond}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := c.list(ctx, metav1.ListOptions{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, ctx.Err(), "the list ended only at the test's deadline")
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.False(t, c.failingSince.IsZero(), "a list given up was not counted as the server not answering")
}
