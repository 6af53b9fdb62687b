package chart

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ichor-dev/ichor-policy/webhook/webhookcerts"
)

// assetsDir is where `make envtest-assets` builds kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS (the Makefile exports it), else the cache it uses.
func assetsDir(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		require.NoError(t, err)
		cache = filepath.Join(home, ".cache")
	}
	dir := filepath.Join(cache, "ichor-policy", "envtest", "v1.37.2")
	_, err := os.Stat(filepath.Join(dir, "kube-apiserver"))
	require.NoError(t, err, "no control-plane binaries in %s: run `make envtest-assets`", dir)
	return dir
}

// TestUpgradeKeepsTheManagersCertificates installs the chart with the pinned
// Helm into a real API server, lets webhookcerts fill the Secret and set the
// CA bundle exactly as the manager does, upgrades the release, and checks the
// upgrade left both alone: the chart renders neither the Secret's data nor
// the caBundle, and Helm, server-side apply (Helm 4's default) or the
// three-way merge of client-side apply, writes only the fields it renders.
// Uninstalling removes what the chart made, the Secret with its CA included.
func TestUpgradeKeepsTheManagersCertificates(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	c, kubeconfigPath := envWithHelm(t)

	for _, mode := range []string{"true", "false"} {
		t.Run("server-side="+mode, func(t *testing.T) {
			kc := []string{"--kubeconfig", kubeconfigPath, "--namespace", namespace}
			helm(t, nil, append([]string{"install", release, chartDir(t), "--create-namespace", "--server-side=" + mode}, kc...)...)
			// So a failure leaves nothing for the next mode to trip on.
			t.Cleanup(func() {
				_ = exec.Command(helmBinary(t), append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...).Run()
			})

			// What the manager does at its first start.
			rotator, err := webhookcerts.NewRotator(c, webhookcerts.Options{
				Namespace: namespace, ServiceName: release + "-webhook", CertDir: t.TempDir(),
			})
			require.NoError(t, err)
			require.NoError(t, rotator.Sync(t.Context()))
			secretBefore, bundleBefore := certState(t, c)
			require.NotEmpty(t, secretBefore[webhookcerts.KeyCACert])
			require.NotEmpty(t, bundleBefore)

			helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "replicaCount=3", "--set", "webhook.servicePort=8443"}, kc...)...)

			secretAfter, bundleAfter := certState(t, c)
			assert.Equal(t, secretBefore, secretAfter, "the upgrade changed the manager's certificates")
			assert.Equal(t, bundleBefore, bundleAfter, "the upgrade reset the CA bundle")
			var dep appsv1.Deployment
			require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: release}, &dep))
			assert.EqualValues(t, 3, *dep.Spec.Replicas, "the upgrade was not applied")
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: webhookcerts.DefaultWebhookConfigurationName}, &vwc))
			assert.EqualValues(t, 8443, *vwc.Webhooks[0].ClientConfig.Service.Port, "the upgrade was not applied to the webhook configuration")

			// A new install makes no shared binding; revoking admin
			// kubeconfigs is a value that makes the manager refuse them.
			binding := types.NamespacedName{Name: "ichor:cluster-admins"}
			err = c.Get(t.Context(), binding, &rbacv1.ClusterRoleBinding{})
			assert.True(t, apierrors.IsNotFound(err), "a new install made the shared binding: %v", err)
			helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "adminCredentials.enabled=false"}, kc...)...)
			require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: release}, &dep))
			assert.Contains(t, dep.Spec.Template.Spec.Containers[0].Args, "--admin-kubeconfigs=false")

			helm(t, nil, append([]string{"uninstall", release}, kc...)...)
			for _, gone := range []struct {
				obj client.Object
				key types.NamespacedName
			}{
				{&corev1.Secret{}, types.NamespacedName{Namespace: namespace, Name: webhookcerts.DefaultSecretName}},
				{&admissionregistrationv1.ValidatingWebhookConfiguration{}, types.NamespacedName{Name: webhookcerts.DefaultWebhookConfigurationName}},
				{&rbacv1.ClusterRole{}, types.NamespacedName{Name: release + "-manager"}},
			} {
				err := c.Get(t.Context(), gone.key, gone.obj)
				assert.True(t, apierrors.IsNotFound(err), "%T %s remains after uninstall (%v)", gone.obj, gone.key, err)
			}
		})
	}
}

// certState is the Secret's data and the webhook's CA bundle.
func certState(t *testing.T, c client.Client) (map[string][]byte, []byte) {
	t.Helper()
	var secret corev1.Secret
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: webhookcerts.DefaultSecretName}, &secret))
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: webhookcerts.DefaultWebhookConfigurationName}, &vwc))
	// The credential webhook and the two that record a person's acts, all
	// with the same CA bundle.
	require.Len(t, vwc.Webhooks, 3)
	for _, w := range vwc.Webhooks[1:] {
		require.Equal(t, vwc.Webhooks[0].ClientConfig.CABundle, w.ClientConfig.CABundle, "webhook %s", w.Name)
	}
	return secret.Data, vwc.Webhooks[0].ClientConfig.CABundle
}

// TestTheDefaultInstallReadsNoSecretOutsideItsNamespace installs the chart
// into a real API server and asks it, with SubjectAccessReviews as the
// manager's ServiceAccount, where the manager may get Secrets: by default in
// the release namespace only (a leaked token is not every cluster's CA keys);
// in the namespaces rbac.secretsNamespaces names instead; anywhere only with
// rbac.secretsClusterWide.
func TestTheDefaultInstallReadsNoSecretOutsideItsNamespace(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	c, kubeconfigPath := envWithHelm(t)
	kc := []string{"--kubeconfig", kubeconfigPath, "--namespace", namespace}
	helm(t, nil, append([]string{"install", release, chartDir(t), "--create-namespace"}, kc...)...)
	t.Cleanup(func() {
		_ = exec.Command(helmBinary(t), append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...).Run()
	})
	var dep appsv1.Deployment
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: release}, &dep))
	manager := "system:serviceaccount:" + namespace + ":" + dep.Spec.Template.Spec.ServiceAccountName

	mayGet := func(ns string) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   manager,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "get", Resource: "secrets", Name: "talos-secrets",
			},
		}}
		require.NoError(t, c.Create(t.Context(), sar))
		return sar.Status.Allowed
	}
	// The API server's authorizer sees a changed role within moments, not at once.
	becomes := func(ns string, want bool, msg string) {
		t.Helper()
		require.Eventually(t, func() bool { return mayGet(ns) == want }, 30*time.Second, 200*time.Millisecond, msg)
	}
	becomes(namespace, true, "the default reads the clusters' Secrets in the release namespace")
	assert.False(t, mayGet("team-a"), "the default reads no Secret in another namespace")
	assert.False(t, mayGet("kube-system"), "the default reads no Secret in kube-system")

	require.NoError(t, c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}))
	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "rbac.secretsNamespaces={team-a}"}, kc...)...)
	becomes("team-a", true, "a namespace named")
	becomes(namespace, false, "the namespaces named replace the release namespace")
	assert.False(t, mayGet("team-b"), "a namespace not named")

	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--reset-values", "--set", "rbac.secretsClusterWide=true"}, kc...)...)
	becomes("team-b", true, "cluster-wide, asked for")
	assert.True(t, mayGet("kube-system"), "cluster-wide, asked for")

	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--reset-values"}, kc...)...)
	becomes("team-b", false, "back to the default, the cluster-wide grant is gone")
	assert.False(t, mayGet("kube-system"))
	assert.True(t, mayGet(namespace))
}

// TestSharedAdminBindingMigrationWindow: an install that had the shared
// binding ichor:cluster-admins (earlier charts made it) keeps it, and the
// shared admin kubeconfigs issued under it keep working, across upgrades,
// until the operator closes the window with adminCredentials.sharedBinding=false;
// then they are refused, and later upgrades neither bring it back nor, with
// the value true again, restore it without adminCredentials.restore.
func TestSharedAdminBindingMigrationWindow(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	env := &envtest.Environment{BinaryAssetsDirectory: assetsDir(t)}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := env.AddUser(envtest.User{Name: "chart-test", Groups: []string{"system:masters"}}, cfg)
	require.NoError(t, err)
	kubeconfig, err := admin.KubeConfig()
	require.NoError(t, err)
	c, err := client.New(cfg, client.Options{})
	require.NoError(t, err)
	kc := []string{"--kubeconfig", writeKubeconfig(t, kubeconfig), "--namespace", namespace}

	// A shared admin kubeconfig as earlier Ichors issued it: that name and
	// that group, from a CA the API server trusts.
	shared, err := env.AddUser(envtest.User{Name: "ichor-credential:kubeconfig-admin", Groups: []string{"ichor:cluster-admins"}}, cfg)
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(shared.Config())
	require.NoError(t, err)
	works := func() error {
		_, err := cs.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{Limit: 1})
		return err
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true,
			func(context.Context) (bool, error) { return cond(), nil }), what)
	}

	// The install as an earlier chart left it: the shared binding, a release
	// resource.
	helm(t, nil, append([]string{"install", release, chartDir(t), "--create-namespace", "--set", "adminCredentials.sharedBinding=true"}, kc...)...)
	t.Cleanup(func() {
		_ = exec.Command(helmBinary(t), append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...).Run()
	})
	binding := types.NamespacedName{Name: "ichor:cluster-admins"}
	waitUntil("the shared kubeconfig works", func() bool { return works() == nil })

	// Upgrades with the default value keep it: the window stays open.
	for range 2 {
		helm(t, nil, append([]string{"upgrade", release, chartDir(t)}, kc...)...)
		require.NoError(t, c.Get(t.Context(), binding, &rbacv1.ClusterRoleBinding{}), "an upgrade removed the shared binding before the window closed")
		require.NoError(t, works(), "the shared kubeconfig stopped working before the window closed")
	}

	// The operator closes the window.
	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "adminCredentials.sharedBinding=false"}, kc...)...)
	err = c.Get(t.Context(), binding, &rbacv1.ClusterRoleBinding{})
	assert.True(t, apierrors.IsNotFound(err), "sharedBinding=false left the binding: %v", err)
	waitUntil("the shared kubeconfig is refused", func() bool { return apierrors.IsForbidden(works()) })

	// The default does not bring it back; true does not restore it by accident.
	helm(t, nil, append([]string{"upgrade", release, chartDir(t)}, kc...)...)
	err = c.Get(t.Context(), binding, &rbacv1.ClusterRoleBinding{})
	assert.True(t, apierrors.IsNotFound(err), "an upgrade brought the shared binding back: %v", err)
	out, err := helmOutput(t, append([]string{"upgrade", release, chartDir(t), "--set", "adminCredentials.sharedBinding=true"}, kc...)...)
	require.Error(t, err)
	assert.Contains(t, string(out), "the ClusterRoleBinding ichor:cluster-admins is missing, so the shared admin kubeconfigs were revoked")
	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "adminCredentials.sharedBinding=true", "--set", "adminCredentials.restore=true"}, kc...)...)
	require.NoError(t, c.Get(t.Context(), binding, &rbacv1.ClusterRoleBinding{}), "restore brings the binding back")
}
