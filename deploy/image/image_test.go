package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testVersion  = "v0.0.0-imagetest"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testRepo     = "registry.example.com/ichor-policy"
)

var testCreated = time.Unix(1700000000, 0).UTC()

// TestImage builds the real image for this machine's platform twice, reads
// it back as an OCI layout, checks what the chart relies on, and runs the
// binary it holds, as the image's user in the image's file system when the
// test may (as root, in a chroot).
func TestImage(t *testing.T) {
	platform := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	bundle := caBundle(t)
	o := Options{
		Dir: filepath.Join("..", ".."), Platforms: []v1.Platform{platform},
		Version: testVersion, Revision: testRevision, Repository: testRepo,
		Created: testCreated, CABundle: bundle,
	}
	dirs := [2]string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	var digests [2]v1.Hash
	for i, dir := range dirs {
		o.Out = dir
		var err error
		digests[i], err = Build(t.Context(), o)
		require.NoError(t, err)
	}
	assert.Equal(t, digests[0], digests[1], "the same inputs built twice gave two images")
	archives := [2]string{filepath.Join(t.TempDir(), "a.tar"), filepath.Join(t.TempDir(), "b.tar")}
	for i := range dirs {
		require.NoError(t, Archive(dirs[i], archives[i], testCreated))
	}
	assert.Equal(t, sha256Hex(readFile(t, archives[0])), sha256Hex(readFile(t, archives[1])), "the same layout gave two archives")

	// The layout names the index by tag and by full reference.
	root, err := layout.ImageIndexFromPath(dirs[0])
	require.NoError(t, err)
	rootManifest, err := root.IndexManifest()
	require.NoError(t, err)
	require.Len(t, rootManifest.Manifests, 1)
	desc := rootManifest.Manifests[0]
	assert.Equal(t, types.OCIImageIndex, desc.MediaType)
	assert.Equal(t, digests[0], desc.Digest)
	assert.Equal(t, testVersion, desc.Annotations[AnnotationRefName])
	assert.Equal(t, testRepo+":"+testVersion, desc.Annotations[AnnotationContainerdName])

	idx, err := root.ImageIndex(desc.Digest)
	require.NoError(t, err)
	idxManifest, err := idx.IndexManifest()
	require.NoError(t, err)
	assert.Equal(t, testVersion, idxManifest.Annotations[AnnotationVersion])
	assert.Equal(t, testRevision, idxManifest.Annotations[AnnotationRevision])
	require.Len(t, idxManifest.Manifests, 1)
	require.NotNil(t, idxManifest.Manifests[0].Platform)
	assert.Equal(t, platform, *idxManifest.Manifests[0].Platform)
	img, err := idx.Image(idxManifest.Manifests[0].Digest)
	require.NoError(t, err)

	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{Entrypoint}, cf.Config.Entrypoint)
	assert.Empty(t, cf.Config.Cmd, "no default arguments: the chart's first is the command")
	assert.Equal(t, User, cf.Config.User)
	assert.Equal(t, platform.OS, cf.OS)
	assert.Equal(t, platform.Architecture, cf.Architecture)
	assert.Equal(t, testCreated, cf.Created.UTC())
	wantLabels := map[string]string{
		AnnotationTitle: "ichor-policy", AnnotationDescription: description, AnnotationSource: "https://github.com/ichor-dev/ichor-policy",
		AnnotationVersion: testVersion, AnnotationRevision: testRevision, AnnotationCreated: "2023-11-14T22:13:20Z",
		LabelCABundle: sha256Hex(readFile(t, bundle)),
	}
	assert.Equal(t, wantLabels, cf.Config.Labels)
	m, err := img.Manifest()
	require.NoError(t, err)
	assert.Equal(t, types.OCIManifestSchema1, m.MediaType)
	assert.Equal(t, wantLabels, m.Annotations)
	require.Len(t, m.Layers, 2, "the base's files, then the binary")

	rootfs := t.TempDir()
	files := extract(t, img, rootfs)
	assertFile(t, files, "ichor", tar.TypeReg, 0o555, 0)
	assertFile(t, files, "etc/passwd", tar.TypeReg, 0o644, 0)
	assertFile(t, files, "etc/group", tar.TypeReg, 0o644, 0)
	assertFile(t, files, "etc/ssl/certs/ca-certificates.crt", tar.TypeReg, 0o644, 0)
	assertFile(t, files, "home/nonroot", tar.TypeDir, 0o700, UID)
	assertFile(t, files, "tmp", tar.TypeDir, 0o1777, 0)
	assert.Contains(t, string(readFile(t, filepath.Join(rootfs, "etc/passwd"))), "\nnonroot:x:65532:65532:")
	assert.Contains(t, string(readFile(t, filepath.Join(rootfs, "etc/group"))), "\nnonroot:x:65532:\n")
	assert.Equal(t, readFile(t, bundle), readFile(t, filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt")))
	for name, h := range files {
		assert.Equal(t, testCreated, h.ModTime.UTC(), name)
	}

	binary := filepath.Join(rootfs, "ichor")
	assertStatic(t, binary)
	assertStamped(t, binary, platform)
	assertRuns(t, rootfs)
}

// TestMultiPlatformIndex assembles an index of two platforms (with stand-in
// binaries: compiling ichor for another architecture is the go command's
// business) and checks each platform's image is whole and says so.
func TestMultiPlatformIndex(t *testing.T) {
	o := testOptions(t, "linux/amd64", "linux/arm64")
	base, err := resolveBase(o)
	require.NoError(t, err)
	idx := assembleWith(t, o, base)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, 2)
	for i, d := range m.Manifests {
		require.NotNil(t, d.Platform)
		assert.Equal(t, o.Platforms[i], *d.Platform)
		img, err := idx.Image(d.Digest)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		assert.Equal(t, o.Platforms[i].Architecture, cf.Architecture)
		dir := t.TempDir()
		extract(t, img, dir)
		assert.Equal(t, "binary for "+o.Platforms[i].Architecture, string(readFile(t, filepath.Join(dir, "ichor"))), "the platform's binary")
	}
	assert.Equal(t, testVersion, m.Annotations[AnnotationVersion])
	assert.NotContains(t, m.Annotations, AnnotationBaseDigest, "a base digest belongs to one platform")
}

// TestBaseMustBePinnedByDigest: a tag is refused before anything is built.
func TestBaseMustBePinnedByDigest(t *testing.T) {
	notALayout := t.TempDir()
	for _, tc := range []struct{ name, base string }{
		{"a tag", "gcr.io/distroless/static:nonroot"},
		{"no tag", "debian"},
		{"a local registry's tag", "localhost:5000/base:v1"},
		{"a directory that is not a layout", notALayout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(t, "linux/amd64")
			o.Base = tc.base
			// Nothing to build from: had the base not been refused first,
			// the go command would have failed.
			o.Dir = filepath.Join(t.TempDir(), "no-module")
			_, err := Build(t.Context(), o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "is not pinned by digest: give NAME@sha256:DIGEST or an OCI image layout directory")
			assert.NoDirExists(t, o.Out)
		})
	}
	o := testOptions(t, "linux/amd64")
	o.Base = "gcr.io/distroless/static@sha256:notadigest"
	_, err := resolveBase(o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `base image "gcr.io/distroless/static@sha256:notadigest"`)
}

// TestBaseByDigestAndFromALayout builds on a two-platform base served by a
// registry in this process, named by digest, and on the same base in an OCI
// layout: each platform's image starts with its base's layers and records
// the base's digest.
func TestBaseByDigestAndFromALayout(t *testing.T) {
	baseIdx := testBase(t)
	server := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(server.Close)
	repo := strings.TrimPrefix(server.URL, "http://") + "/base"
	baseDigest, err := baseIdx.Digest()
	require.NoError(t, err)
	tagged, err := name.NewTag(repo + ":latest")
	require.NoError(t, err)
	require.NoError(t, remote.WriteIndex(tagged, baseIdx, remote.WithContext(t.Context())))
	baseLayout := filepath.Join(t.TempDir(), "base")
	p, err := layout.Write(baseLayout, empty.Index)
	require.NoError(t, err)
	require.NoError(t, p.AppendIndex(baseIdx))

	for _, tc := range []struct{ test, base, name string }{
		{test: "by digest", base: repo + "@" + baseDigest.String(), name: repo + "@" + baseDigest.String()},
		{test: "by tag and digest", base: repo + ":latest@" + baseDigest.String(), name: repo + ":latest@" + baseDigest.String()},
		{test: "from a layout", base: baseLayout},
	} {
		t.Run(tc.test, func(t *testing.T) {
			o := testOptions(t, "linux/amd64", "linux/arm64")
			o.Base = tc.base
			base, err := resolveBase(o)
			require.NoError(t, err)
			idx := assembleWith(t, o, base)
			for _, pl := range o.Platforms {
				want, err := findImage(baseIdx, pl)
				require.NoError(t, err)
				wantDigest, err := want.Digest()
				require.NoError(t, err)
				img, err := findImage(idx, pl)
				require.NoError(t, err)
				cf, err := img.ConfigFile()
				require.NoError(t, err)
				assert.Equal(t, wantDigest.String(), cf.Config.Labels[AnnotationBaseDigest])
				assert.Equal(t, "from the base", cf.Config.Labels["base.label"], "the base's labels stay")
				assert.NotContains(t, cf.Config.Labels, LabelCABundle, "the CA bundle is the empty base's")
				if tc.name != "" {
					assert.Equal(t, tc.name, cf.Config.Labels[AnnotationBaseName])
				} else {
					assert.NotContains(t, cf.Config.Labels, AnnotationBaseName, "a layout's path is not a name")
				}
				assert.Equal(t, []string{Entrypoint}, cf.Config.Entrypoint)
				assert.Equal(t, User, cf.Config.User)
				files := extract(t, img, t.TempDir())
				assert.Contains(t, files, "etc/os-release", "the base's file")
				assert.Contains(t, files, "ichor")
				assert.NotContains(t, files, "tmp", "the empty base's files are not added to a base")
			}
		})
	}

	t.Run("a base without the platform", func(t *testing.T) {
		o := testOptions(t, "linux/s390x")
		o.Base = baseLayout
		base, err := resolveBase(o)
		require.NoError(t, err)
		_, err = assemble(t.Context(), o, base, map[string]string{"linux/s390x": standIn(t, "s390x")}, t.TempDir())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no image for the platform linux/s390x")
	})
}

// TestLayoutReplacesOnlyALayout: an earlier build's layout is replaced
// whole, unless it is the base; any other directory is left alone.
func TestLayoutReplacesOnlyALayout(t *testing.T) {
	o := testOptions(t, "linux/amd64")
	base, err := resolveBase(o)
	require.NoError(t, err)
	idx := assembleWith(t, o, base)
	require.NoError(t, writeLayout(o, idx))
	stale := filepath.Join(o.Out, "blobs", "sha256", "stale")
	require.NoError(t, os.WriteFile(stale, nil, 0o600))
	require.NoError(t, writeLayout(o, idx))
	assert.NoFileExists(t, stale)

	o.Base = o.Out
	err = o.validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is the output directory")

	o.Base, o.Out = "", t.TempDir()
	mine := filepath.Join(o.Out, "mine")
	require.NoError(t, os.WriteFile(mine, []byte("keep"), 0o600))
	err = writeLayout(o, idx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not an OCI image layout: refusing to replace it")
	assert.FileExists(t, mine)
}

// testOptions are options for the cheap tests, which assemble stand-in
// binaries instead of building ichor.
func testOptions(t *testing.T, platforms ...string) Options {
	t.Helper()
	o := Options{
		Out: filepath.Join(t.TempDir(), "image"), Version: testVersion, Revision: testRevision,
		Repository: testRepo, Created: testCreated, CABundle: caBundle(t),
	}
	for _, s := range platforms {
		p, err := v1.ParsePlatform(s)
		require.NoError(t, err)
		o.Platforms = append(o.Platforms, *p)
	}
	require.NoError(t, o.validate())
	return o
}

// assembleWith assembles o's platforms from stand-in binaries.
func assembleWith(t *testing.T, o Options, base baseFunc) v1.ImageIndex {
	t.Helper()
	binaries := map[string]string{}
	for _, p := range o.Platforms {
		binaries[p.String()] = standIn(t, p.Architecture)
	}
	idx, err := assemble(t.Context(), o, base, binaries, t.TempDir())
	require.NoError(t, err)
	return idx
}

// standIn is a stand-in binary that names its architecture.
func standIn(t *testing.T, arch string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ichor")
	require.NoError(t, os.WriteFile(p, []byte("binary for "+arch), 0o600))
	return p
}

// testBase is a base index of two platforms, each image with a file of its
// own, and a label.
func testBase(t *testing.T) v1.ImageIndex {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		layer, err := newLayer(t.TempDir(), types.OCILayer, testCreated, []file{
			{name: "/etc", mode: fs.ModeDir | 0o755},
			{name: "/etc/os-release", mode: 0o644, data: []byte("base for " + arch)},
		})
		require.NoError(t, err)
		img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		cf.Config.Labels = map[string]string{"base.label": "from the base"}
		img, err = mutate.ConfigFile(img, cf)
		require.NoError(t, err)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return idx
}

// caBundle writes a bundle of one self-signed CA certificate.
func caBundle(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "image test CA"},
		NotBefore: testCreated, NotAfter: testCreated.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return p
}

// extract writes img's file system into dir and returns its headers by
// name.
func extract(t *testing.T, img v1.Image, dir string) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	files := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		name := strings.TrimSuffix(h.Name, "/")
		target := filepath.Join(dir, filepath.FromSlash(name))
		require.True(t, strings.HasPrefix(target, dir+string(filepath.Separator)), "%s leaves the image", h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(target, 0o700))
			require.NoError(t, os.Chmod(target, h.FileInfo().Mode().Perm()))
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(target, data, h.FileInfo().Mode().Perm()))
		default:
			t.Fatalf("%s: unexpected type %c", h.Name, h.Typeflag)
		}
		files[name] = h
	}
	return files
}

func assertFile(t *testing.T, files map[string]*tar.Header, name string, typ byte, mode int64, uid int) {
	t.Helper()
	h, ok := files[name]
	if !assert.True(t, ok, "the image has no %s", name) {
		return
	}
	assert.Equal(t, typ, h.Typeflag, name)
	assert.Equal(t, mode, h.Mode, "%s: mode %o", name, h.Mode)
	assert.Equal(t, uid, h.Uid, name)
	assert.Equal(t, uid, h.Gid, name)
}

// assertStatic: the binary asks for no dynamic loader and no library, as
// the empty base has none.
func assertStatic(t *testing.T, binary string) {
	t.Helper()
	f, err := elf.Open(binary)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "the binary asks for a dynamic loader")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	assert.Empty(t, libs)
}

// assertStamped reads how the binary was built from the build information
// the linker wrote into it. That leaves out -ldflags under -trimpath (they
// may hold paths), so the stamp is looked for in the binary's bytes, where
// -X puts the version as a string, if ichor links internal/version at all
// (-X on a package not linked does nothing).
func assertStamped(t *testing.T, binary string, p v1.Platform) {
	t.Helper()
	bi, err := buildinfo.ReadFile(binary)
	require.NoError(t, err)
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	assert.Equal(t, "0", settings["CGO_ENABLED"])
	assert.Equal(t, "true", settings["-trimpath"])
	assert.Equal(t, p.OS, settings["GOOS"])
	assert.Equal(t, p.Architecture, settings["GOARCH"])
	assert.True(t, bytes.Contains(readFile(t, binary), []byte(testVersion)), "the binary does not hold the version %s", testVersion)
	assert.NotContains(t, settings, "vcs.revision", "the work tree's state is not part of the binary")
	assert.Equal(t, "github.com/ichor-dev/ichor-policy/cmd/ichor", bi.Path)
}

// assertRuns runs /ichor: as the image's user in the image's file system
// when the test runs as root, else from the extracted tree. It asks `ichor
// version -o json` for the stamped version.
func assertRuns(t *testing.T, rootfs string) {
	t.Helper()
	run := func(args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(rootfs, "ichor"), args...)
		cmd.Env = []string{}
		if os.Geteuid() == 0 {
			require.NoError(t, os.Chmod(rootfs, 0o755))
			cmd.Path, cmd.Dir = Entrypoint, "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: UID, Gid: UID}}
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return append(out, stderr.Bytes()...), err
		}
		return out, nil
	}
	out, err := run("version", "-o", "json")
	require.NoError(t, err, "%s", out)
	var v struct {
		Version string `json:"version"`
	}
	require.NoError(t, json.Unmarshal(out, &v), "%s", out)
	assert.Equal(t, testVersion, v.Version)
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

// TestLayerMediaTypeFollowsTheBase: a layer added to a Docker manifest is a
// Docker layer and the manifest gets no annotations, so an image never mixes
// the two specifications.
func TestLayerMediaTypeFollowsTheBase(t *testing.T) {
	o := testOptions(t, "linux/amd64")
	cf, err := empty.Image.ConfigFile()
	require.NoError(t, err)
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	docker, err := mutate.ConfigFile(empty.Image, cf)
	require.NoError(t, err)
	from, err := fromImage(docker, o.Platforms[0])
	require.NoError(t, err)
	img, err := platformImage(o, from, o.Platforms[0], standIn(t, "amd64"), t.TempDir())
	require.NoError(t, err)
	m, err := img.Manifest()
	require.NoError(t, err)
	assert.Equal(t, types.DockerManifestSchema2, m.MediaType)
	require.Len(t, m.Layers, 1)
	assert.Equal(t, types.DockerLayer, m.Layers[0].MediaType)
	assert.Empty(t, m.Annotations, "a Docker manifest has no annotations")
	cf, err = img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, testVersion, cf.Config.Labels[AnnotationVersion])
}

// TestTheMakefileCompilesAsTheImageDoes: the GOFLAGS and CGO_ENABLED that the
// Makefile exports to go test and the binaries the tests run are
// Compile's, so a cold `make test` compiles the project's packages once, not
// once for the tests and again, without cgo and with -trimpath, for the
// image (the ichor graph: 1,550 packages, most of the 19 CPU-minutes the
// tests' compile costs cold on two cores).
func TestTheMakefileCompilesAsTheImageDoes(t *testing.T) {
	exported := map[string]string{}
	for line := range strings.Lines(string(readFile(t, filepath.Join("..", "..", "Makefile")))) {
		if rest, ok := strings.CutPrefix(line, "export "); ok {
			if name, value, ok := strings.Cut(rest, ":="); ok {
				exported[strings.TrimSpace(name)] = strings.TrimSpace(value)
			}
		}
	}
	want := map[string]string{"GOFLAGS": strings.Join(compileFlags, " ")}
	for _, kv := range compileEnv {
		name, value, _ := strings.Cut(kv, "=")
		if name == "GOFLAGS" || name == "CGO_ENABLED" {
			want[name] = strings.TrimSpace(want[name] + " " + value)
		}
	}
	for name, value := range want {
		require.Contains(t, exported, name, "the Makefile does not export %s", name)
		assert.ElementsMatch(t, strings.Fields(value), strings.Fields(exported[name]), "%s: the Makefile's beside Compile's", name)
	}
}

// What the caller's environment could change of the binary, or of the
// toolchain that builds it, is set for every build of the image (review
// 183: GOEXPERIMENT and GOFIPS140 passed through, and a GOTOOLCHAIN other
// than local may download a prebuilt toolchain, which the project forbids).
func TestTheCallersEnvironmentDoesNotChangeTheBuild(t *testing.T) {
	set := map[string]string{}
	for _, kv := range compileEnv {
		name, value, _ := strings.Cut(kv, "=")
		set[name] = value
	}
	for name, want := range map[string]string{"GOTOOLCHAIN": "local", "GOEXPERIMENT": "", "GOFIPS140": "off", "GOWORK": "off", "CGO_ENABLED": "0"} {
		value, ok := set[name]
		assert.True(t, ok, "%s is left to the caller's environment", name)
		assert.Equal(t, want, value, name)
	}

	// GOEXPERIMENT set empty is read as unset, and the user's go env file
	// decides (review 184): a build it would give an experiment is refused.
	goenv := filepath.Join(t.TempDir(), "go.env")
	require.NoError(t, os.WriteFile(goenv, []byte("GOEXPERIMENT=jsonv2\n"), 0o600))
	env := append(append(os.Environ(), compileEnv...), "GOENV="+goenv)
	assert.ErrorContains(t, checkNoExperiment(t.Context(), ".", env), "GOEXPERIMENT=jsonv2")
	// Compile asks before it builds (review 185: the check alone was tested).
	t.Setenv("GOENV", goenv)
	_, err := Compile(t.Context(), Options{Dir: filepath.Join("..", ".."), Version: "v0.0.0-test"}, v1.Platform{OS: "linux", Architecture: "amd64"}, t.TempDir())
	assert.ErrorContains(t, err, "GOEXPERIMENT=jsonv2")
	require.NoError(t, os.WriteFile(goenv, nil, 0o600))
	assert.NoError(t, checkNoExperiment(t.Context(), ".", env))

	// The revision is stamped last: the last -X wins over LDFlags'.
	flags := compileLDFlags(Options{LDFlags: "-X " + revisionVar + "=bogus", Version: "v1.2.3", Revision: "abc"})
	assert.True(t, strings.HasSuffix(flags, "-X "+revisionVar+"=abc"), flags)
}
