package kubeletserving

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

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
