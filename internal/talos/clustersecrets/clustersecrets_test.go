package clustersecrets_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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

// A cluster in a namespace where the chart gave the manager no get on
// Secrets fails with the API server's Forbidden, and says which value grants
// the read; any other failure is left as it is.
func TestLoadSaysWhichValueGrantsAForbiddenRead(t *testing.T) {
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "demo"},
		Spec:       ichorv1alpha1.TalosClusterSpec{SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"}},
	}
	refuse := func(err error) client.Reader {
		return fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return err
			},
		}).Build()
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "talos-secrets", errors.New("RBAC: access denied"))
	_, err := clustersecrets.Load(context.Background(), refuse(forbidden), cluster)
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "still the API server's Forbidden")
	assert.Contains(t, err.Error(), `the manager may not read Secrets in namespace "team-a": with the Helm chart, add it to rbac.secretsNamespaces`)

	_, err = clustersecrets.Load(context.Background(), refuse(apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "talos-secrets")), cluster)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "rbac.secretsNamespaces")
}
