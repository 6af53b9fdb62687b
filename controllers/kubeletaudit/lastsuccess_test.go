package kubeletaudit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletaudit"
)

// gaugeValue is the value of a gauge without labels in reg; -1 when reg
// has none of that name.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestTheAuditSaysWhenItLastSucceeded: the time of the last pass that
// succeeded is a gauge, 0 until one has; a pass that fails (the clusters
// cannot be listed, a cluster cannot be audited) leaves it where it was, so
// an audit that stops succeeding ages it and the alert fires. The leader
// exports its interval, which the alert's default threshold is made of.
func TestTheAuditSaysWhenItLastSucceeded(t *testing.T) {
	const lastSuccess = "ichor_kubelet_serving_audit_last_success_timestamp_seconds"
	scheme := runtime.NewScheme()
	require.NoError(t, ichorv1alpha1.AddToScheme(scheme))
	var listFails, machineListFails bool
	cl := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			_, machines := list.(*ichorv1alpha1.TalosMachineList)
			if listFails || machineListFails && machines {
				return errors.New("the API server is away")
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	reg := prometheus.NewRegistry()
	metrics, err := kubeletaudit.NewMetrics(reg)
	require.NoError(t, err)
	r := &kubeletaudit.Runner{
		Auditor:  &kubeletaudit.Auditor{Reader: cl},
		Client:   cl,
		Metrics:  metrics,
		Interval: time.Hour,
	}
	assert.Zero(t, gaugeValue(t, reg, lastSuccess), "no pass has succeeded yet")
	assert.Zero(t, gaugeValue(t, reg, "ichor_kubelet_serving_audit_interval_seconds"), "not the leader yet")

	// The leader starts: it says its interval, and its first pass, at once,
	// succeeds (there is nothing to audit).
	before := time.Now()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		return gaugeValue(t, reg, lastSuccess) > 0, nil
	}), "the first pass did not succeed")
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, time.Hour.Seconds(), gaugeValue(t, reg, "ichor_kubelet_serving_audit_interval_seconds"))
	first := gaugeValue(t, reg, lastSuccess)
	assert.GreaterOrEqual(t, first, float64(before.UnixNano())/1e9)
	assert.LessOrEqual(t, first, float64(time.Now().UnixNano())/1e9)

	// A pass that cannot list the clusters fails: the time stays.
	listFails = true
	require.Error(t, r.Pass(t.Context()))
	assert.Equal(t, first, gaugeValue(t, reg, lastSuccess))
	listFails = false

	// A cluster whose secrets bundle cannot be read is an error of its own,
	// which its gauges say (status="error", alerted for that cluster): the
	// pass goes on and completes, and the time moves on (review of
	// 2026-12-06: one tenant's broken Secret kept the fleet's alert firing).
	require.NoError(t, cl.Create(t.Context(), &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "blind", Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "gone"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
				Enabled: true,
			}},
		},
	}))
	require.ErrorContains(t, r.Pass(t.Context()), "gone")
	second := gaugeValue(t, reg, lastSuccess)
	assert.Greater(t, second, first)

	// A cluster whose machines cannot be listed (the clusters can) fails
	// the pass: no gauge of its says anything (review 169: the step failed
	// every list, so the pass failed at the clusters').
	machineListFails = true
	require.ErrorContains(t, r.Pass(t.Context()), "cluster blind/demo")
	assert.Equal(t, second, gaugeValue(t, reg, lastSuccess))
	machineListFails = false

	// Put right, the next pass succeeds and the time moves on.
	require.NoError(t, cl.Delete(t.Context(), &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "blind", Name: "demo"}}))
	require.NoError(t, r.Pass(t.Context()))
	assert.Greater(t, gaugeValue(t, reg, lastSuccess), second)
	n, err := testutil.GatherAndCount(reg, lastSuccess)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one series, without labels")
}
