package kubeletaudit

import (
	"errors"
	"testing"

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
