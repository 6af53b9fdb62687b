package kubeletserving

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// revisionDecider refuses every kubeconfig, under the revision it is told,
// and answers limits that count its askings.
type revisionDecider struct {
	revision    string
	asked       int
	limitsAsked int
}

func (d *revisionDecider) Revision() string { return d.revision }

func (d *revisionDecider) Kubeconfig(context.Context, engine.KubeconfigInput) (engine.KubeconfigDecision, error) {
	d.asked++
	return engine.KubeconfigDecision{Allowed: false, Revision: d.revision, DecisionID: "d"}, nil
}

func (d *revisionDecider) KubeletServing(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error) {
	panic("not asked")
}

func (d *revisionDecider) KubeletServingRejection(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error) {
	panic("not asked")
}

func (d *revisionDecider) KubeletServingLimits(context.Context) (engine.KubeletServingLimits, error) {
	d.limitsAsked++
	return engine.KubeletServingLimits{MaxUndecidedPerRequester: d.limitsAsked}, nil
}

func (d *revisionDecider) RecordApplied(context.Context, engine.Applied) error {
	panic("not asked")
}

// A verdict lasts as long as its content and the bundle that gave it: a new
// bundle judges the same kubeconfig again.
func TestKubeconfigVerdictIsJudgedAgainByANewBundle(t *testing.T) {
	d := &revisionDecider{revision: "r1"}
	r := &Reconciler{Engine: d}
	c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	data := []byte("apiVersion: v1\nkind: Config\n")
	sum := sha256.Sum256(data)
	judge := func() {
		t.Helper()
		_, err := r.judgeKubeconfig(t.Context(), c, sum, data, r.revision())
		var refused *KubeconfigRefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, d.revision, refused.Decision.Revision)
	}
	judge()
	judge()
	assert.Equal(t, 1, d.asked, "the same content under the same bundle was judged again")
	d.revision = "r2"
	judge()
	assert.Equal(t, 2, d.asked, "a new bundle did not judge the kubeconfig again")
	judge()
	assert.Equal(t, 2, d.asked)
	assert.Zero(t, d.limitsAsked, "judging a kubeconfig asks for no limits")
}

// bundleDecider is a decider whose active bundle revision a test sets.
type bundleDecider struct {
	*decider
	rev string
}

func (d *bundleDecider) Revision() string { return d.rev }

// Review 6 M1: a worker decides through a cluster's remote target only while
// its kubeconfig Secret still holds the content the target was started with,
// judged by the active bundle. A Secret rotated, deleted, or a new bundle
// takes effect before the next decision, not at the cluster's next resync.
func TestAWorkerDecidesNothingThroughAKubeconfigNoLongerJudged(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change is what happens after the target was started.
		change func(t *testing.T, f *queueFixture, dec *bundleDecider, s *corev1.Secret)
		// kept: the watch itself stays (only its verdict is to be renewed).
		kept bool
	}{
		{name: "Secret rotated", change: func(t *testing.T, f *queueFixture, _ *bundleDecider, s *corev1.Secret) {
			s.Data[ichorv1alpha1.DefaultKubeconfigKey] = []byte("after")
			require.NoError(t, f.r.Client.Update(context.Background(), s))
		}},
		{name: "Secret deleted", change: func(t *testing.T, f *queueFixture, _ *bundleDecider, s *corev1.Secret) {
			require.NoError(t, f.r.Client.Delete(context.Background(), s))
		}},
		{name: "new bundle", kept: true, change: func(_ *testing.T, _ *queueFixture, dec *bundleDecider, _ *corev1.Secret) {
			dec.rev = "r2"
		}},
		// The new bundle judged the document, and has not yet identified
		// the server (its probe takes up to 10 s), or refused it: nothing is
		// decided meanwhile (the hostile review of 2026-12-05).
		{name: "new bundle, the server not yet identified by it", kept: true, change: func(_ *testing.T, f *queueFixture, dec *bundleDecider, _ *corev1.Secret) {
			dec.rev = "r2"
			judgedBy(f, engine.KubeconfigDecision{Allowed: true, CheckIdentity: true, Revision: "r2"}, nil)
		}},
		{name: "new bundle, the server refused", kept: true, change: func(_ *testing.T, f *queueFixture, dec *bundleDecider, _ *corev1.Secret) {
			dec.rev = "r2"
			judgedBy(f, engine.KubeconfigDecision{Allowed: true, CheckIdentity: true, Revision: "r2"}, &engine.KubeconfigDecision{Allowed: false, Revision: "r2"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1_000_000, 0)
			f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:x", "csr-x", t0))
			dec := &bundleDecider{decider: f.dec, rev: "r1"}
			f.r.Engine = dec
			ctx := context.Background()
			// The target and verdict a reconcile left: "before", allowed by r1.
			tg := &target{reader: f.r.Client, clientset: f.csrs, names: &nodeNames{}, cancel: func() {}}
			secret := f.judgeRemotely(t, "before", tg, engine.KubeconfigDecision{Allowed: true, Revision: "r1"})

			tc.change(t, f, dec, secret)
			f.add("system:node:x")
			require.True(t, f.r.next(ctx))
			assert.False(t, f.approved(t, "csr-x"), "decided through a kubeconfig no longer judged")
			assert.Empty(t, f.dec.calls(), "decided through a kubeconfig no longer judged")
			f.r.targets.mu.Lock()
			_, still := f.r.targets.remote[f.cluster]
			f.r.targets.mu.Unlock()
			assert.Equal(t, tc.kept, still, "the watch kept")
		})
	}
	// Unchanged, the same target decides (the check refuses nothing more).
	t.Run("unchanged", func(t *testing.T) {
		t0 := time.Unix(1_000_000, 0)
		f := newQueueFixture(t, clock.RealClock{}, csrOf("system:node:x", "csr-x", t0))
		ctx := context.Background()
		f.judgeRemotely(t, "before", &target{reader: f.r.Client, clientset: f.csrs, names: &nodeNames{}, cancel: func() {}},
			engine.KubeconfigDecision{Allowed: true})
		f.add("system:node:x")
		require.True(t, f.r.next(ctx))
		assert.True(t, f.approved(t, "csr-x"))
	})
}

// judgedBy replaces the fixture's kubeconfig verdict with the rule's
// decision on the document and its final one (nil: not yet given).
func judgedBy(f *queueFixture, document engine.KubeconfigDecision, final *engine.KubeconfigDecision) {
	f.r.targets.mu.Lock()
	defer f.r.targets.mu.Unlock()
	v := *f.r.targets.verdicts[f.cluster]
	v.document, v.final = document, final
	f.r.targets.verdicts[f.cluster] = &v
}

// Review 191 F4: a read of a cluster's kubeconfig Secret that gets no answer
// (the API server busy or unreachable for a moment) decides nothing through
// the cluster's watch, but does not end it: ending it had each such moment
// list the tenant's CSRs again, and say the cluster unreadable. A minute of
// such reads, or an answer that the Secret is gone, ends it as before.
func TestAKubeconfigSecretUnreadableForAMomentKeepsItsWatch(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	f := newQueueFixture(t, clk, csrOf("system:node:x", "csr-x", t0))
	dec := &bundleDecider{decider: f.dec, rev: "r1"}
	f.r.Engine = dec
	ctx := context.Background()
	var stops atomic.Int32
	tg := &target{reader: f.r.Client, clientset: f.csrs, names: &nodeNames{}, cancel: func() { stops.Add(1) }}
	secret := f.judgeRemotely(t, "before", tg, engine.KubeconfigDecision{Allowed: true, Revision: "r1"})
	var unanswered atomic.Bool
	var reads atomic.Int32
	f.r.APIReader = interceptor.NewClient(f.r.Client.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				reads.Add(1)
				if unanswered.Load() {
					return apierrors.NewServiceUnavailable("etcd leader changed")
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	kept := func() bool {
		f.r.targets.mu.Lock()
		defer f.r.targets.mu.Unlock()
		return f.r.targets.remote[f.cluster] == tg
	}
	reason := func() string {
		var c ichorv1alpha1.TalosCluster
		require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
		if cond := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates); cond != nil {
			return cond.Reason
		}
		return ""
	}
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))

	unanswered.Store(true)
	// A worker decides nothing, and leaves the watch.
	assert.False(t, f.r.targetStillAllowed(ctx, &c, tg), "decided through a kubeconfig not read")
	assert.True(t, kept(), "the watch ended for a read without an answer")
	// The cluster's reconcile keeps it too, and looks again soon.
	res, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.Equal(t, kubeconfigReadRetry, res.RequeueAfter)
	assert.True(t, kept(), "the watch ended for a read without an answer")
	assert.NotEqual(t, ReasonKubeconfigUnreadable, reason(), "the cluster said unreadable for a moment's failure")
	assert.Zero(t, stops.Load())
	// Meanwhile the reconcile reads the Secret, every few seconds; a
	// worker adds no read of its own to a server that does not answer.
	before := reads.Load()
	assert.False(t, f.r.targetStillAllowed(ctx, &c, tg))
	assert.Equal(t, before, reads.Load(), "a worker read the Secret while the reconcile polls it")

	// Read again: the moment is over, and the next one is given its own.
	unanswered.Store(false)
	got, err := f.r.targetFor(ctx, &c)
	require.NoError(t, err)
	assert.Same(t, tg, got)
	unanswered.Store(true)
	clk.Step(kubeconfigReadTolerance / 2)
	_, err = f.r.targetFor(ctx, &c)
	var failing *kubeconfigReadFailingError
	require.ErrorAs(t, err, &failing)

	// A minute of it ends the watch, and the cluster says why.
	clk.Step(kubeconfigReadTolerance)
	_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
	require.NoError(t, err)
	assert.False(t, kept(), "the watch outlived a minute without a word on its Secret")
	assert.Equal(t, ReasonKubeconfigUnreadable, reason())
	assert.Equal(t, int32(1), stops.Load())

	// An answer that the Secret is gone is no moment's failure.
	tg2 := &target{reader: f.r.Client, clientset: f.csrs, names: &nodeNames{}, cancel: func() {}}
	f.r.targets.mu.Lock()
	f.r.targets.remote[f.cluster] = tg2
	f.r.targets.mu.Unlock()
	unanswered.Store(false)
	require.NoError(t, f.r.Client.Delete(ctx, secret))
	_, err = f.r.targetFor(ctx, &c)
	require.Error(t, err)
	assert.False(t, errors.As(err, &failing), "a Secret gone kept the watch: %v", err)
}
