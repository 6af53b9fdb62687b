package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/test/harness"
)

const (
	releaseName = "ichor-policy"
	namespace   = "ichor-system"
	repository  = "registry.example/ichor-policy"
	crdName     = "talosclusters.ichor.dev"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary is the Helm pinned in tools/helm: $HELM when the Makefile has
// resolved it, else `go tool -n helm` in the tool module.
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if helmPath = os.Getenv("HELM"); helmPath != "" {
			return
		}
		out, err := exec.Command("go", "-C", filepath.Join(repoRoot(t), "tools", "helm"), "tool", "-n", "helm").Output()
		if err != nil {
			helmErr = fmt.Errorf("build the pinned helm: %w", err)
			return
		}
		helmPath = strings.TrimSpace(string(out))
	})
	require.NoError(t, helmErr)
	return helmPath
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "helm %s:\n%s%s", strings.Join(args, " "), stderr.String(), stdout.String())
	return stdout.Bytes()
}

// TestTheReleaseInstallsUpgradesAndItsPluginIsWhatKrewNames builds a
// release as `make release` does, for one platform (this machine's) so as
// to compile ichor once, then, on a real API server: installs the previous
// release's chart package, whose TalosCluster CRD lacks spec.security (with
// the NetworkPolicy on, so the API server validates it too); upgrades to the
// packaged chart from the release and sees the CRD upgraded and the manager
// run the released image by its digest; rolls back, and sees the older chart
// and CRD again; upgrades again; uninstalls, and the CRDs stay. Then it
// checks the krew manifest against the archives it names, runs the plugin
// binary from its archive, and checks SHA256SUMS.
func TestTheReleaseInstallsUpgradesAndItsPluginIsWhatKrewNames(t *testing.T) {
	created := time.Unix(1700000000, 0).UTC()
	host := v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	dist := t.TempDir()
	_, signingKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	res, err := Build(t.Context(), Options{
		Dir: repoRoot(t), Out: dist, Version: "v0.2.0", Repository: repository,
		ImagePlatforms: []v1.Platform{{OS: "linux", Architecture: runtime.GOARCH}}, PluginPlatforms: []v1.Platform{host},
		Created: created, Helm: helmBinary(t), SigningKey: signingKey,
	})
	require.NoError(t, err)
	sums, err := os.ReadFile(filepath.Join(dist, Checksums))
	require.NoError(t, err)
	sig, err := os.ReadFile(filepath.Join(dist, ChecksumsSignature))
	require.NoError(t, err)
	assert.True(t, ed25519.Verify(signingKey.Public().(ed25519.PublicKey), sums, sig), "SHA256SUMS.sig does not verify")
	assert.Equal(t, ChecksumsSignature, res.Files[len(res.Files)-1])
	digest := res.ImageDigest.String()
	packaged := filepath.Join(dist, "ichor-policy-0.2.0.tgz")

	var chart struct{ Version, AppVersion, KubeVersion string }
	require.NoError(t, sigsyaml.Unmarshal(helm(t, "show", "chart", packaged), &chart))
	assert.Equal(t, "0.2.0", chart.Version)
	assert.Equal(t, "v0.2.0", chart.AppVersion)
	assert.Equal(t, ">=1.30.0-0", chart.KubeVersion)
	assert.Contains(t, string(helm(t, "show", "readme", packaged)), "# ichor-policy")

	previous := previousRelease(t, created)

	c, kubeconfig := apiServer(t)
	kc := []string{"--kubeconfig", kubeconfig, "--namespace", namespace}
	helm(t, append([]string{"install", releaseName, previous, "--create-namespace", "--set", "networkPolicy.enabled=true"}, kc...)...)
	t.Cleanup(func() {
		_ = exec.Command(helmBinary(t), append([]string{"uninstall", releaseName, "--ignore-not-found"}, kc...)...).Run()
	})
	assert.False(t, crdHasSecurity(t, c), "the previous release's CRD already has spec.security: the upgrade proves nothing")
	oldImage := managerImage(t, c)

	helm(t, append([]string{"upgrade", releaseName, packaged, "--reset-then-reuse-values"}, kc...)...)
	assert.True(t, crdHasSecurity(t, c), "helm upgrade did not upgrade the CRD")
	assert.Equal(t, repository+"@"+digest, managerImage(t, c), "the packaged chart does not run the released image by its digest")
	var dep appsv1.Deployment
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: releaseName}, &dep))
	assert.Equal(t, "v0.2.0", dep.Labels["app.kubernetes.io/version"])
	assert.Equal(t, "ichor-policy-0.2.0", dep.Labels["helm.sh/chart"])
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: releaseName + "-manager"}, &networkingv1.NetworkPolicy{}),
		"the upgrade kept the values it was installed with")

	// A rollback is the previous chart, CRDs included: they are templates.
	helm(t, append([]string{"rollback", releaseName, "1"}, kc...)...)
	assert.Equal(t, oldImage, managerImage(t, c))
	assert.False(t, crdHasSecurity(t, c), "helm rollback re-applies the previous release's CRD")
	helm(t, append([]string{"upgrade", releaseName, packaged, "--reset-then-reuse-values"}, kc...)...)
	assert.True(t, crdHasSecurity(t, c))
	history := string(helm(t, append([]string{"history", releaseName, "--output", "json"}, kc...)...))
	assert.Equal(t, 4, strings.Count(history, `"revision"`), history)

	helm(t, append([]string{"uninstall", releaseName}, kc...)...)
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: crdName}, &apiextensionsv1.CustomResourceDefinition{}), "helm uninstall deleted the CRD")
	err = c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: releaseName}, &appsv1.Deployment{})
	assert.True(t, apierrors.IsNotFound(err), "the Deployment outlived the release: %v", err)

	checkKrew(t, dist, host)
	checkSums(t, dist, res.Files)
}

// previousRelease packages the chart as the previous release, 0.1.0, with
// the TalosCluster CRD as it was before spec.security, and another image.
func previousRelease(t *testing.T, created time.Time) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "chart")
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join(repoRoot(t), "deploy", "chart"))))
	crdFile := filepath.Join(dir, "files", "crds", "ichor.dev_talosclusters.yaml")
	data, err := os.ReadFile(crdFile)
	require.NoError(t, err)
	var crd map[string]any
	require.NoError(t, sigsyaml.Unmarshal(data, &crd))
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	require.Len(t, versions, 1)
	unstructured.RemoveNestedField(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "security")
	require.NoError(t, unstructured.SetNestedSlice(crd, versions, "spec", "versions"))
	data, err = sigsyaml.Marshal(crd)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(crdFile, data, 0o600))
	out := t.TempDir()
	name, err := PackageChart(t.Context(), helmBinary(t), dir, out, "v0.1.0", repository, "sha256:"+strings.Repeat("1", 64), created)
	require.NoError(t, err)
	return filepath.Join(out, name)
}

// apiServer starts a bare API server (no CRDs: the chart brings them) and
// returns a client and a kubeconfig file for Helm.
func apiServer(t *testing.T) (client.Client, string) {
	t.Helper()
	assets, err := harness.DefaultAssetsDir()
	require.NoError(t, err)
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		assets = dir
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "release-test", Groups: []string{"system:masters"}}, cfg)
	require.NoError(t, err)
	kubeconfig, err := user.KubeConfig()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, kubeconfig, 0o600))
	scheme := kruntime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, apiextensionsv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	return c, path
}

func crdHasSecurity(t *testing.T, c client.Client) bool {
	t.Helper()
	var crd apiextensionsv1.CustomResourceDefinition
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Name: crdName}, &crd))
	_, ok := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["security"]
	return ok
}

func managerImage(t *testing.T, c client.Client) string {
	t.Helper()
	var dep appsv1.Deployment
	require.NoError(t, c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: releaseName}, &dep))
	return dep.Spec.Template.Spec.Containers[0].Image
}

// checkKrew reads the krew manifest as krew would: for each platform, the
// archive its uri names, with the sha256 it says, holding the files it
// copies and the bin it links; the one for this machine runs, and says the
// release's version.
func checkKrew(t *testing.T, dist string, host v1.Platform) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dist, KrewManifest))
	require.NoError(t, err)
	m := parseKrew(t, data)
	assert.Equal(t, "v0.2.0", m.Spec.Version)
	require.NotEmpty(t, m.Spec.Platforms)
	ran := false
	for _, p := range m.Spec.Platforms {
		key := p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"]
		assert.True(t, strings.HasPrefix(p.URI, "https://github.com/ichor-dev/ichor-policy/releases/download/v0.2.0/"), p.URI)
		archive := filepath.Join(dist, path.Base(p.URI))
		sum, err := fileSHA256(archive)
		require.NoError(t, err, "%s: the archive the manifest names", key)
		assert.Equal(t, sum, p.SHA256, "%s: the manifest's sha256 is not its archive's", key)
		files := untar(t, archive)
		require.Len(t, p.Files, 1)
		require.Contains(t, files, p.Files[0].From, key)
		assert.Equal(t, p.Files[0].From, p.Bin, "%s: krew links bin from what files copies", key)
		if key != host.String() {
			continue
		}
		bin := filepath.Join(t.TempDir(), p.Bin)
		require.NoError(t, os.WriteFile(bin, files[p.Bin], 0o700)) //nolint:gosec // G306: an executable for this test
		out, err := exec.Command(bin, "version", "-o", "json").Output()
		require.NoError(t, err)
		var info struct{ Version string }
		require.NoError(t, json.Unmarshal(out, &info))
		assert.Equal(t, "v0.2.0", info.Version, "the plugin's binary")
		ran = true
	}
	assert.True(t, ran, "no archive for this machine (%s) in the manifest", host)
}

func untar(t *testing.T, archive string) map[string][]byte {
	t.Helper()
	f, err := os.Open(archive) //nolint:gosec // G304: the test's own release
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out[h.Name], err = io.ReadAll(tr)
		require.NoError(t, err)
	}
}

// checkSums: SHA256SUMS names every other file of the release, each with
// its sha256.
func checkSums(t *testing.T, dist string, files []string) {
	t.Helper()
	f, err := os.Open(filepath.Join(dist, Checksums))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	listed := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		require.True(t, ok, sc.Text())
		listed[name] = sum
	}
	require.NoError(t, sc.Err())
	unlisted := 0
	for _, name := range files {
		if name == Checksums || name == ChecksumsSignature {
			unlisted++
		}
	}
	assert.Len(t, listed, len(files)-unlisted)
	for _, name := range files {
		if name == Checksums || name == ChecksumsSignature {
			continue
		}
		sum, err := fileSHA256(filepath.Join(dist, name))
		require.NoError(t, err)
		assert.Equal(t, sum, listed[name], name)
	}
}

// A chart in a git work tree is released as git tracks it: a file left
// beside it (a values file with a secret) is not in the package, a change
// not committed to a tracked file is (review 24).
func TestThePackagedChartIsWhatGitTracks(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "chart")
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join(repoRoot(t), "deploy", "chart"))))
	git := func(args ...string) {
		out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	git("init", "-q")
	git("add", ".")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "values-prod.yaml"), []byte("token: s3cret\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "templates", "NOTES.txt"), []byte("changed, not committed\n"), 0o600))

	out := t.TempDir()
	name, err := PackageChart(t.Context(), helmBinary(t), dir, out, "v0.1.0", "registry.example/ichor-policy", "sha256:"+strings.Repeat("1", 64), time.Unix(1_700_000_000, 0))
	require.NoError(t, err)
	files := untar(t, filepath.Join(out, name))
	assert.Contains(t, files, ChartName+"/Chart.yaml")
	assert.NotContains(t, files, ChartName+"/values-prod.yaml", "a file git does not track was released")
	assert.Equal(t, "changed, not committed\n", string(files[ChartName+"/templates/NOTES.txt"]))

	// A work tree git cannot read (here its index is broken; another
	// user's, which git calls of dubious ownership, is another) is not a
	// reason to release every file beside the chart (review 25).
	require.NoError(t, os.WriteFile(filepath.Join(repo, ".git", "index"), []byte("broken"), 0o600))
	_, err = PackageChart(t.Context(), helmBinary(t), dir, t.TempDir(), "v0.1.0", "registry.example/ichor-policy", "sha256:"+strings.Repeat("1", 64), time.Unix(1_700_000_000, 0))
	require.ErrorContains(t, err, "git ls-files")

	// The caller's GIT_DIR naming another repository is not what is read
	// (review 185): the chart's own repository is, here still broken.
	t.Setenv("GIT_DIR", t.TempDir())
	_, err = PackageChart(t.Context(), helmBinary(t), dir, t.TempDir(), "v0.1.0", "registry.example/ichor-policy", "sha256:"+strings.Repeat("1", 64), time.Unix(1_700_000_000, 0))
	require.ErrorContains(t, err, "index file smaller than expected")

	// A .git above the chart that git does not read as one (here a linked
	// work tree's, whose repository is gone), or no git on PATH: refused,
	// not packaged whole (review 26).
	require.NoError(t, os.Rename(filepath.Join(repo, ".git"), filepath.Join(repo, "gone")))
	require.NoError(t, os.WriteFile(filepath.Join(repo, ".git"), []byte("gitdir: "+filepath.Join(repo, "gone", "worktrees", "x")+"\n"), 0o600))
	_, err = PackageChart(t.Context(), helmBinary(t), dir, t.TempDir(), "v0.1.0", "registry.example/ichor-policy", "sha256:"+strings.Repeat("1", 64), time.Unix(1_700_000_000, 0))
	require.ErrorContains(t, err, "in a git work tree that git does not list")
	t.Setenv("PATH", t.TempDir())
	_, err = PackageChart(t.Context(), helmBinary(t), dir, t.TempDir(), "v0.1.0", "registry.example/ichor-policy", "sha256:"+strings.Repeat("1", 64), time.Unix(1_700_000_000, 0))
	require.ErrorContains(t, err, "in a git work tree that git does not list")
}
