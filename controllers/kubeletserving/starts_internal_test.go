package kubeletserving

import (
	"context"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
)

// Review 8 M3: a cluster whose watch could not be started is not started
// again until its backoff has passed (the request bound, doubling, at most
// 5 min), however often it is reconciled; another content is tried at once
// (once a backoff:
// TestRewritingTheKubeconfigDoesNotUndoTheBackoff); a start that works ends
// the wait but not the count, which starts afresh after a quiet while or
// with another bundle.
func TestAFailedStartBacksOff(t *testing.T) {
	var s remoteStarts
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	sum, other := sha256.Sum256([]byte("kubeconfig")), sha256.Sum256([]byte("rotated"))
	now := time.Unix(1_000_000, 0)
	bound := 30 * time.Second
	stalled := errors.New("the cache did not sync")

	fail := func(sum [sha256.Size]byte, revision string) {
		t.Helper()
		end, err := s.begin(key, sum, revision, now, time.Second)
		require.NoError(t, err)
		end(now, bound, stalled)
	}
	deferred := func(sum [sha256.Size]byte, revision string) time.Duration {
		t.Helper()
		_, err := s.begin(key, sum, revision, now, time.Second)
		var d *startDeferredError
		require.ErrorAs(t, err, &d)
		return d.wait
	}

	for _, backoff := range []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute} {
		fail(sum, "r1")
		assert.Equal(t, backoff, deferred(sum, "r1"))
		_, err := s.begin(key, sum, "r1", now, time.Second)
		assert.ErrorIs(t, err, stalled, "the deferral does not say why the last start failed")
		now = now.Add(backoff)
	}
	fail(sum, "r1")
	end, err := s.begin(key, other, "r1", now, time.Second)
	require.NoError(t, err, "a rotated kubeconfig waited for the old one's backoff")
	end(now, bound, nil)
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err, "a start that worked did not end the wait")
	end(now, bound, stalled)
	assert.Equal(t, 5*time.Minute, deferred(sum, "r1"), "a start that worked undid the count")
	assert.Equal(t, 5*time.Minute, deferred(other, "r1"), "the content that worked was let in again within the wait")
	now = now.Add(5*time.Minute + maxBackoff + time.Second)
	fail(sum, "r1")
	assert.Equal(t, 30*time.Second, deferred(sum, "r1"), "the count did not start afresh after a quiet while")
	end, err = s.begin(key, sum, "r2", now, time.Second)
	require.NoError(t, err, "a new bundle waited for the old one's backoff")
	end(now, bound, stalled)
	assert.Equal(t, 30*time.Second, deferred(sum, "r2"), "a new bundle did not start the count afresh")
}

// The kubeconfig Secret is the tenant's to write at will, and a
// TalosCluster may be its to make: neither a rewrite nor a cluster made
// again under its name undoes the backoff of its failed starts (each
// rewrite had started the count afresh, so a tenant could have the manager
// list its server every few seconds). A rewrite is started at once, once a
// backoff, so that a fix need not wait; its failure counts on.
func TestRewritingTheKubeconfigDoesNotUndoTheBackoff(t *testing.T) {
	var s remoteStarts
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	now := time.Unix(1_000_000, 0)
	bound := 30 * time.Second
	stalled := errors.New("the cache did not sync")
	content := func(i int) [sha256.Size]byte { return sha256.Sum256(fmt.Appendf(nil, "kubeconfig %d", i)) }
	start := func(i int) (func(time.Time, time.Duration, error), error) {
		return s.begin(key, content(i), "r1", now, time.Second)
	}
	failed := func(i int, why string) {
		t.Helper()
		end, err := start(i)
		require.NoError(t, err, why)
		end(now, bound, stalled)
	}
	deferred := func(i int) time.Duration {
		t.Helper()
		_, err := start(i)
		var d *startDeferredError
		require.ErrorAs(t, err, &d)
		assert.ErrorIs(t, err, stalled, "the deferral does not say why the last start failed")
		return d.wait
	}

	failed(0, "a first start waited")
	failed(1, "a rewritten kubeconfig waited for the old one's backoff")
	assert.Equal(t, time.Minute, deferred(1), "a rewrite that failed started the count afresh")
	assert.Equal(t, time.Minute, deferred(2), "a second rewrite within the backoff was started at once")
	now = now.Add(time.Minute)
	failed(2, "the backoff over, a rewrite waited")
	assert.Equal(t, 2*time.Minute, deferred(2))
	// The last rewrite let in early was a minute ago; the next is let in
	// a wait (now 2 min) after it.
	assert.Equal(t, time.Minute, deferred(3), "a rewrite within a wait of the last one let in was started")
	now = now.Add(time.Minute)
	failed(3, "a rewrite a wait after the last one let in waited")
	assert.Equal(t, 4*time.Minute, deferred(4))

	s.forget(key)
	assert.Equal(t, 4*time.Minute, deferred(3), "a cluster deleted and made again started the count afresh")
	assert.Equal(t, 4*time.Minute, deferred(4), "a cluster deleted and made again was started at once with a rewrite")

	// Another bundle is the operator's act: the count starts afresh.
	end, err := s.begin(key, content(3), "r2", now, time.Second)
	require.NoError(t, err, "a new bundle waited for the old one's backoff")
	end(now, bound, stalled)
	_, err = s.begin(key, content(3), "r2", now, time.Second)
	var d *startDeferredError
	require.ErrorAs(t, err, &d)
	assert.Equal(t, bound, d.wait, "a new bundle did not start the count afresh")

	// The count of a cluster that went is dropped once quiet.
	s.forget(key)
	now = now.Add(bound + maxBackoff + time.Second)
	sibling := types.NamespacedName{Namespace: "ns", Name: "other"}
	end, err = s.begin(sibling, content(0), "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, stalled)
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.NotContains(t, s.failed, key, "the count of a cluster gone for good was kept")
	assert.Contains(t, s.failed, sibling)
}

// A start that succeeds, or whose content the rule refuses (targetFor
// reports it as a success), ends the wait but not the count: a tenant that
// alternates a failing kubeconfig with one that starts had the failing one
// started every other rewrite, the count never past one.
func TestAlternatingAFailingKubeconfigWithOneThatStartsDoesNotUndoTheBackoff(t *testing.T) {
	var s remoteStarts
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	failing, working := sha256.Sum256([]byte("hostile")), sha256.Sum256([]byte("refused or working"))
	start := time.Unix(1_000_000, 0)
	bound := 30 * time.Second
	stalled := errors.New("the cache did not sync")

	// The tenant rewrites its Secret every 5 s for half an hour, one
	// content then the other.
	window, every := 30*time.Minute, 5*time.Second
	failingStarts := 0
	for i, now := 0, start; now.Before(start.Add(window)); i, now = i+1, now.Add(every) {
		sum, outcome := working, error(nil)
		if i%2 == 0 {
			sum, outcome = failing, stalled
		}
		end, err := s.begin(key, sum, "r1", now, time.Second)
		if err != nil {
			require.ErrorAs(t, err, new(*startDeferredError))
			continue
		}
		if sum == failing {
			failingStarts++
		}
		end(now, bound, outcome)
	}
	// The waits double to 5 min (30 s, 1, 2, 4, then 5 each): about 11
	// waits in half an hour, and each lets the failing content in at most
	// twice (when it is over, and right after the other content let in
	// early has started). Every 10 s, as before, would be 180.
	assert.LessOrEqual(t, failingStarts, 24, "the failing content was started %d times in %s", failingStarts, window)
	assert.GreaterOrEqual(t, failingStarts, 5, "the failing content was not started once its waits were over")
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Equal(t, maxBackoff, s.failed[key].wait, "the count did not grow to the longest wait")
}

// A cluster deleted and made again under its name is held to the count of
// the one that went, and, as any cluster, woken when a sibling's watch gives
// its share of the tenant's bound back.
func TestAClusterMadeAgainIsWokenLikeAnyOther(t *testing.T) {
	var s remoteStarts
	key, sibling := types.NamespacedName{Namespace: "ns", Name: "c"}, types.NamespacedName{Namespace: "ns", Name: "sibling"}
	sum := sha256.Sum256([]byte("kubeconfig"))
	now := time.Unix(1_000_000, 0)
	together := fmt.Errorf("watch CSRs: %w", tenantBoundError{errors.New("the tenant's servers hold too many CSRs together")})
	end, err := s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, 30*time.Second, together)
	s.forget(key)
	_, err = s.begin(key, sum, "r1", now, time.Second)
	require.ErrorAs(t, err, new(*startDeferredError), "a cluster made again was started within the backoff")
	woken, ok := s.wake(sibling, now)
	require.True(t, ok, "a cluster made again was not woken")
	assert.Equal(t, key, woken)
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err, "the cluster woken was not started")
	end(now, 30*time.Second, nil)

	// Gone again, it is woken no more; made again after a quiet while,
	// it is counted afresh.
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, 30*time.Second, together)
	s.forget(key)
	_, ok = s.wake(sibling, now)
	assert.False(t, ok, "a cluster that went was woken")
	now = now.Add(time.Minute + maxBackoff + time.Second)
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, 30*time.Second, together)
	_, err = s.begin(key, sum, "r1", now, time.Second)
	var d *startDeferredError
	require.ErrorAs(t, err, &d)
	assert.Equal(t, 30*time.Second, d.wait, "the count of a cluster quiet after it went was kept")
}

// Review 8 M3: one start of a tenant at a time, and at most half the
// reconcile workers starting remote watches at once; the others come back
// after busyWait, and find room once a start ends, whatever its outcome.
func TestRemoteStartsAreBounded(t *testing.T) {
	var s remoteStarts
	now := time.Unix(1_000_000, 0)
	sum := sha256.Sum256([]byte("kubeconfig"))
	begin := func(ns, name string) (func(time.Time, time.Duration, error), error) {
		return s.begin(types.NamespacedName{Namespace: ns, Name: name}, sum, "r1", now, 5*time.Second)
	}
	endA, err := begin("a", "one")
	require.NoError(t, err)
	_, err = begin("a", "two")
	var d *startDeferredError
	require.ErrorAs(t, err, &d, "two starts of one tenant at once")
	assert.Equal(t, 5*time.Second, d.wait)
	endB, err := begin("b", "one")
	require.NoError(t, err)
	_, err = begin("c", "one")
	require.ErrorAs(t, err, &d, "more than half the reconcile workers starting remote watches")
	endA(now, time.Second, errors.New("stalled"))
	endC, err := begin("c", "one")
	require.NoError(t, err, "a start that failed did not give its room back")
	_, err = begin("a", "two")
	require.ErrorAs(t, err, &d, "a third start while two run")
	endB(now, time.Second, nil)
	endTwo, err := begin("a", "two")
	require.NoError(t, err, "the tenant's start that ended did not give its turn back")
	endTwo(now, time.Second, nil)
	endC(now, time.Second, nil)
	assert.Zero(t, s.running)
	assert.Empty(t, s.tenants)
}

// Review 11 M3: the tenants that found no room for a start are given it in
// the order they came: a tenant whose many clusters poll often does not win
// every free room over one that waits. A tenant that stops asking loses its
// place.
func TestTenantsWaitingForAStartAreServedInTurn(t *testing.T) {
	var s remoteStarts
	now := time.Unix(1_000_000, 0)
	sum := sha256.Sum256([]byte("kubeconfig"))
	begin := func(ns, name string) (func(time.Time, time.Duration, error), error) {
		return s.begin(types.NamespacedName{Namespace: ns, Name: name}, sum, "r1", now, 5*time.Second)
	}
	runs := func(ns, name string) func(time.Time, time.Duration, error) {
		t.Helper()
		end, err := begin(ns, name)
		require.NoError(t, err, "%s/%s did not start", ns, name)
		return end
	}
	waits := func(ns, name string) {
		t.Helper()
		_, err := begin(ns, name)
		var d *startDeferredError
		require.ErrorAs(t, err, &d, "%s/%s started out of turn", ns, name)
	}
	endA, endB := runs("hostile-a", "1"), runs("hostile-b", "1")
	waits("patient", "1")
	waits("late", "1")
	endA(now, time.Second, errors.New("stalled"))
	waits("hostile-a", "2") // polls first, but the patient tenant came before
	waits("late", "1")
	endP := runs("patient", "1")
	endB(now, time.Second, errors.New("stalled"))
	waits("hostile-b", "2")
	endL := runs("late", "1")
	endP(now, time.Second, nil)

	// hostile-a waits in line before hostile-b, but stops asking: after a
	// few of its waits, hostile-b, which keeps asking, is not held behind
	// it.
	now = now.Add(10 * time.Second)
	waits("hostile-b", "2")
	now = now.Add(10 * time.Second)
	end := runs("hostile-b", "2")
	end(now, time.Second, nil)
	endL(now, time.Second, nil)
	assert.Empty(t, s.waiting, "a tenant that started is kept in line")
}

// panickingJudge is a Decider whose kubeconfig rule panics.
type panickingJudge struct{ Decider }

func (panickingJudge) Kubeconfig(context.Context, engine.KubeconfigInput) (engine.KubeconfigDecision, error) {
	panic("the kubeconfig rule panicked")
}

// rotatedUnder is the fixture's remote cluster, started on one kubeconfig
// and then given another, which judge (wrapping the fixture's decider)
// is to judge at the cluster's next start.
func rotatedUnder(t *testing.T, f *queueFixture, judge func(Decider) Decider) *ichorv1alpha1.TalosCluster {
	t.Helper()
	return rotatedTo(t, f, []byte("rotated"), judge)
}

// rotatedTo is rotatedUnder with the kubeconfig rotated to data.
func rotatedTo(t *testing.T, f *queueFixture, data []byte, judge func(Decider) Decider) *ichorv1alpha1.TalosCluster {
	t.Helper()
	f.r.TenantRequestTimeout = 30 * time.Second
	secret := f.judgeRemotely(t, "kubeconfig", &target{cancel: func() {}}, engine.KubeconfigDecision{Allowed: true})
	ctx := context.Background()
	secret.Data[ichorv1alpha1.DefaultKubeconfigKey] = data
	require.NoError(t, f.r.Client.Update(ctx, secret))
	f.r.Engine = judge(f.r.Engine)
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	return &c
}

// Review 11: a start that panics (controller-runtime recovers the
// reconcile) gives its room back, and backs off as a failed one does.
func TestAStartThatPanicsGivesItsRoomBack(t *testing.T) {
	f := newQueueFixture(t, clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
	c := rotatedUnder(t, f, func(d Decider) Decider { return panickingJudge{d} })
	ctx := context.Background()

	require.Panics(t, func() { _, _ = f.r.targetFor(ctx, c) })
	s := &f.r.targets.starts
	s.mu.Lock()
	assert.Zero(t, s.running, "the start that panicked kept its room")
	assert.Empty(t, s.tenants, "the tenant of the start that panicked cannot start again")
	s.mu.Unlock()
	_, err := f.r.targetFor(ctx, c)
	var deferred *startDeferredError
	require.ErrorAs(t, err, &deferred, "a start that panicked is tried again at once")
	assert.ErrorIs(t, err, errStartPanicked)
	assert.Equal(t, 30*time.Second, deferred.wait)
}

// Review 11 L4: a start that fails on this side (the rule's evaluation, a
// broken bundle) is not the tenant's failure: it gives its room back, waits
// the request bound however often it fails, and the failures of the
// tenant's server before it still count.
func TestAStartThatFailsOnThisSideWaitsWithoutBackingOff(t *testing.T) {
	var s remoteStarts
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	sum := sha256.Sum256([]byte("kubeconfig"))
	now := time.Unix(1_000_000, 0)
	bound := 30 * time.Second
	stalled := errors.New("the cache did not sync")
	own := ownFailure{errors.New("evaluate the kubeconfig rule: the bundle is broken")}
	deferredFor := func() time.Duration {
		t.Helper()
		_, err := s.begin(key, sum, "r1", now, time.Second)
		var deferred *startDeferredError
		require.ErrorAs(t, err, &deferred)
		return deferred.wait
	}

	end, err := s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, stalled)
	now = now.Add(bound)
	for range 3 {
		end, err = s.begin(key, sum, "r1", now, time.Second)
		require.NoError(t, err, "a failure on this side backed the cluster off")
		end(now, bound, own)
		assert.Equal(t, bound, deferredFor(), "a failure on this side did not wait the request bound, once")
		now = now.Add(bound)
	}
	s.mu.Lock()
	assert.Zero(t, s.running, "a failure on this side kept its room")
	s.mu.Unlock()
	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, stalled)
	assert.Equal(t, 2*bound, deferredFor(), "the failures on this side counted in the tenant's backoff, or made its earlier failure forgotten")
}

type failingJudge struct{ Decider }

func (failingJudge) Kubeconfig(context.Context, engine.KubeconfigInput) (engine.KubeconfigDecision, error) {
	return engine.KubeconfigDecision{}, errors.New("evaluate: the bundle is broken")
}

// The kubeconfig rule's errors are this side's failures: the cluster is
// judged again after the request bound, which does not double.
func TestAKubeconfigRuleThatFailsIsAskedAgainAfterTheBound(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	f := newQueueFixture(t, clk)
	c := rotatedUnder(t, f, func(d Decider) Decider { return failingJudge{d} })
	failsOnThisSide(t, f, clk, c, "the bundle is broken")
}

// failsOnThisSide checks that c's start fails with want, as this side's
// failure, three times over, each asked again after the request bound (30
// s) and not before.
func failsOnThisSide(t *testing.T, f *queueFixture, clk *clocktesting.FakeClock, c *ichorv1alpha1.TalosCluster, want string) {
	t.Helper()
	ctx := context.Background()
	for range 3 {
		_, err := f.r.targetFor(ctx, c)
		require.ErrorContains(t, err, want)
		var own ownFailure
		require.ErrorAs(t, err, &own, "the rule's failure is not this side's")
		_, err = f.r.targetFor(ctx, c)
		var deferred *startDeferredError
		require.ErrorAs(t, err, &deferred, "a failure of the rule is asked again before the bound")
		assert.Equal(t, 30*time.Second, deferred.wait, "a failure of the rule backed the cluster off")
		clk.Step(30 * time.Second)
	}
}

// identityJudge asks for the server's identity on the document, and on the
// identity fails (err) or, when err is nil, asks for it again: the bundle is
// broken either way.
type identityJudge struct {
	Decider
	err error
}

func (j identityJudge) Kubeconfig(_ context.Context, in engine.KubeconfigInput) (engine.KubeconfigDecision, error) {
	if in.ServerIdentity == nil || j.err == nil {
		return engine.KubeconfigDecision{CheckIdentity: true, DecisionID: "d-1"}, nil
	}
	return engine.KubeconfigDecision{}, j.err
}

// The rule's failures on its second evaluation, once the server's identity
// was probed (an error, or a decision asking for the identity it was given),
// are this side's failures too: the bound, every time, and no backoff. The
// tenant's server and the manager's own are TLS servers of this test: the
// probe is a real handshake.
func TestAKubeconfigRuleThatFailsOnTheServersIdentityIsAskedAgainAfterTheBound(t *testing.T) {
	// The probe closes each connection after the handshake, which the
	// servers would log.
	server := func() *httptest.Server {
		s := httptest.NewUnstartedServer(http.NotFoundHandler())
		s.Config.ErrorLog = log.New(io.Discard, "", 0)
		s.StartTLS()
		t.Cleanup(s.Close)
		return s
	}
	tenant, own := server(), server()
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: tenant
  cluster:
    server: %s
contexts:
- name: tenant
  context:
    cluster: tenant
    user: tenant
current-context: tenant
users:
- name: tenant
  user:
    token: not-sent
`, tenant.URL)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"the rule fails", errors.New("evaluate: the bundle is broken"), "the bundle is broken"},
		{"the rule asks for the identity again", nil, "asks for the server's identity, which it was given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
			f := newQueueFixture(t, clk)
			f.r.LocalAPIServer = &kubeconfig.Local{Config: &rest.Config{Host: own.URL, TLSClientConfig: rest.TLSClientConfig{
				CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: own.Certificate().Raw}),
			}}}
			c := rotatedTo(t, f, []byte(kc), func(d Decider) Decider { return identityJudge{d, tc.err} })
			failsOnThisSide(t, f, clk, c, tc.want)
		})
	}
}

// A cluster refused for what its tenant's servers hold together is
// reconciled as soon as another of the tenant's watches stops and gives its
// share back, not after its backoff: one cluster per stop, the one due
// soonest, its failures still counted (review 34 H1: two clusters that
// take turns at crossing the bound would otherwise restart each other
// without a backoff). Clusters of other tenants, a cluster refused for its
// own server's size, one whose watch crossed the bound after its start,
// and the cluster whose watch stopped are left to their backoff.
func TestAWatchThatStopsWakesOneClusterItsShareKeptOut(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	r := &Reconciler{rejudge: make(chan event.TypedGenericEvent[types.NamespacedName], 8), Clock: clocktesting.NewFakePassiveClock(now)}
	sum := sha256.Sum256([]byte("kubeconfig"))
	bound := 30 * time.Second
	together := fmt.Errorf("watch CSRs of cluster: %w", tenantBoundError{errors.New("the API servers of the clusters of namespace ns hold more than 500 CSRs together")})
	alone := errors.New("the API server of cluster ns/big holds more than 500 CSRs")
	stopped := types.NamespacedName{Namespace: "ns", Name: "held"}
	first := types.NamespacedName{Namespace: "ns", Name: "first"}
	second := types.NamespacedName{Namespace: "ns", Name: "second"}
	grown := types.NamespacedName{Namespace: "ns", Name: "grown"}
	big := types.NamespacedName{Namespace: "ns", Name: "big"}
	elsewhere := types.NamespacedName{Namespace: "other", Name: "left"}
	for key, err := range map[types.NamespacedName]error{stopped: together, big: alone, elsewhere: together} {
		r.targets.starts.fail(key, sum, "r1", now, bound, err)
	}
	end, err := r.targets.starts.begin(first, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, together) // first: 30 s
	end, err = r.targets.starts.begin(second, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, bound, together)
	end, err = r.targets.starts.begin(second, sum, "r1", now.Add(bound), time.Second)
	require.NoError(t, err)
	end(now, bound, together) // second: 60 s, due after first
	r.targets.starts.fail(grown, sum, "r1", now, bound, together)

	deferred := func(key types.NamespacedName) bool {
		_, err := r.targets.starts.begin(key, sum, "r1", now, time.Second)
		var d *startDeferredError
		return errors.As(err, &d)
	}
	woken := func() types.NamespacedName {
		select {
		case e := <-r.rejudge:
			return e.Object
		case <-time.After(10 * time.Second):
			t.Fatal("no cluster left out was reconciled")
			return types.NamespacedName{}
		}
	}
	rt := &target{cancel: func() {}, stopped: sync.OnceFunc(func() { r.wakeTenant(stopped) })}
	rt.stop()
	assert.Equal(t, first, woken(), "not the cluster due soonest")
	for _, key := range []types.NamespacedName{stopped, second, grown, big, elsewhere} {
		assert.True(t, deferred(key), "%s no longer waits for its backoff", key)
	}
	end, err = r.targets.starts.begin(first, sum, "r1", now, time.Second)
	require.NoError(t, err, "the cluster woken still waits for its backoff")
	end(now.Add(time.Second), bound, together)
	_, err = r.targets.starts.begin(first, sum, "r1", now.Add(bound+2*time.Second), time.Second)
	assert.Error(t, err, "a woken cluster that fails again backs off as if it had not been woken")

	// Another watch stops: the one left out due soonest now, the second,
	// is woken.
	other := &target{cancel: func() {}, stopped: sync.OnceFunc(func() { r.wakeTenant(big) })}
	other.stop()
	assert.Equal(t, second, woken())
}

// A cluster whose watch waits for its turn to start (its tenant's other
// start holds the room) says that nothing is decided there: its kubeconfig
// rotated, the watch of the old one is gone. Before review 203 (F2) the
// reconcile wrote nothing, and Ready went on saying the requests were
// decided.
func TestAClusterWaitingForItsWatchToStartSaysSo(t *testing.T) {
	f := newQueueFixture(t, clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
	c := rotatedUnder(t, f, func(d Decider) Decider { return d })
	ctx := context.Background()
	setReady(c, reachability{})
	require.NoError(t, f.r.Client.Status().Update(ctx, c))

	// The tenant's one start at a time, held by a sibling cluster.
	sibling := types.NamespacedName{Namespace: f.cluster.Namespace, Name: "sibling"}
	end, err := f.r.targets.starts.begin(sibling, sha256.Sum256([]byte("sibling")), "r1", f.r.Clock.Now(), time.Second)
	require.NoError(t, err)
	defer end(f.r.Clock.Now(), time.Second, nil)

	res, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Positive(t, res.RequeueAfter, "the start is tried again")
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, c))
	cond := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	require.NotNil(t, cond)
	assert.Equal(t, metav1.ConditionFalse, cond.Status)
	assert.Equal(t, ReasonRemoteWatchStarting, cond.Reason)
	ready := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, metav1.ConditionFalse, ready.Status)
	assert.Equal(t, ReasonRemoteWatchStarting, ready.Reason)
	assert.Contains(t, ready.Message, "the cluster's requests are not decided yet: ")
	assert.Contains(t, ready.Message, "other watches of API servers are starting")
}

// A start that waits for room after a failed start of the same content,
// whose wait is over, carries that failure, so the cluster goes on saying
// it rather than flapping to RemoteWatchStarting and back at each backoff;
// after a start that worked, it carries none (review 205 F5).
func TestAStartWaitingForRoomAfterAFailureSaysTheFailure(t *testing.T) {
	var s remoteStarts
	key := types.NamespacedName{Namespace: "ns", Name: "c"}
	sibling := types.NamespacedName{Namespace: "ns", Name: "sibling"}
	sum, other := sha256.Sum256([]byte("kubeconfig")), sha256.Sum256([]byte("sibling"))
	now := time.Unix(1_000_000, 0)
	stalled := errors.New("the cache did not sync")
	waitsWith := func() error {
		t.Helper()
		hold, err := s.begin(sibling, other, "r1", now, time.Second)
		require.NoError(t, err)
		defer hold(now, time.Second, nil)
		_, err = s.begin(key, sum, "r1", now, time.Second)
		var deferred *startDeferredError
		require.ErrorAs(t, err, &deferred)
		return deferred.cause
	}

	end, err := s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, time.Second, stalled)
	now = now.Add(time.Minute)
	assert.Equal(t, stalled, waitsWith(), "the failure is not said while the start waits for room")

	end, err = s.begin(key, sum, "r1", now, time.Second)
	require.NoError(t, err)
	end(now, time.Second, nil)
	assert.NoError(t, waitsWith(), "a failure said after a start that worked")
}

// A cluster whose kubeconfig is refused under the bundle in service says so
// at every reconcile, whether the room for starts is busy or not: the
// refusal needs no start (review 209 F1: it flipped to RemoteWatchStarting
// while another start held the room).
func TestARefusedKubeconfigIsSaidWithoutWaitingForRoom(t *testing.T) {
	f := newQueueFixture(t, clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
	refused := engine.KubeconfigDecision{Reasons: engine.Reasons{{Code: "KubeconfigExecPlugin", Message: "an exec plugin"}}, DecisionID: "d-1"}
	f.judgeRemotely(t, "kubeconfig", &target{cancel: func() {}}, refused)
	// A refusal ends the watch: the next reconcile finds none.
	f.r.targets.remote = map[types.NamespacedName]*target{}
	ctx := context.Background()

	sibling := types.NamespacedName{Namespace: f.cluster.Namespace, Name: "sibling"}
	end, err := f.r.targets.starts.begin(sibling, sha256.Sum256([]byte("sibling")), "", f.r.Clock.Now(), time.Second)
	require.NoError(t, err)
	defer end(f.r.Clock.Now(), time.Second, nil)

	_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	cond := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
	require.NotNil(t, cond)
	assert.Equal(t, ReasonKubeconfigRefused, cond.Reason)
	assert.Contains(t, cond.Message, "KubeconfigExecPlugin")
}
