package cli_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/cli"
)

func clusterManifest(t *testing.T, version string, enabled, verified bool) string {
	t.Helper()
	m := `apiVersion: ichor.dev/v1alpha1
kind: TalosCluster
metadata: {name: demo, namespace: default}
spec:
  talosVersion: ` + version + `
  secretsRef: {name: demo-secrets}
  security:
    kubeletServingCertificates: {enabled: ` + map[bool]string{true: "true", false: "false"}[enabled] + `, verifyFromAPIServer: true}
`
	if verified {
		m += `status:
  conditions:
  - {type: KubeletServingVerified, status: "True", reason: VerificationLatched, message: m, lastTransitionTime: "2026-11-29T12:00:00Z"}
`
	}
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	require.NoError(t, os.WriteFile(path, []byte(m), 0o600))
	return path
}

// TestRenderKubeletServingByContract: a verified v1.14 cluster's roles get
// different patches, so one is chosen with --role or each is written to its
// own file with -o; an unverified v1.13 cluster's roles share one, printed
// once.
func TestRenderKubeletServingByContract(t *testing.T) {
	verified := clusterManifest(t, "v1.14", true, true)
	code, out, stderr := run(t, "", "render", "kubelet-serving", "-f", verified)
	assert.Equal(t, cli.ExitUsage, code)
	assert.Empty(t, out)
	assert.Contains(t, stderr, "the patches of the roles controlplane and worker differ for default/demo: pass --role controlplane or --role worker to print one, or --output-dir DIR to write one file per role")

	code, out, stderr = run(t, "", "render", "kubelet-serving", "-f", verified, "--role", "controlplane")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.True(t, strings.HasPrefix(out, "# role: controlplane; Talos v1.14\n"), out)
	assert.Contains(t, out, "kind: KubeletConfig")
	assert.Contains(t, out, "serverTLSBootstrap: true")
	assert.Contains(t, out, "kind: KubeAPIServerConfig")
	assert.Contains(t, out, "kubelet-certificate-authority: /system/secrets/kubernetes/kube-apiserver/ca.crt")

	code, out, stderr = run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.13", true, false))
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.True(t, strings.HasPrefix(out, "# roles: controlplane, worker; Talos v1.13\n"), out)
	assert.Contains(t, out, "extraConfig:")
	assert.NotContains(t, out, "KubeletConfig")
	assert.NotContains(t, out, "kubelet-certificate-authority", "not verified yet: no flag")
	assert.NotContains(t, out, "---", "one patch")
}

// TestRenderKubeletServingWritesOneFilePerRole: --output-dir DIR writes
// DIR/controlplane.yaml and DIR/worker.yaml, each a patch Talos loads, the
// kube-apiserver's document on the control plane only, and only the fields
// the patch sets.
func TestRenderKubeletServingWritesOneFilePerRole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "patches")
	code, out, stderr := run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.14", true, true), "--output-dir", dir)
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Empty(t, out)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{"controlplane.yaml", "worker.yaml"}, names)

	for role, kinds := range map[string][]string{
		"controlplane": {"KubeletConfig", "KubeAPIServerConfig"},
		"worker":       {"KubeletConfig"},
	} {
		path := filepath.Join(dir, role+".yaml")
		assert.Contains(t, stderr, "wrote "+path)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		_, err = configpatcher.LoadPatch(data)
		require.NoError(t, err, "%s is not a Talos patch:\n%s", path, data)
		for _, kind := range []string{"KubeletConfig", "KubeAPIServerConfig"} {
			assert.Equal(t, slices.Contains(kinds, kind), strings.Contains(string(data), "kind: "+kind), "%s: %s", role, kind)
		}
		for _, empty := range []string{`""`, "null", "[]", "{}"} {
			assert.NotContains(t, string(data), empty, "%s renders an empty field", role)
		}
	}

	// --role with -o writes that role's file alone.
	one := filepath.Join(t.TempDir(), "worker-only")
	code, _, stderr = run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.14", true, true), "--output-dir", one, "--role", "worker")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.FileExists(t, filepath.Join(one, "worker.yaml"))
	assert.NoFileExists(t, filepath.Join(one, "controlplane.yaml"))
}

// A patch's path that holds a symbolic link (a shared repository's, to a
// file of the person's) or a FIFO is replaced, never written through nor
// waited on (review of 2026-12-06); so is the bundle build writes.
func TestWrittenFilesReplaceALinkOrAFIFO(t *testing.T) {
	dir := t.TempDir()
	sentinel := filepath.Join(dir, "authorized_keys")
	require.NoError(t, os.WriteFile(sentinel, []byte("ssh-ed25519 AAAA ada\n"), 0o600))
	patches := filepath.Join(dir, "patches")
	require.NoError(t, os.Mkdir(patches, 0o750))
	require.NoError(t, os.Symlink(sentinel, filepath.Join(patches, "controlplane.yaml")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(patches, "worker.yaml"), 0o600))
	out := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.Symlink(sentinel, out))

	code, _, stderr := run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.14", true, true), "--output-dir", patches)
	require.Equal(t, cli.ExitOK, code, stderr)
	code, _, stderr = run(t, "", "bundle", "build", "--out", out)
	require.Equal(t, cli.ExitOK, code, stderr)

	kept, err := os.ReadFile(sentinel)
	require.NoError(t, err)
	assert.Equal(t, "ssh-ed25519 AAAA ada\n", string(kept), "written through a link")
	for _, path := range []string{filepath.Join(patches, "controlplane.yaml"), filepath.Join(patches, "worker.yaml"), out} {
		info, err := os.Lstat(path)
		require.NoError(t, err)
		assert.True(t, info.Mode().IsRegular(), "%s is %s, not a file", path, info.Mode())
		assert.Equal(t, os.FileMode(0o644)&^umask(t), info.Mode().Perm(), path)
	}
	// A device, or a link to one (as /dev/stdout is), is not replaced by
	// a file (as root, /dev/stdout was).
	toDevice := filepath.Join(dir, "stdout")
	require.NoError(t, os.Symlink(os.DevNull, toDevice))
	for _, path := range []string{os.DevNull, toDevice} {
		code, _, stderr = run(t, "", "bundle", "build", "--out", path)
		assert.Equal(t, cli.ExitError, code, stderr)
		assert.Contains(t, stderr, "it is a device, not a file")
		info, err := os.Lstat(path)
		require.NoError(t, err)
		assert.False(t, info.Mode().IsRegular(), "%s was replaced by a file", path)
	}
}

// testRenderFromTheAPIServer reads the cluster from the API server with
// kubectl's flags: the namespace is the kubeconfig context's (team-a), or
// -n's.
func (ce *clusterEnv) testRenderFromTheAPIServer(t *testing.T) {
	var cluster ichorv1alpha1.TalosCluster
	require.NoError(t, ce.env.Client.Get(t.Context(), client.ObjectKey{Namespace: teamNS, Name: "bare"}, &cluster))
	before := cluster.DeepCopy()
	cluster.Spec.Security.KubeletServingCertificates.Enabled = true
	require.NoError(t, ce.env.Client.Patch(t.Context(), &cluster, client.MergeFrom(before)))

	code, out, stderr := ce.ichor(t, "render", "kubelet-serving", "bare", "--kubeconfig", ce.kubeconfig["otto"])
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, out, "# roles: controlplane, worker; Talos v1.14\n")
	assert.Contains(t, out, "serverTLSBootstrap: true")

	code, _, stderr = ce.ichor(t, "render", "kubelet-serving", "bare", "--kubeconfig", ce.kubeconfig["otto"], "-n", "default")
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, "get TalosCluster default/bare")
}

func TestRenderKubeletServingOffPrintsNothing(t *testing.T) {
	code, out, stderr := run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.14", false, false))
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Empty(t, out)
	assert.Contains(t, stderr, "nothing to render")
}

func TestRenderKubeletServingRefusesBadInput(t *testing.T) {
	code, _, stderr := run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.14", true, false), "--role", "etcd")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, `--role "etcd"`)
	code, _, stderr = run(t, "", "render", "kubelet-serving")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "give the cluster")
	code, _, stderr = run(t, "", "render", "kubelet-serving", "-f", "../../go.mod")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Contains(t, stderr, "not a TalosCluster manifest")
	code, _, stderr = run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "1.14", true, false))
	assert.Equal(t, cli.ExitError, code)
	assert.Contains(t, stderr, "1.14")
}

// A TalosCluster file names its cluster as the API server would let it:
// a name that would carry a line of its own into the message (review 22 of
// the CLI's output) is refused before anything is rendered.
func TestRenderKubeletServingRefusesNamesTheAPIServerWouldNot(t *testing.T) {
	for _, tc := range []struct{ name, metadata, field string }{
		{"a name with a line of its own", `{name: "demo\nichor: forged\u001b[2J", namespace: default}`, "metadata.name"},
		{"a namespace with a bidi override", `{name: demo, namespace: "ns\u202e"}`, "metadata.namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := "apiVersion: ichor.dev/v1alpha1\nkind: TalosCluster\nmetadata: " + tc.metadata + "\nspec:\n  talosVersion: v1.14\n  secretsRef: {name: demo-secrets}\n  security:\n    kubeletServingCertificates: {enabled: true}\n"
			path := filepath.Join(t.TempDir(), "cluster.yaml")
			require.NoError(t, os.WriteFile(path, []byte(m), 0o600))
			code, stdout, stderr := run(t, "", "render", "kubelet-serving", "-f", path)
			assert.Equal(t, cli.ExitUsage, code, stderr)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.field)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "the message is one line: %q", stderr)
			assert.NotContains(t, stderr, "\u202e")
		})
	}
	// A manifest for kubectl create, named by the API server, renders.
	m := "apiVersion: ichor.dev/v1alpha1\nkind: TalosCluster\nmetadata: {generateName: demo-}\nspec:\n  talosVersion: v1.14\n  secretsRef: {name: demo-secrets}\n  security:\n    kubeletServingCertificates: {enabled: true}\n"
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	require.NoError(t, os.WriteFile(path, []byte(m), 0o600))
	code, stdout, stderr := run(t, "", "render", "kubelet-serving", "-f", path)
	assert.Equal(t, cli.ExitOK, code, stderr)
	assert.NotEmpty(t, stdout)
}

// umask is the process's file mode creation mask.
func umask(t *testing.T) os.FileMode {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "probe")
	require.NoError(t, os.WriteFile(probe, nil, 0o777))
	info, err := os.Stat(probe)
	require.NoError(t, err)
	return 0o777 &^ info.Mode().Perm()
}
