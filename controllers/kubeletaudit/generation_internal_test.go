package kubeletaudit

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// A verdict reached on the machine as the pass listed it is not written as
// observed for a spec changed since (its endpoint moved): GitOps tools and
// kstatus would read a condition for a generation never audited (review
// 169). The next pass audits the new spec.
func TestAVerdictIsNotSaidOfASpecChangedSince(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, ichorv1alpha1.AddToScheme(scheme))
	listed := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "m-1", Generation: 1},
		Spec: ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Endpoint: "10.0.0.1"}}
	now := listed.DeepCopy()
	now.Generation, now.Spec.Endpoint = 2, "10.0.0.2"
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(now).WithStatusSubresource(now).Build()
	r := &Runner{Client: cl}

	require.NoError(t, r.setErrorCondition(t.Context(), listed, errors.New("the node did not answer")))
	var got ichorv1alpha1.TalosMachine
	require.NoError(t, cl.Get(t.Context(), client.ObjectKeyFromObject(now), &got))
	assert.Nil(t, meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificateCurrent),
		"a verdict on generation 1 was written for generation 2")

	// Of the spec it was reached on, it is written.
	require.NoError(t, r.setErrorCondition(t.Context(), &got, errors.New("the node did not answer")))
	require.NoError(t, cl.Get(t.Context(), client.ObjectKeyFromObject(now), &got))
	c := meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificateCurrent)
	require.NotNil(t, c)
	assert.Equal(t, int64(2), c.ObservedGeneration)
}

// The machines of a cluster no longer audited (kubelet serving turned off,
// or the cluster being deleted) lose the audit's condition: its last
// verdict, True or False, would stand for ever with nothing checking it
// (review 169). Another condition of theirs stays.
func TestAClusterNoLongerAuditedLeavesNoVerdict(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, ichorv1alpha1.AddToScheme(scheme))
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "s"}}}
	machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "m-1"},
		Spec: ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Endpoint: "10.0.0.1"},
		Status: ichorv1alpha1.TalosMachineStatus{Conditions: []metav1.Condition{
			{Type: ichorv1alpha1.ConditionKubeletServingCertificateCurrent, Status: metav1.ConditionTrue, Reason: "CertificateCurrent", LastTransitionTime: metav1.Now()},
			{Type: "Other", Status: metav1.ConditionTrue, Reason: "Other", LastTransitionTime: metav1.Now()},
		}}}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cluster, machine).WithStatusSubresource(machine).Build()
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	r := &Runner{Client: cl, Auditor: &Auditor{Reader: cl}, Metrics: metrics}

	require.NoError(t, r.Pass(t.Context()))
	var got ichorv1alpha1.TalosMachine
	require.NoError(t, cl.Get(t.Context(), client.ObjectKeyFromObject(machine), &got))
	assert.Nil(t, meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificateCurrent),
		"the verdict of a cluster no longer audited stayed")
	assert.NotNil(t, meta.FindStatusCondition(got.Status.Conditions, "Other"))
}
