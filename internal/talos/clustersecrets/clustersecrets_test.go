package clustersecrets_test

import (
	"context"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
)

func bundle(t *testing.T) *secrets.Bundle {
	t.Helper()
	b, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), config.TalosVersionCurrent)
	require.NoError(t, err)
	return b
}

func TestParseRoundTripsTalosctlFormat(t *testing.T) {
	b := bundle(t)
	data, err := clustersecrets.Marshal(b)
	require.NoError(t, err)
	assert.Contains(t, string(data), "certs:")

	got, err := clustersecrets.Parse(data)

	require.NoError(t, err)
	assert.Equal(t, b.Certs.OS.Crt, got.Certs.OS.Crt)
	assert.Equal(t, b.Certs.K8s.Key, got.Certs.K8s.Key)
}

func TestParseRefusesWhatIsNotABundle(t *testing.T) {
	for name, data := range map[string]string{
		"empty":        "",
		"other YAML":   "apiVersion: v1\nkind: Secret\n",
		"no OS CA":     "certs:\n  k8s:\n    crt: YQ==\n    key: YQ==\n",
		"no certs":     "cluster:\n  id: x\n",
		"not YAML":     "\t{{",
		"unknown keys": "certs: {}\nfoo: bar\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := clustersecrets.Parse([]byte(data))
			assert.Error(t, err)
		})
	}
}

func TestLoadReadsCurrentAndPrevious(t *testing.T) {
	current, previous := bundle(t), bundle(t)
	cur, err := clustersecrets.Marshal(current)
	require.NoError(t, err)
	prev, err := clustersecrets.Marshal(previous)
	require.NoError(t, err)
	scheme := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo-secrets"},
		Data:       map[string][]byte{"secrets.yaml": cur, clustersecrets.PreviousKey: prev},
	}).Build()
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo"}}
	cluster.Spec.SecretsRef.Name = "demo-secrets"

	got, err := clustersecrets.Load(context.Background(), c, cluster)

	require.NoError(t, err)
	assert.Equal(t, current.Certs.OS.Crt, got.Current.Certs.OS.Crt)
	require.NotNil(t, got.Previous)
	assert.Equal(t, previous.Certs.OS.Crt, got.Previous.Certs.OS.Crt)

	cluster.Spec.SecretsRef.Key = "missing"
	_, err = clustersecrets.Load(context.Background(), c, cluster)
	assert.ErrorContains(t, err, `Secret "demo-secrets" has no key "missing"`)
	cluster.Spec.SecretsRef.Name = "absent"
	_, err = clustersecrets.Load(context.Background(), c, cluster)
	assert.ErrorContains(t, err, `get Secret "absent"`)
}
