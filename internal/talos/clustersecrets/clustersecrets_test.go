package clustersecrets_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
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
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo-secrets", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "demo"}},
		Data:       map[string][]byte{"secrets.yaml": cur, clustersecrets.PreviousKey: prev},
	}).Build()
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo"}}
	cluster.Spec.SecretsRef.Name = "demo-secrets"

	got, err := clustersecrets.Load(context.Background(), c, cluster, clustersecrets.ClaimRequired)

	require.NoError(t, err)
	assert.Equal(t, current.Certs.OS.Crt, got.Current.Certs.OS.Crt)
	require.NotNil(t, got.Previous)
	assert.Equal(t, previous.Certs.OS.Crt, got.Previous.Certs.OS.Crt)

	cluster.Spec.SecretsRef.Key = "missing"
	_, err = clustersecrets.Load(context.Background(), c, cluster, clustersecrets.ClaimRequired)
	assert.ErrorContains(t, err, `Secret "demo-secrets" has no key "missing"`)
	cluster.Spec.SecretsRef.Name = "absent"
	_, err = clustersecrets.Load(context.Background(), c, cluster, clustersecrets.ClaimRequired)
	assert.ErrorContains(t, err, `get Secret "absent"`)
}

// A Secret is used only for the clusters its annotation names: whoever may
// write a TalosCluster but not the Secret cannot point a cluster granted to
// them at another cluster's CAs (review of 2026-12-05). Without the
// annotation it is refused, unless the manager allows that for an upgrade; an
// annotation that names other clusters is refused either way.
func TestLoadUsesASecretOnlyForTheClustersItNames(t *testing.T) {
	data, err := clustersecrets.Marshal(bundle(t))
	require.NoError(t, err)
	scheme := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(scheme))
	secret := func(claim *string) client.Reader {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "prod-secrets"},
			Data:       map[string][]byte{"secrets.yaml": data},
		}
		if claim != nil {
			s.Annotations = map[string]string{ichorv1alpha1.SecretsClaimAnnotation: *claim}
		}
		return fake.NewClientBuilder().WithScheme(scheme).WithObjects(s).Build()
	}
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "demo"},
		Spec:       ichorv1alpha1.TalosClusterSpec{SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "prod-secrets"}},
	}
	load := func(claim *string, claims clustersecrets.Claims) error {
		_, err := clustersecrets.Load(context.Background(), secret(claim), cluster, claims)
		return err
	}
	claim := func(s string) *string { return &s }

	for _, named := range []string{"demo", "prod,demo", " prod , demo ", "*", "prod,*"} {
		assert.NoError(t, load(claim(named), clustersecrets.ClaimRequired), named)
	}
	for _, other := range []string{"prod", "", "demo-2,prod", "DEMO", "de*", "team-a/demo"} {
		for _, claims := range []clustersecrets.Claims{clustersecrets.ClaimRequired, clustersecrets.ClaimIfAnnotated} {
			err := load(claim(other), claims)
			require.ErrorIs(t, err, clustersecrets.ErrNotClaimed, other)
			require.ErrorIs(t, err, clustersecrets.ErrInvalid, "a person has to fix it: %s", other)
			assert.ErrorContains(t, err, `Secret "prod-secrets": invalid secrets bundle: the Secret does not name this TalosCluster: its annotation ichor.dev/talos-clusters names `+strconv.Quote(other)+`, not "demo"`)
		}
	}
	err = load(nil, clustersecrets.ClaimRequired)
	require.ErrorIs(t, err, clustersecrets.ErrNotClaimed)
	assert.ErrorContains(t, err, "it has no annotation ichor.dev/talos-clusters, which names the TalosClusters that may use it (kubectl -n team-a annotate secret prod-secrets ichor.dev/talos-clusters=demo;")
	assert.NoError(t, load(nil, clustersecrets.ClaimIfAnnotated), "as before the claim, for an upgrade")

	long := "\x1b[31m" + strings.Repeat("x", 100_000)
	err = load(claim(long), clustersecrets.ClaimRequired)
	require.ErrorIs(t, err, clustersecrets.ErrNotClaimed)
	assert.Less(t, len(err.Error()), 600, "an error quotes a long annotation's beginning only")
	assert.NotContains(t, err.Error(), "\x1b", "quoted: no escape sequence reaches a terminal")
	assert.Contains(t, err.Error(), `names "\x1b[31mxxx`)
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
	_, err := clustersecrets.Load(context.Background(), refuse(forbidden), cluster, clustersecrets.ClaimRequired)
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "still the API server's Forbidden")
	assert.Contains(t, err.Error(), `the manager may not read Secrets in namespace "team-a": with the Helm chart, add it to rbac.secretsNamespaces`)

	_, err = clustersecrets.Load(context.Background(), refuse(apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "talos-secrets")), cluster, clustersecrets.ClaimRequired)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "rbac.secretsNamespaces")
}
