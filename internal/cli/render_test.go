package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

func TestRenderKubeletServingByContract(t *testing.T) {
	code, out, stderr := run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.14", true, true))
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, out, "kind: KubeletConfig")
	assert.Contains(t, out, "serverTLSBootstrap: true")
	assert.Contains(t, out, "kind: KubeAPIServerConfig")
	assert.Contains(t, out, "kubelet-certificate-authority: /system/secrets/kubernetes/kube-apiserver/ca.crt")

	code, out, stderr = run(t, "", "render", "kubelet-serving", "-f", clusterManifest(t, "v1.13", true, false), "--role", "controlplane")
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, out, "extraConfig:")
	assert.NotContains(t, out, "KubeletConfig")
	assert.NotContains(t, out, "kubelet-certificate-authority", "not verified yet: no flag")
	assert.Equal(t, 1, strings.Count(out, "# role:"))
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
