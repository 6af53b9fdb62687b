package cli_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/cli"
)

// help is the help of args for the binary invoked as argv0.
func help(t *testing.T, argv0 string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.RunAs(t.Context(), argv0, append(args, "--help"), strings.NewReader(""), &out, &errOut)
	require.Equal(t, cli.ExitOK, code, errOut.String())
	return out.String()
}

// TestKubectlPluginNamesItself: invoked as kubectl-ichor (as kubectl runs a
// plugin, with the path it found on the PATH), the help says `kubectl ichor`,
// what the person typed; invoked under any other name, `ichor`.
func TestKubectlPluginNamesItself(t *testing.T) {
	for _, argv0 := range []string{"kubectl-ichor", "/home/ada/.krew/bin/kubectl-ichor", "kubectl-ichor.exe"} {
		out := help(t, argv0, "cluster", "talosconfig")
		assert.Contains(t, out, "\n  kubectl ichor cluster talosconfig NAME", argv0)
		out = help(t, argv0)
		assert.Contains(t, out, "\n  kubectl ichor [command]", argv0)
		assert.Contains(t, out, `Use "kubectl ichor [command] --help"`, argv0)
	}
	for _, argv0 := range []string{"ichor", "/usr/local/bin/ichor", "bin/kubectl-ichor-dev"} {
		out := help(t, argv0, "cluster", "talosconfig")
		assert.Contains(t, out, "\n  ichor cluster talosconfig NAME", argv0)
		assert.NotContains(t, out, "kubectl ichor", argv0)
	}
}

// krewPlugin is the part of a krew plugin manifest the tests read.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Homepage         string `json:"homepage"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestKrewManifest: deploy/krew/ichor.yaml is a krew manifest for every
// platform released, whose placeholders are the version and the sha256 of
// that platform's archive only, and whose plugin name is the one the binary
// recognizes.
func TestKrewManifest(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/krew/ichor.yaml")
	require.NoError(t, err)
	placeholders := map[string]bool{}
	filled := os.Expand(stripComments(string(raw)), func(name string) string {
		placeholders[name] = true
		if name == "VERSION" {
			return "v1.2.3"
		}
		return strings.Repeat("0", 64) + "#" + name
	})
	var p krewPlugin
	require.NoError(t, yaml.UnmarshalStrict([]byte(filled), &p))

	assert.Equal(t, "krew.googlecontainertools.github.com/v1alpha2", p.APIVersion)
	assert.Equal(t, "Plugin", p.Kind)
	assert.Equal(t, "v1.2.3", p.Spec.Version)
	assert.NotEmpty(t, p.Spec.ShortDescription)

	// The name kubectl runs is kubectl-<name>; the binary must say so.
	out := help(t, "kubectl-"+p.Metadata.Name)
	assert.Contains(t, out, "kubectl "+p.Metadata.Name+" [command]")

	want := map[string]bool{"linux/amd64": true, "linux/arm64": true, "darwin/amd64": true, "darwin/arm64": true, "windows/amd64": true}
	got := map[string]bool{}
	for _, pl := range p.Spec.Platforms {
		osName, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		platform := osName + "/" + arch
		got[platform] = true
		assert.Equal(t, "https://github.com/ichor-dev/ichor-policy/releases/download/v1.2.3/ichor_"+osName+"_"+arch+".tar.gz", pl.URI, platform)
		sum, name, _ := strings.Cut(pl.SHA256, "#")
		assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}$`), sum, platform)
		assert.Equal(t, "SHA256_"+strings.ToUpper(osName)+"_"+strings.ToUpper(arch), name, "%s: the sha256 of another platform's archive", platform)
		bin := "ichor"
		if osName == "windows" {
			bin += ".exe"
		}
		assert.Equal(t, bin, pl.Bin, platform)
		require.Len(t, pl.Files, 1, platform)
		assert.Equal(t, bin, pl.Files[0].From, platform)
	}
	assert.Equal(t, want, got)
	assert.Len(t, placeholders, 1+len(want), "placeholders: %v", placeholders)
}

// stripComments drops the manifest's comment lines: they explain the
// placeholders, and only the manifest's own are counted.
func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if !strings.HasPrefix(line, "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}
