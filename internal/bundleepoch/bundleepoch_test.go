package bundleepoch_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
)

func TestTheRecordedEpochOnlyGrows(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithObjects(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ichor-system", Name: bundleepoch.ConfigMapName}}).Build()
	s := &bundleepoch.Store{Client: c, Namespace: "ichor-system"}
	n, err := s.Highest(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "the chart creates it empty")
	require.NoError(t, s.Raise(ctx, 3))
	require.NoError(t, s.Raise(ctx, 2), "a lower epoch is no error")
	n, err = s.Highest(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "and does not lower it")
}

func TestAMissingOrCorruptRecordIsAnError(t *testing.T) {
	ctx := context.Background()
	_, err := (&bundleepoch.Store{Client: fake.NewClientBuilder().Build(), Namespace: "ichor-system"}).Highest(ctx)
	require.ErrorContains(t, err, "the chart creates it")
	c := fake.NewClientBuilder().WithObjects(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ichor-system", Name: bundleepoch.ConfigMapName},
		Data:       map[string]string{bundleepoch.Key: "soon"},
	}).Build()
	_, err = (&bundleepoch.Store{Client: c, Namespace: "ichor-system"}).Highest(ctx)
	require.ErrorContains(t, err, "not a non-negative integer")
}
