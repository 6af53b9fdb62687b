package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	// `go test` runs in the package's directory (a path from runtime.Caller
	// is not one under -trimpath, as `make test` builds).
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return dir
}

// TestRenderKrewFillsEveryPlaceholderOfThePlatformsBuilt: the manifest gets
// the version and each archive's own sha256; a platform not built is left
// out, one built that the template lacks is refused.
func TestRenderKrewFillsEveryPlaceholderOfThePlatformsBuilt(t *testing.T) {
	tmpl, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "krew", KrewManifest))
	require.NoError(t, err)
	sums := map[string]string{
		"linux/amd64": strings.Repeat("1", 64), "linux/arm64": strings.Repeat("2", 64),
		"darwin/amd64": strings.Repeat("3", 64), "darwin/arm64": strings.Repeat("4", 64),
		"windows/amd64": strings.Repeat("5", 64),
	}
	out, err := RenderKrew(tmpl, "v1.2.3", sums)
	require.NoError(t, err)
	m := parseKrew(t, out)
	assert.Equal(t, "v1.2.3", m.Spec.Version)
	require.Len(t, m.Spec.Platforms, len(sums))
	for _, p := range m.Spec.Platforms {
		key := p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"]
		assert.Equal(t, sums[key], p.SHA256, key)
		assert.Equal(t, "https://github.com/ichor-dev/ichor-policy/releases/download/v1.2.3/"+PluginArchiveName(v1.Platform{OS: p.Selector.MatchLabels["os"], Architecture: p.Selector.MatchLabels["arch"]}), p.URI)
	}
	assert.NotContains(t, string(out), "${")

	out, err = RenderKrew(tmpl, "v1.2.3", map[string]string{"linux/amd64": sums["linux/amd64"]})
	require.NoError(t, err)
	assert.Len(t, parseKrew(t, out).Spec.Platforms, 1)

	_, err = RenderKrew(tmpl, "v1.2.3", map[string]string{"linux/riscv64": sums["linux/amd64"]})
	require.ErrorContains(t, err, "no platform linux/riscv64")
	_, err = RenderKrew([]byte("spec:\n  platforms:\n  - selector: {matchLabels: {os: linux, arch: amd64}}\n    uri: ${NOPE}\n"), "v1.2.3", map[string]string{"linux/amd64": sums["linux/amd64"]})
	require.ErrorContains(t, err, "keeps a placeholder")
}

// TestPluginArchiveIsReproducible: the binary alone, executable, under its
// name; the same input and time give the same bytes, whose sha256 is
// returned.
func TestPluginArchiveIsReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ichor.exe")
	require.NoError(t, os.WriteFile(bin, []byte("MZ binary"), 0o600))
	created := time.Unix(1700000000, 0)
	a, b := filepath.Join(dir, "a.tar.gz"), filepath.Join(dir, "b.tar.gz")
	sumA, err := PluginArchive(bin, a, created)
	require.NoError(t, err)
	sumB, err := PluginArchive(bin, b, created)
	require.NoError(t, err)
	assert.Equal(t, sumA, sumB)
	da, err := os.ReadFile(a)
	require.NoError(t, err)
	db, err := os.ReadFile(b)
	require.NoError(t, err)
	assert.Equal(t, da, db)
	got, err := fileSHA256(a)
	require.NoError(t, err)
	assert.Equal(t, got, sumA)

	gz, err := gzip.NewReader(bytes.NewReader(da))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	h, err := tr.Next()
	require.NoError(t, err)
	assert.Equal(t, "ichor.exe", h.Name)
	assert.EqualValues(t, 0o755, h.Mode)
	assert.Equal(t, created.UTC(), h.ModTime.UTC())
	body, err := io.ReadAll(tr)
	require.NoError(t, err)
	assert.Equal(t, "MZ binary", string(body))
	_, err = tr.Next()
	assert.ErrorIs(t, err, io.EOF, "one file only")
}

// TestPinImageSetsTheImageBlockOnly: the digest and repository are written
// into image:, not into another block that has a digest or repository, and
// values.yaml without them is an error rather than a chart that pins
// nothing.
func TestPinImageSetsTheImageBlockOnly(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "chart", "values.yaml"))
	require.NoError(t, err)
	digest := "sha256:" + strings.Repeat("c", 64)
	out, err := pinImage(values, "registry.example/ichor", digest)
	require.NoError(t, err)
	assert.Contains(t, string(out), "image:\n")
	assert.Contains(t, string(out), "\n  repository: registry.example/ichor\n")
	assert.Contains(t, string(out), "\n  digest: \""+digest+"\"\n")
	assert.Equal(t, strings.Count(string(values), "\n"), strings.Count(string(out), "\n"), "only lines replaced")

	_, err = pinImage([]byte("other:\n  digest: \"\"\n"), "r", digest)
	require.Error(t, err)
	_, err = pinImage(values, "r", "latest")
	require.Error(t, err)
}

// TestWriteChecksumsIsSha256sumsFormat: `sha256sum -c` reads it.
func TestWriteChecksumsIsSha256sumsFormat(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b"), []byte("b"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o600))
	require.NoError(t, WriteChecksums(dir, []string{"b", "a"}))
	got, err := os.ReadFile(filepath.Join(dir, Checksums))
	require.NoError(t, err)
	assert.Equal(t, "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb  a\n"+
		"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d  b\n", string(got))
}

func TestBuildRefusesAVersionThatIsNotARelease(t *testing.T) {
	for _, v := range []string{"", "0.2.0", "v0.2", "v0.2.0-dirty+x", "6d13eb0", "v0.2.0-3-g6d13eb0-dirty+"} {
		_, err := Build(t.Context(), Options{Version: v})
		assert.ErrorContains(t, err, "a release is vMAJOR.MINOR.PATCH", v)
	}
	// git describe's, the Makefile's default VERSION past a tag or with
	// changes: valid semver, no release (review 24).
	for _, v := range []string{"v0.2.0-dirty", "v0.2.0-3-g6d13eb0", "v0.2.0-3-g6d13eb0-dirty", "v0.2.0-rc.1-12-gabcdef01"} {
		_, err := Build(t.Context(), Options{Version: v})
		assert.ErrorContains(t, err, "a release is built from a clean checkout of its tag", v)
	}
}
