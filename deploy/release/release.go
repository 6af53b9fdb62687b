// Package release builds the files of a release into one directory (`make
// release`, docs/install.md): the Helm chart packaged with its version
// stamped and the image it installs pinned by digest, the manager image as an
// OCI archive, the kubectl plugin's archives per platform and their krew
// manifest, an SBOM of the Go modules in the binary, and SHA256SUMS. Each
// platform's binary is compiled once, for the image and the plugin alike, and
// every file is as reproducible as the image: the same commit, toolchain and
// SOURCE_DATE_EPOCH give the same bytes.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/deploy/image"
)

// ChartName is the chart's name, the prefix of its package.
const ChartName = "ichor-policy"

// Checksums is the name of the checksums file, in sha256sum's format.
const Checksums = "SHA256SUMS"

// KrewManifest is the name of the rendered krew manifest.
const KrewManifest = "ichor.yaml"

// Options are every input of a release.
type Options struct {
	// Dir is the repository root: the module, deploy/chart, deploy/krew.
	Dir string
	// Out is the directory the release is written to (dist).
	Out string
	// Version is the release's version, vMAJOR.MINOR.PATCH[-PRERELEASE]:
	// stamped into ichor, the image's tag, the chart's appVersion; the
	// chart's version is the same without the v.
	Version string
	// Revision, Repository, LDFlags, Base and CABundle are the image's
	// (package image); LDFlags are the plugin's too.
	Revision, Repository, LDFlags, Base, CABundle string
	// ImagePlatforms are the image's platforms; PluginPlatforms those of the
	// kubectl plugin's archives.
	ImagePlatforms, PluginPlatforms []v1.Platform
	// Created is SOURCE_DATE_EPOCH: the time of every file in every archive.
	Created time.Time
	// Helm is the helm binary that packages the chart.
	Helm string
	// SBOMTool is cyclonedx-gomod (tools/cyclonedx-gomod); empty writes no
	// SBOM, which only a test of the rest does.
	SBOMTool string
	// SigningKey is the Ed25519 key SHA256SUMS is signed with
	// (ChecksumsSignature); nil signs nothing.
	SigningKey ed25519.PrivateKey
}

// Result is what a release wrote.
type Result struct {
	// Files are the names of the files written in Out, SHA256SUMS last.
	Files []string
	// ImageDigest is the image index's digest, the one the chart pins.
	ImageDigest v1.Hash
}

var semverTag = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// notATag is what git describe adds to a tag for a commit past it
// (-3-g6d13eb0) or a tree with changes (-dirty): the Makefile's default
// VERSION outside a clean checkout of a tag, which is a valid semver
// pre-release but no release.
var notATag = regexp.MustCompile(`(-[0-9]+-g[0-9a-f]{4,}(-dirty)?|-dirty)$`)

// ChartVersion is the chart's version for a release version: without the v.
func ChartVersion(version string) string { return strings.TrimPrefix(version, "v") }

// Build writes the release into o.Out.
func Build(ctx context.Context, o Options) (*Result, error) {
	if !semverTag.MatchString(o.Version) {
		return nil, fmt.Errorf("version %q: a release is vMAJOR.MINOR.PATCH (VERSION=v0.2.0), the chart's version without the v", o.Version)
	}
	if notATag.MatchString(o.Version) {
		return nil, fmt.Errorf("version %q is git describe's for a commit past a tag or a tree with changes: a release is built from a clean checkout of its tag (git tag v0.2.0, or VERSION=v0.2.0)", o.Version)
	}
	if len(o.ImagePlatforms) == 0 || len(o.PluginPlatforms) == 0 {
		return nil, errors.New("no platform for the image or for the plugin")
	}
	if o.Created.IsZero() {
		return nil, errors.New("no creation time: set SOURCE_DATE_EPOCH")
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil { //nolint:gosec // G301: release files are public
		return nil, fmt.Errorf("creating %s: %w", o.Out, err)
	}
	work, err := os.MkdirTemp("", "ichor-release-")
	if err != nil {
		return nil, fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()

	imgOpts := image.Options{
		Dir: o.Dir, Out: filepath.Join(work, "image"), Platforms: o.ImagePlatforms, Version: o.Version,
		Revision: o.Revision, Repository: o.Repository, LDFlags: o.LDFlags, Created: o.Created,
		Base: o.Base, CABundle: o.CABundle, Binaries: map[string]string{},
	}
	// Each platform once, for the image and the plugin.
	for _, p := range slices.Concat(o.ImagePlatforms, o.PluginPlatforms) {
		if _, done := imgOpts.Binaries[p.String()]; done {
			continue
		}
		if imgOpts.Binaries[p.String()], err = image.Compile(ctx, imgOpts, p, filepath.Join(work, "bin")); err != nil {
			return nil, err
		}
	}
	res := &Result{}
	if res.ImageDigest, err = image.Build(ctx, imgOpts); err != nil {
		return nil, err
	}
	imageArchive := fmt.Sprintf("%s-image-%s.oci.tar", ChartName, ChartVersion(o.Version))
	if err := image.Archive(imgOpts.Out, filepath.Join(o.Out, imageArchive), o.Created); err != nil {
		return nil, err
	}
	res.Files = append(res.Files, imageArchive)

	chart, err := PackageChart(ctx, o.Helm, filepath.Join(o.Dir, "deploy", "chart"), o.Out, o.Version, o.Repository, res.ImageDigest.String(), o.Created)
	if err != nil {
		return nil, err
	}
	res.Files = append(res.Files, chart)

	sums := map[string]string{}
	for _, p := range o.PluginPlatforms {
		name := PluginArchiveName(p)
		sum, err := PluginArchive(imgOpts.Binaries[p.String()], filepath.Join(o.Out, name), o.Created)
		if err != nil {
			return nil, err
		}
		sums[p.String()] = sum
		res.Files = append(res.Files, name)
	}
	tmpl, err := os.ReadFile(filepath.Join(o.Dir, "deploy", "krew", KrewManifest))
	if err != nil {
		return nil, fmt.Errorf("reading the krew manifest: %w", err)
	}
	manifest, err := RenderKrew(tmpl, o.Version, sums)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, KrewManifest), manifest, 0o644); err != nil { //nolint:gosec // G306: public
		return nil, fmt.Errorf("writing the krew manifest: %w", err)
	}
	res.Files = append(res.Files, KrewManifest)

	if o.SBOMTool != "" {
		sbom := fmt.Sprintf("%s-%s.cdx.json", ChartName, ChartVersion(o.Version))
		if err := SBOM(ctx, o.SBOMTool, imgOpts.Binaries[sbomPlatform(o)], o.Version, filepath.Join(o.Out, sbom)); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, sbom)
	}
	if err := WriteChecksums(o.Out, res.Files); err != nil {
		return nil, err
	}
	res.Files = append(res.Files, Checksums)
	if o.SigningKey != nil {
		if err := SignChecksums(o.Out, o.SigningKey); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, ChecksumsSignature)
	}
	return res, nil
}

// sbomPlatform is the binary the SBOM is made from: the image's platforms
// link the same modules (linux, whatever the architecture), so linux/amd64's
// when it is built, else the image's first. The plugin's binaries for other
// systems may link more (Windows: cobra's mousetrap), which the SBOM does
// not list (docs/install.md, review 242 F5).
func sbomPlatform(o Options) string {
	for _, p := range o.ImagePlatforms {
		if p.String() == "linux/amd64" {
			return p.String()
		}
	}
	return o.ImagePlatforms[0].String()
}

// stageChart copies the chart at dir to staged: the files git tracks when dir
// is in a git work tree (as they are in it, changes included), so that a file
// left beside the chart (a values file with a secret, an editor's backup) is
// never released, as Helm, which reads the directory, would release it (review
// 24); every file of a chart outside a work tree (a copy).
func stageChart(ctx context.Context, dir, staged string) error {
	//nolint:gosec // G204: git on the chart's own directory, the releaser's.
	cmd := exec.CommandContext(ctx, "git", "-C", dir, "ls-files", "-z", "--", ".")
	// Git's own words, which say whether there is a work tree at all; the
	// directory's own index, as CheckCheckout reads it (review 185).
	cmd.Env = append(gitEnv(os.Environ()), "LC_ALL=C")
	out, err := cmd.Output()
	noGit := errors.Is(err, exec.ErrNotFound) || strings.Contains(string(stderrOf(err)), "not a git repository")
	switch {
	case noGit && !inWorkTree(dir):
		// No work tree (a copy, a tarball): the directory is the chart.
		if err := os.CopyFS(staged, os.DirFS(dir)); err != nil {
			return fmt.Errorf("copying the chart: %w", err)
		}
		return nil
	case noGit:
		// A .git above the chart that git does not read as one (not on
		// PATH, GIT_DIR or GIT_CEILING_DIRECTORIES set, a linked work
		// tree whose repository is gone): review 26.
		return fmt.Errorf("copying the chart: %s is in a git work tree that git does not list (%s): git says which of its files are the chart's", dir, bytes.TrimSpace(stderrOf(err)))
	case err != nil:
		// A work tree git will not read (another user's: "dubious
		// ownership"): not a reason to release what it does not track.
		return fmt.Errorf("listing the chart's files with git ls-files in %s: %w (%s)", dir, err, bytes.TrimSpace(stderrOf(err)))
	}
	if len(out) == 0 {
		return fmt.Errorf("copying the chart: git tracks no file of %s: add the chart before releasing it", dir)
	}
	src, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening the chart: %w", err)
	}
	defer func() { _ = src.Close() }()
	for name := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		data, err := src.ReadFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			// Tracked and deleted in the work tree: not in the chart.
			continue
		}
		if err != nil {
			return fmt.Errorf("copying the chart: %w", err)
		}
		to := filepath.Join(staged, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil { //nolint:gosec // G301: release files are public
			return fmt.Errorf("copying the chart: %w", err)
		}
		if err := os.WriteFile(to, data, 0o644); err != nil { //nolint:gosec // G306: public
			return fmt.Errorf("copying the chart: %w", err)
		}
	}
	return nil
}

// inWorkTree reports whether dir or a directory above it holds a .git.
func inWorkTree(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return true
	}
	for {
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
			return true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return false
		}
		dir = parent
	}
}

// stderrOf is what a command that exited with an error wrote on stderr.
func stderrOf(err error) []byte {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.Stderr
	}
	return nil
}

// PackageChart packages the chart at dir into out as NAME-VERSION.tgz, its
// version and appVersion stamped and its default image the one released,
// pinned by digest; every file's time is created, so the package is
// reproducible. It returns the package's name.
func PackageChart(ctx context.Context, helm, dir, out, version, repository, digest string, created time.Time) (string, error) {
	work, err := os.MkdirTemp("", "ichor-chart-")
	if err != nil {
		return "", fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	staged := filepath.Join(work, ChartName)
	if err := stageChart(ctx, dir, staged); err != nil {
		return "", err
	}
	valuesPath := filepath.Join(staged, "values.yaml")
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		return "", fmt.Errorf("reading the chart's values: %w", err)
	}
	if values, err = pinImage(values, repository, digest); err != nil {
		return "", err
	}
	if err := os.WriteFile(valuesPath, values, 0o644); err != nil { //nolint:gosec // G306: public
		return "", fmt.Errorf("writing the chart's values: %w", err)
	}
	// Helm writes each file's time into the package.
	root, err := os.OpenRoot(staged)
	if err != nil {
		return "", fmt.Errorf("opening the staged chart: %w", err)
	}
	defer func() { _ = root.Close() }()
	err = fs.WalkDir(root.FS(), ".", func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return root.Chtimes(p, created, created)
	})
	if err != nil {
		return "", fmt.Errorf("setting the chart's file times: %w", err)
	}
	//nolint:gosec // G204: the helm the Makefile pinned, on files of the repository.
	cmd := exec.CommandContext(ctx, helm, "package", staged, "--version", ChartVersion(version), "--app-version", version, "--destination", out)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+work, "HELM_CONFIG_HOME="+work, "HELM_DATA_HOME="+work)
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("helm package: %w: %s", err, output)
	}
	return fmt.Sprintf("%s-%s.tgz", ChartName, ChartVersion(version)), nil
}

// pinImage sets the image's repository and digest in the chart's values.yaml,
// whose image block is written as `image:` then `  repository: ...` and
// `  digest: ""`: the comments stay, for `helm show values`.
func pinImage(values []byte, repository, digest string) ([]byte, error) {
	if !strings.HasPrefix(digest, "sha256:") || len(digest) != len("sha256:")+64 {
		return nil, fmt.Errorf("image digest %q is not sha256:HEX", digest)
	}
	lines := strings.Split(string(values), "\n")
	inImage, repo, dig := false, 0, 0
	for i, l := range lines {
		switch {
		case l == "image:":
			inImage = true
		case inImage && l != "" && !strings.HasPrefix(l, " "):
			inImage = false
		case inImage && strings.HasPrefix(l, "  repository: "):
			lines[i], repo = "  repository: "+repository, repo+1
		case inImage && strings.HasPrefix(l, "  digest: "):
			lines[i], dig = fmt.Sprintf("  digest: %q", digest), dig+1
		}
	}
	if repo != 1 || dig != 1 {
		return nil, errors.New("the chart's values.yaml has no image.repository and image.digest to pin")
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// PluginArchiveName is the name of a platform's plugin archive, as the krew
// manifest's uri names it.
func PluginArchiveName(p v1.Platform) string {
	return fmt.Sprintf("ichor_%s_%s.tar.gz", p.OS, p.Architecture)
}

// PluginArchive writes the binary alone, as ichor (ichor.exe for windows),
// executable, into a gzipped tar at path, with fixed owner and time; it
// returns the archive's sha256.
func PluginArchive(binary, path string, created time.Time) (string, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", binary, err)
	}
	f, err := os.Create(path) //nolint:gosec // G304: the release's own output
	if err != nil {
		return "", fmt.Errorf("creating %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	gz := gzip.NewWriter(io.MultiWriter(f, h))
	tw := tar.NewWriter(gz)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg, Name: filepath.Base(binary), Mode: 0o755, Size: int64(len(data)),
		ModTime: created.UTC().Truncate(time.Second), Format: tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := tw.Write(data); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := errors.Join(tw.Close(), gz.Close(), f.Close()); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// RenderKrew fills the krew manifest template (deploy/krew/ichor.yaml): the
// version, and for each platform built its archive's sha256 (sums, by
// "os/arch"). A platform of the template not built is left out; one built
// that the template lacks, or a placeholder left, is an error.
func RenderKrew(tmpl []byte, version string, sums map[string]string) ([]byte, error) {
	var m map[string]any
	if err := sigsyaml.Unmarshal(tmpl, &m); err != nil {
		return nil, fmt.Errorf("the krew manifest: %w", err)
	}
	spec, _ := m["spec"].(map[string]any)
	platforms, _ := spec["platforms"].([]any)
	if spec == nil || len(platforms) == 0 {
		return nil, errors.New("the krew manifest has no spec.platforms")
	}
	spec["version"] = version
	var kept []any
	seen := map[string]bool{}
	for _, raw := range platforms {
		p, _ := raw.(map[string]any)
		sel, _ := p["selector"].(map[string]any)
		labels, _ := sel["matchLabels"].(map[string]any)
		key := fmt.Sprintf("%v/%v", labels["os"], labels["arch"])
		sum, ok := sums[key]
		if !ok {
			continue
		}
		seen[key] = true
		uri, _ := p["uri"].(string)
		p["uri"] = strings.ReplaceAll(uri, "${VERSION}", version)
		p["sha256"] = sum
		kept = append(kept, p)
	}
	for key := range sums {
		if !seen[key] {
			return nil, fmt.Errorf("the krew manifest has no platform %s", key)
		}
	}
	spec["platforms"] = kept
	out, err := sigsyaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("the krew manifest: %w", err)
	}
	if i := strings.Index(string(out), "${"); i >= 0 {
		return nil, fmt.Errorf("the krew manifest keeps a placeholder: %.40s", out[i:])
	}
	header := "# The krew manifest of kubectl ichor " + version + ", rendered by `make release` from deploy/krew/ichor.yaml.\n"
	return append([]byte(header), out...), nil
}

// SBOM writes a CycloneDX SBOM (JSON) of the Go modules linked into binary,
// read from its build information by cyclonedx-gomod, without a serial
// number or a timestamp so that it is reproducible.
func SBOM(ctx context.Context, tool, binary, version, path string) error {
	//nolint:gosec // G204: the tool the Makefile pinned, on the release's own binary.
	cmd := exec.CommandContext(ctx, tool, "bin", "-json", "-std", "-noserial", "-notimestamp", "-version", version, "-output", path, binary)
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cyclonedx-gomod: %w: %s", err, output)
	}
	return nil
}

// WriteChecksums writes SHA256SUMS in dir for the files named, sorted, in
// sha256sum's format (`sha256sum -c SHA256SUMS` checks them).
func WriteChecksums(dir string, names []string) error {
	sorted := slices.Clone(names)
	sort.Strings(sorted)
	var b strings.Builder
	for _, name := range sorted {
		sum, err := fileSHA256(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, name)
	}
	//nolint:gosec // G306: public
	if err := os.WriteFile(filepath.Join(dir, Checksums), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", Checksums, err)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path) //nolint:gosec // G304: the release's own output
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
