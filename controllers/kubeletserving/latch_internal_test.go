package kubeletserving

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
)

// TestTheLatchGoesWhenVerificationIsSwitchedOffWhileTheServerIsRefused
// (review 247, F1): ADR 0125 removes KubeletServingVerified when
// verifyFromAPIServer is switched off. Switched off while the cluster's
// API server was refused (or its kubeconfig Secret unanswered), the latch
// stayed; switched on again, it rendered --kubelet-certificate-authority
// at once, for machines that had joined meanwhile without a certificate,
// whose logs and exec it broke.
func TestTheLatchGoesWhenVerificationIsSwitchedOffWhileTheServerIsRefused(t *testing.T) {
	ctx := context.Background()
	// setVerify sets the option and the latch as an earlier reconcile
	// left it.
	setVerify := func(t *testing.T, f *queueFixture, verify bool) {
		t.Helper()
		var c ichorv1alpha1.TalosCluster
		require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
		c.Spec.Security.KubeletServingCertificates.VerifyFromAPIServer = verify
		require.NoError(t, f.r.Client.Update(ctx, &c))
		require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{
			Type: ichorv1alpha1.ConditionKubeletServingVerified, Status: metav1.ConditionTrue,
			Reason: ichorv1alpha1.ReasonVerificationLatched, Message: "latched", ObservedGeneration: c.Generation,
		})
		require.NoError(t, f.r.Client.Status().Update(ctx, &c))
	}
	latched := func(t *testing.T, f *queueFixture) bool {
		t.Helper()
		var c ichorv1alpha1.TalosCluster
		require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
		return meta.IsStatusConditionTrue(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)
	}

	t.Run("refused", func(t *testing.T) {
		f := newQueueFixture(t, clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
		f.r.APIReader = f.r.Client
		var c ichorv1alpha1.TalosCluster
		require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
		c.Spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "gone"}
		require.NoError(t, f.r.Client.Update(ctx, &c))

		setVerify(t, f, true)
		_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
		require.NoError(t, err)
		assert.True(t, latched(t, f), "a refusal alone took the latch away")
		require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
		require.Equal(t, ReasonKubeconfigUnreadable, meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates).Reason, "not the refused path")

		setVerify(t, f, false)
		_, err = f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
		require.NoError(t, err)
		assert.False(t, latched(t, f), "the latch outlived verification switched off")
	})

	t.Run("its kubeconfig Secret unanswered", func(t *testing.T) {
		f := newQueueFixture(t, clocktesting.NewFakeClock(time.Unix(1_000_000, 0)))
		tg := &target{reader: f.r.Client, clientset: f.csrs, names: &nodeNames{}, cancel: func() {}}
		f.judgeRemotely(t, "kubeconfig", tg, engine.KubeconfigDecision{Allowed: true})
		f.r.APIReader = interceptor.NewClient(f.r.Client.(client.WithWatch), interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*corev1.Secret); ok {
					return apierrors.NewServiceUnavailable("etcd leader changed")
				}
				return c.Get(ctx, key, obj, opts...)
			},
		})
		setVerify(t, f, false)
		res, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: f.cluster})
		require.NoError(t, err)
		require.Equal(t, kubeconfigReadRetry, res.RequeueAfter, "not the path of a Secret unanswered for a moment")
		assert.False(t, latched(t, f), "the latch outlived verification switched off")
	})
}

// TestAnUnreachableTalosAPIKeptAfterARestartIsLookedAtAgainInTime (review
// 248): kept from before the restart, Ready is looked at again when the
// reads have had their time, not at the next resync, which an operator may
// have set to half an hour.
func TestAnUnreachableTalosAPIKeptAfterARestartIsLookedAtAgainInTime(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clocktesting.NewFakeClock(t0))
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	since := metav1.NewTime(t0.Add(-time.Hour))
	c.Status.Conditions = []metav1.Condition{{
		Type: ichorv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ichorv1alpha1.ReasonTalosAPIUnreachable,
		Message: "no machine's Talos API answered", LastTransitionTime: since, ObservedGeneration: c.Generation,
	}}
	require.NoError(t, f.r.Client.Status().Update(ctx, &c))

	next, err := f.r.updateConditions(ctx, &c, nil, t0, 0)
	require.NoError(t, err)
	assert.Equal(t, readFreshness, next, "not looked at again when the reads have had their time")
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	ready := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, ichorv1alpha1.ReasonTalosAPIUnreachable, ready.Reason)
	assert.True(t, since.Equal(&ready.LastTransitionTime), "its time changed")

	// Once they have, with nothing read, it is True again.
	next, err = f.r.updateConditions(ctx, &c, nil, t0.Add(readFreshness), 0)
	require.NoError(t, err)
	assert.Zero(t, next)
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	assert.True(t, meta.IsStatusConditionTrue(c.Status.Conditions, ichorv1alpha1.ConditionReady))
}

// TestTheLatchSaysItHoldsForTheSpecAsItIs (review 247, F6): the latched
// condition kept the generation it latched at while the others moved on,
// so a tool comparing generations read it as of an older spec.
func TestTheLatchSaysItHoldsForTheSpecAsItIs(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clocktesting.NewFakeClock(t0))
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	c.Spec.Security.KubeletServingCertificates.VerifyFromAPIServer = true
	require.NoError(t, f.r.Client.Update(ctx, &c))
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	since := metav1.NewTime(t0.Add(-time.Hour))
	c.Status.Conditions = []metav1.Condition{{
		Type: ichorv1alpha1.ConditionKubeletServingVerified, Status: metav1.ConditionTrue, Reason: ichorv1alpha1.ReasonVerificationLatched,
		Message: "latched", LastTransitionTime: since, ObservedGeneration: 1,
	}}
	require.NoError(t, f.r.Client.Status().Update(ctx, &c))
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	c.Generation = 4 // the spec changed three times since it latched

	_, err := f.r.updateConditions(ctx, &c, nil, t0, 0)
	require.NoError(t, err)
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	latch := meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)
	require.NotNil(t, latch)
	assert.Equal(t, metav1.ConditionTrue, latch.Status, "a machine waiting took the latch away")
	assert.EqualValues(t, 4, latch.ObservedGeneration)
	assert.True(t, since.Equal(&latch.LastTransitionTime), "its time changed")
}
