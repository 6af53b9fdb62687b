package chart

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
)

// envWithHelm starts a bare API server (no CRDs) and returns a client and a
// kubeconfig file for Helm.
func envWithHelm(t *testing.T) (client.Client, string) {
	t.Helper()
	c, kubeconfig, _ := startEnvWithHelm(t)
	return c, kubeconfig
}

// installedChart starts a control plane, installs the chart into it with the
// values set (uninstalled at the test's end) and returns the API server's
// administrator configuration and Helm's --kubeconfig and --namespace flags.
func installedChart(t *testing.T, set ...string) (*rest.Config, []string) {
	t.Helper()
	_, kubeconfig, cfg := startEnvWithHelm(t)
	kc := []string{"--kubeconfig", kubeconfig, "--namespace", namespace}
	args := append([]string{"install", release, chartDir(t), "--create-namespace"}, kc...)
	for _, v := range set {
		args = append(args, "--set", v)
	}
	helm(t, nil, args...)
	t.Cleanup(func() {
		_ = exec.Command(helmBinary(t), append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...).Run()
	})
	return cfg, kc
}

// startEnvWithHelm is envWithHelm with the administrator configuration.
func startEnvWithHelm(t *testing.T) (client.Client, string, *rest.Config) {
	t.Helper()
	env := &envtest.Environment{BinaryAssetsDirectory: assetsDir(t)}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "chart-test", Groups: []string{"system:masters"}}, cfg)
	require.NoError(t, err)
	kubeconfig, err := user.KubeConfig()
	require.NoError(t, err)
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, apiextensionsv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	return c, writeKubeconfig(t, kubeconfig), cfg
}

// TestInstallRefusesBadValues: helm install checks the values schema before
// it creates anything.
func TestInstallRefusesBadValues(t *testing.T) {
	c, kubeconfig := envWithHelm(t)
	for set, want := range badValues {
		out, err := helmOutput(t, "install", release, chartDir(t), "--kubeconfig", kubeconfig, "--namespace", namespace, "--create-namespace", "--set", set)
		require.Error(t, err, "helm install accepted --set %s", set)
		assert.Contains(t, string(out), want, set)
	}
	err := c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: release}, &appsv1.Deployment{})
	assert.True(t, apierrors.IsNotFound(err), "a refused install created the Deployment: %v", err)
	out := helm(t, nil, "list", "--kubeconfig", kubeconfig, "--all-namespaces", "--short")
	assert.Empty(t, string(out), "a refused install left a release")
}

// An unelected release installed before the chart named a strategy (the API
// server defaulted a rollingUpdate on its Deployment) upgrades to this one,
// whose rolling update has no surge. Recreate failed there: Helm's
// server-side apply keeps the defaulted rollingUpdate, beside which the API
// server refuses it (reviews 256 F2, 257, 258 F2).
func TestAnUnelectedReleaseUpgrades(t *testing.T) {
	c, kubeconfig, _ := startEnvWithHelm(t)
	kc := []string{"--kubeconfig", kubeconfig, "--namespace", namespace}
	older := filepath.Join(t.TempDir(), "ichor-policy")
	require.NoError(t, os.CopyFS(older, os.DirFS(chartDir(t))))
	deployment := filepath.Join(older, "templates", "deployment.yaml")
	text := string(readFile(t, deployment))
	start := strings.Index(text, "  {{- if not .Values.manager.leaderElect }}\n")
	end := strings.Index(text[start:], "  {{- end }}\n")
	require.True(t, start > 0 && end > 0, "no strategy block to take away")
	require.NoError(t, os.WriteFile(deployment, []byte(text[:start]+text[start+end+len("  {{- end }}\n"):]), 0o600))

	unelected := []string{"--set", "manager.leaderElect=false", "--set", "replicaCount=1"}
	helm(t, nil, append(append([]string{"install", release, older, "--create-namespace"}, kc...), unelected...)...)
	t.Cleanup(func() { _, _ = helmOutput(t, append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...) })
	var dep appsv1.Deployment
	key := types.NamespacedName{Namespace: namespace, Name: release}
	require.NoError(t, c.Get(t.Context(), key, &dep))
	require.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, dep.Spec.Strategy.Type)
	require.NotNil(t, dep.Spec.Strategy.RollingUpdate, "the API server defaulted none: the test proves nothing")

	helm(t, nil, append(append([]string{"upgrade", release, chartDir(t)}, kc...), unelected...)...)
	require.NoError(t, c.Get(t.Context(), key, &dep))
	assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, dep.Spec.Strategy.Type)
	require.NotNil(t, dep.Spec.Strategy.RollingUpdate)
	assert.Equal(t, "0", dep.Spec.Strategy.RollingUpdate.MaxSurge.String())
}

// TestCRDsUpgradeWithTheChartAndOutliveIt installs a chart whose
// TalosCluster CRD lacks spec.security (an older release, say), upgrades to
// this chart, and sees the field served: the CRDs are templates, which helm
// upgrade applies, unlike the crds/ directory. helm uninstall leaves them
// (helm.sh/resource-policy: keep) with the objects, and installing the
// release again adopts them.
func TestCRDsUpgradeWithTheChartAndOutliveIt(t *testing.T) {
	c, kubeconfig, cfg := startEnvWithHelm(t)
	kc := []string{"--kubeconfig", kubeconfig, "--namespace", namespace}
	const crdName = "talosclusters.ichor.dev"

	// The older chart: this one without spec.security in the TalosCluster CRD.
	older := filepath.Join(t.TempDir(), "ichor-policy")
	require.NoError(t, os.CopyFS(older, os.DirFS(chartDir(t))))
	crdFile := filepath.Join(older, "files", "crds", "ichor.dev_talosclusters.yaml")
	var crd map[string]any
	require.NoError(t, sigsyaml.Unmarshal(readFile(t, crdFile), &crd))
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	require.Len(t, versions, 1)
	specProps := []string{"schema", "openAPIV3Schema", "properties", "spec", "properties"}
	_, found, _ := unstructured.NestedFieldNoCopy(versions[0].(map[string]any), append(specProps, "security")...)
	require.True(t, found, "the CRD has no spec.security to take away")
	unstructured.RemoveNestedField(versions[0].(map[string]any), append(specProps, "security")...)
	require.NoError(t, unstructured.SetNestedSlice(crd, versions, "spec", "versions"))
	data, err := sigsyaml.Marshal(crd)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(crdFile, data, 0o600))

	helm(t, nil, append([]string{"install", release, older, "--create-namespace"}, kc...)...)
	t.Cleanup(func() { _, _ = helmOutput(t, append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...) })
	kept, name := createUntil(t, c, "old", func(bool) bool { return true })
	assert.False(t, kept, "the older CRD already serves spec.security: the test proves nothing")
	clusters := []string{name}

	helm(t, nil, append([]string{"upgrade", release, chartDir(t)}, kc...)...)
	var got apiextensionsv1.CustomResourceDefinition
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: crdName}, &got))
	assert.Contains(t, got.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties, "security", "helm upgrade did not upgrade the CRD")
	// The API server serves an updated schema a moment after the update.
	kept, name = createUntil(t, c, "new", func(kept bool) bool { return kept })
	assert.True(t, kept, "spec.security is not served after the upgrade")
	clusters = append(clusters, name)

	// The bundle epoch the manager recorded is the floor of every signed
	// bundle it takes: an uninstall must not lower it (review 62 L3).
	epochKey := types.NamespacedName{Namespace: namespace, Name: bundleepoch.ConfigMapName}
	// Recorded as the manager records it: nobody else may (the chart's
	// bundle-epoch policy).
	require.NoError(t, (&bundleepoch.Store{Client: asTheManager(t, cfg), Namespace: namespace}).Raise(t.Context(), 12))

	helm(t, nil, append([]string{"uninstall", release}, kc...)...)
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: crdName}, &got), "helm uninstall deleted the CRD")
	assert.Equal(t, "keep", got.Annotations["helm.sh/resource-policy"])
	var epoch corev1.ConfigMap
	require.NoError(t, c.Get(t.Context(), epochKey, &epoch), "helm uninstall deleted the bundle epoch's floor")
	assert.Equal(t, "12", epoch.Data[bundleepoch.Key])
	for _, name := range clusters {
		err := c.Get(t.Context(), types.NamespacedName{Namespace: "default", Name: name}, talosCluster(""))
		assert.NoError(t, err, "TalosCluster %s did not outlive the release", name)
	}
	err = c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: release}, &appsv1.Deployment{})
	assert.True(t, apierrors.IsNotFound(err), "the rest of the release is removed: %v", err)

	// The same release installed again takes the kept CRDs back, and the
	// floor, as it was.
	helm(t, nil, append([]string{"install", release, chartDir(t)}, kc...)...)
	require.NoError(t, c.Get(t.Context(), epochKey, &epoch))
	assert.Equal(t, "12", epoch.Data[bundleepoch.Key], "the release installed again lowered the floor")
}

func talosCluster(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ichor.dev/v1alpha1", "kind": "TalosCluster",
		"metadata": map[string]any{"namespace": "default", "name": name},
		"spec": map[string]any{
			"talosVersion": "v1.14", "secretsRef": map[string]any{"name": "talos-secrets"},
			"security": map[string]any{"kubeletServingCertificates": map[string]any{"enabled": true}},
		},
	}}
	return u
}

// createUntil creates TalosClusters with spec.security set, named prefix-0,
// prefix-1, ..., until done says the last one is enough (given whether it
// kept the field) or 30 seconds have passed; creates fail while the API
// server does not serve the kind yet. It returns whether the last one created
// kept the field, and its name.
func createUntil(t *testing.T, c client.Client, prefix string, done func(kept bool) bool) (bool, string) {
	t.Helper()
	var kept bool
	var name string
	var lastErr error
	i := 0
	// A timeout is not an error here: the caller judges the last one created.
	_ = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cluster := talosCluster(fmt.Sprintf("%s-%d", prefix, i))
		i++
		if lastErr = c.Create(ctx, cluster); lastErr != nil {
			return false, nil
		}
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster))
		kept, _, _ = unstructured.NestedBool(cluster.Object, "spec", "security", "kubeletServingCertificates", "enabled")
		name = cluster.GetName()
		return done(kept), nil
	})
	if name == "" {
		require.NoError(t, lastErr, "no TalosCluster could be created")
		t.Fatal("no TalosCluster could be created within 30s")
	}
	return kept, name
}

// TestUpgradeTakesOverCRDsInstalledOutsideTheRelease is the upgrade from a
// chart that installed the CRDs from its crds/ directory, which leaves them
// without the release's ownership metadata (here: applied from deploy/crds,
// and a release without crds.install): the upgrade refuses them until
// --take-ownership, as docs/install.md says; then the release owns them and
// keeps them on uninstall.
func TestUpgradeTakesOverCRDsInstalledOutsideTheRelease(t *testing.T) {
	c, kubeconfig := envWithHelm(t)
	kc := []string{"--kubeconfig", kubeconfig, "--namespace", namespace}
	sources, err := filepath.Glob(filepath.Join(root(t), "deploy", "crds", "*.yaml"))
	require.NoError(t, err)
	for _, src := range sources {
		for _, obj := range decode(t, readFile(t, src)) {
			require.NoError(t, c.Create(t.Context(), obj))
		}
	}
	helm(t, nil, append([]string{"install", release, chartDir(t), "--create-namespace", "--set", "crds.install=false"}, kc...)...)
	t.Cleanup(func() { _, _ = helmOutput(t, append([]string{"uninstall", release, "--ignore-not-found"}, kc...)...) })

	// crds.install explicitly: an upgrade given no values reuses the last.
	out, err := helmOutput(t, append([]string{"upgrade", release, chartDir(t), "--set", "crds.install=true"}, kc...)...)
	require.Error(t, err, "the upgrade adopted CRDs it does not own")
	assert.Contains(t, string(out), "invalid ownership metadata")
	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "crds.install=true", "--take-ownership"}, kc...)...)
	var crd apiextensionsv1.CustomResourceDefinition
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: "talosclusters.ichor.dev"}, &crd))
	assert.Equal(t, release, crd.Annotations["meta.helm.sh/release-name"])
	assert.Equal(t, "keep", crd.Annotations["helm.sh/resource-policy"])
	helm(t, nil, append([]string{"uninstall", release}, kc...)...)
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: "talosclusters.ichor.dev"}, &crd), "helm uninstall deleted the CRD")
}
