// Package image builds the manager image without a container daemon and
// without a registry: `ichor`, compiled static for each platform, on an empty
// base that holds only what the binary needs (or on a base pinned by digest),
// written as an OCI image layout (`make image`). Every input is named and the
// clock is SOURCE_DATE_EPOCH, so the same inputs give the same digest.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the chart relies on (deploy/chart tests it): the image runs /ichor,
// with no default arguments, so the chart's first argument is the command
// (`manager`) and `version` or `policy check-csr` run from the same image;
// and it runs as 65532, numeric, so that runAsNonRoot can verify it.
const (
	Entrypoint = "/ichor"
	UID        = 65532
	User       = "65532:65532"
)

// The OCI annotation keys (image-spec annotations.md), set as labels on the
// configuration and as annotations on each manifest and the index.
const (
	AnnotationTitle       = "org.opencontainers.image.title"
	AnnotationDescription = "org.opencontainers.image.description"
	AnnotationSource      = "org.opencontainers.image.source"
	AnnotationVersion     = "org.opencontainers.image.version"
	AnnotationRevision    = "org.opencontainers.image.revision"
	AnnotationCreated     = "org.opencontainers.image.created"
	AnnotationBaseName    = "org.opencontainers.image.base.name"
	AnnotationBaseDigest  = "org.opencontainers.image.base.digest"
	// AnnotationRefName names the index in the layout's index.json: the tag,
	// as `skopeo copy oci:DIR:TAG` and `crane push` read it.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationContainerdName is the full reference `ctr images import`
	// names the image by.
	AnnotationContainerdName = "io.containerd.image.name"
	// LabelCABundle is the sha256 of the CA bundle put in the empty base:
	// which roots the image trusts is part of what it is.
	LabelCABundle = "dev.ichor.image.ca-bundle.sha256"
)

const (
	title       = "ichor-policy"
	description = "The security core of Ichor: approves kubelet certificate signing requests against the node's identity read from its Talos API and issues Talos credentials, every rule in Rego with every decision logged."
	source      = "https://github.com/ichor-dev/ichor-policy"
	versionVar  = "github.com/ichor-dev/ichor-policy/internal/version.Version"
	revisionVar = "github.com/ichor-dev/ichor-policy/internal/version.Revision"

	// DefaultCABundle is Debian's ca-certificates bundle, where Go's
	// crypto/x509 also looks for it on Linux.
	DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// Options are every input of the image: the same options on the same source
// give the same digest.
type Options struct {
	// Dir is the root of the module ./cmd/ichor is built from.
	Dir string
	// Out is the OCI image layout directory to write. An existing layout
	// there is replaced; any other existing directory is refused.
	Out string
	// Platforms are the OS/ARCH pairs of the image index.
	Platforms []v1.Platform
	// Version is stamped into the binary (internal/version) and is the tag.
	Version string
	// Revision is the VCS revision of the source, for the revision label.
	Revision string
	// Repository is the image's name without the tag, for the references
	// recorded in the layout.
	Repository string
	// LDFlags are more linker flags, before the version stamp.
	LDFlags string
	// Created is the image's creation time (SOURCE_DATE_EPOCH), the
	// modification time of every file in it.
	Created time.Time
	// Base is empty for the empty base, else an OCI image layout directory or
	// a reference pinned by digest (NAME@sha256:...).
	Base string
	// CABundle is the PEM file of CA certificates the empty base carries at
	// /etc/ssl/certs/ca-certificates.crt; empty for none. A Base brings its
	// own, so it is not used with one.
	CABundle string
	// Binaries are ichor binaries already built by Compile with these
	// options, by platform ("linux/amd64"): the release builds each platform
	// once, for the image and the plugin archives alike. A platform not
	// here is compiled.
	Binaries map[string]string
}

// Build compiles ichor for each platform, builds the image index on the
// base and writes it to o.Out as an OCI image layout. It returns the index's
// digest.
func Build(ctx context.Context, o Options) (v1.Hash, error) {
	if err := o.validate(); err != nil {
		return v1.Hash{}, err
	}
	// The base is resolved before anything is compiled, so an unpinned one is
	// refused at once.
	base, err := resolveBase(o)
	if err != nil {
		return v1.Hash{}, err
	}
	work, err := os.MkdirTemp("", "ichor-image-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()

	binaries := map[string]string{}
	for _, p := range o.Platforms {
		if b, ok := o.Binaries[p.String()]; ok {
			binaries[p.String()] = b
			continue
		}
		if binaries[p.String()], err = Compile(ctx, o, p, work); err != nil {
			return v1.Hash{}, err
		}
	}
	idx, err := assemble(ctx, o, base, binaries, work)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := writeLayout(o, idx); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

func (o Options) validate() error {
	if len(o.Platforms) == 0 {
		return errors.New("no platform to build for")
	}
	for _, p := range o.Platforms {
		// Only what the go command is told (GOOS, GOARCH) decides the binary;
		// a variant would be a claim about it that nothing made true.
		if p.OS == "" || p.Architecture == "" || p.Variant != "" || p.OSVersion != "" || len(p.OSFeatures) > 0 || len(p.Features) > 0 {
			return fmt.Errorf("platform %q: give OS/ARCH, such as linux/amd64", p.String())
		}
	}
	if o.Out == "" {
		return errors.New("no output directory")
	}
	// The output is removed before it is written, and a layout base is read
	// while it is.
	if o.Base != "" && samePath(o.Base, o.Out) {
		return fmt.Errorf("the base image %s is the output directory", o.Base)
	}
	if _, err := tag(o); err != nil {
		return err
	}
	if o.Created.IsZero() {
		return errors.New("no creation time: set SOURCE_DATE_EPOCH")
	}
	return nil
}

func samePath(a, b string) bool {
	a, errA := filepath.Abs(a)
	b, errB := filepath.Abs(b)
	return errA == nil && errB == nil && a == b
}

// tag is the image's reference: the repository at the version.
func tag(o Options) (name.Tag, error) {
	t, err := name.NewTag(o.Repository+":"+o.Version, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("repository %q and version %q do not make an image reference: %w", o.Repository, o.Version, err)
	}
	return t, nil
}

// compileFlags and compileEnv are what Compile gives the go command besides
// -ldflags, -o, GOOS and GOARCH. The Makefile exports the same GOFLAGS and
// CGO_ENABLED for go vet and the tests, so that a run of the suite compiles
// each package once, for the tests and the image alike, rather than twice
// (TestTheMakefileCompilesAsTheImageDoes).
var (
	compileFlags = []string{"-trimpath"}
	// GOWORK=off: a go.work in the tree (ignored by git, so no change it
	// sees) or in a parent directory would redirect the modules built.
	// GOEXPERIMENT and GOFIPS140 from the caller's environment change the
	// binary too, and GOTOOLCHAIN other than local may download a prebuilt
	// toolchain (review 183).
	compileEnv = []string{"CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOAMD64=v1", "GOARM64=v8.0", "GOWORK=off", "GOTOOLCHAIN=local", "GOEXPERIMENT=", "GOFIPS140=off"}
)

// compileLDFlags are the linker flags of Compile: the version and, when
// given, the revision last, since the last -X wins, so that LDFlags from the
// environment (make's LDFLAGS ?=) cannot stamp another revision than the
// image's label says (review 184).
func compileLDFlags(o Options) string {
	ldflags := "-s -w " + o.LDFlags + " -X " + versionVar + "=" + o.Version
	if o.Revision != "" {
		ldflags += " -X " + revisionVar + "=" + o.Revision
	}
	return ldflags
}

// checkNoExperiment refuses a build whose go command would turn on an
// experiment: GOEXPERIMENT set empty is read as unset, and the user's go
// env file (go env -w) then decides (review 184).
func checkNoExperiment(ctx context.Context, dir string, env []string) error {
	//nolint:gosec // G204: the build machine's go command, fixed arguments.
	cmd := exec.CommandContext(ctx, "go", "env", "GOEXPERIMENT")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("go env GOEXPERIMENT: %w: %s", err, bytes.TrimSpace(exit.Stderr))
		}
		return fmt.Errorf("go env GOEXPERIMENT: %w", err)
	}
	if got := strings.TrimSpace(string(out)); got != "" {
		return fmt.Errorf("the go command would build with GOEXPERIMENT=%s (from go env -w, whose setting go env -u GOEXPERIMENT removes, or the toolchain's own default): the image is built without experiments", got)
	}
	return nil
}

// Compile builds ./cmd/ichor for p into work/OS-ARCH/: static (no cgo),
// without the paths of the build machine (-trimpath) or its VCS state, the
// version stamped. Without its symbol table and DWARF (-s -w) the binary is a
// third smaller; its build information stays, for `go version -m`. For
// windows it is ichor.exe. Only o.Dir, o.LDFlags, o.Version and o.Revision
// are read.
func Compile(ctx context.Context, o Options, p v1.Platform, work string) (string, error) {
	name := "ichor"
	if p.OS == "windows" {
		name += ".exe"
	}
	out := filepath.Join(work, p.OS+"-"+p.Architecture, name)
	ldflags := compileLDFlags(o)
	args := append([]string{"build"}, compileFlags...)
	//nolint:gosec // G204: the build machine's go command, with the options of whoever runs make image.
	cmd := exec.CommandContext(ctx, "go", append(args, "-ldflags", ldflags, "-o", out, "./cmd/ichor")...)
	cmd.Dir = o.Dir
	// GOFLAGS, GOAMD64, GOARM64, GOEXPERIMENT and GOFIPS140 from the
	// caller's environment would change the binary; they are set to what
	// every build of the image uses.
	cmd.Env = append(append(os.Environ(), compileEnv...), "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if err := checkNoExperiment(ctx, o.Dir, cmd.Env); err != nil {
		return "", err
	}
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building ichor for %s: %w\n%s", p.String(), err, output.String())
	}
	return out, nil
}

// assemble makes one image per platform on its base, from the binaries by
// platform, and the index of them.
func assemble(ctx context.Context, o Options, base baseFunc, binaries map[string]string, work string) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var annotations map[string]string
	for _, p := range o.Platforms {
		binary, ok := binaries[p.String()]
		if !ok {
			return nil, fmt.Errorf("no binary for %s", p.String())
		}
		from, err := base(ctx, p, work)
		if err != nil {
			return nil, err
		}
		img, err := platformImage(o, from, p, binary, work)
		if err != nil {
			return nil, fmt.Errorf("the image for %s: %w", p.String(), err)
		}
		if annotations == nil {
			annotations = imageLabels(o, from.labels)
			// The index speaks for every platform: a base differs by platform.
			delete(annotations, AnnotationBaseDigest)
			delete(annotations, LabelCABundle)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	annotated, ok := mutate.Annotations(idx, annotations).(v1.ImageIndex)
	if !ok {
		return nil, errors.New("annotating the image index did not give an index")
	}
	return annotated, nil
}

// imageLabels are the labels and annotations of the image: what it is,
// where it comes from, and what it was built on.
func imageLabels(o Options, fromBase map[string]string) map[string]string {
	l := map[string]string{
		AnnotationTitle:       title,
		AnnotationDescription: description,
		AnnotationSource:      source,
		AnnotationVersion:     o.Version,
		AnnotationCreated:     o.Created.UTC().Format(time.RFC3339),
	}
	if o.Revision != "" {
		l[AnnotationRevision] = o.Revision
	}
	maps.Copy(l, fromBase)
	return l
}

// platformImage is ichor for p on from: the binary in a layer of its own,
// then the configuration (entrypoint, user, labels) and the manifest's
// annotations.
func platformImage(o Options, from baseImage, p v1.Platform, binary, work string) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	layer, err := newLayer(work, from.layerType, o.Created, []file{{name: Entrypoint, mode: 0o555, data: bin}})
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(from.image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "ichor-policy make image: " + Entrypoint},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the binary: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the configuration: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, ""
	cf.Created = v1.Time{Time: o.Created}
	cf.Config.Entrypoint = []string{Entrypoint}
	cf.Config.Cmd = nil
	cf.Config.User = User
	cf.Config.WorkingDir = "/"
	labels := imageLabels(o, from.labels)
	// The base's own labels stay unless ours say otherwise.
	cf.Config.Labels = maps.Clone(cf.Config.Labels)
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	maps.Copy(cf.Config.Labels, labels)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("writing the configuration: %w", err)
	}
	// A Docker manifest has no annotations: on a Docker base the labels say
	// it all.
	if from.layerType == types.DockerLayer {
		return img, nil
	}
	annotated, ok := mutate.Annotations(img, labels).(v1.Image)
	if !ok {
		return nil, errors.New("annotating the image did not give an image")
	}
	return annotated, nil
}

// file is one entry of a layer: a directory when data is nil and mode has
// fs.ModeDir.
type file struct {
	name string
	mode fs.FileMode
	uid  int
	data []byte
}

// newLayer writes files as a gzipped tar into work and returns it as a
// layer. Every header field is fixed (owner, mode, time), and it is
// compressed once, here, with the standard library, so that the digest
// depends on the content alone.
func newLayer(work string, mediaType types.MediaType, created time.Time, files []file) (v1.Layer, error) {
	f, err := os.CreateTemp(work, "layer-*.tar.gz")
	if err != nil {
		return nil, fmt.Errorf("creating a layer: %w", err)
	}
	defer func() { _ = f.Close() }()
	zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		return nil, fmt.Errorf("compressing a layer: %w", err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range files {
		h := &tar.Header{
			Name:    strings.TrimPrefix(e.name, "/"),
			Mode:    int64(e.mode.Perm()),
			Uid:     e.uid,
			Gid:     e.uid,
			ModTime: created.UTC().Truncate(time.Second),
			Format:  tar.FormatPAX,
		}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if e.mode.IsDir() {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing %s to a layer: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("writing %s to a layer: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing a layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compressing a layer: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("writing a layer: %w", err)
	}
	path := f.Name()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(path) }, tarball.WithMediaType(mediaType))
	if err != nil {
		return nil, fmt.Errorf("reading a layer back: %w", err)
	}
	return layer, nil
}

// writeLayout writes idx to o.Out as an OCI image layout, named in its
// index.json by the tag (skopeo, crane) and the full reference (containerd).
func writeLayout(o Options, idx v1.ImageIndex) error {
	if err := clearLayout(o.Out); err != nil {
		return err
	}
	ref, err := tag(o)
	if err != nil {
		return err
	}
	p, err := layout.Write(o.Out, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the image layout %s: %w", o.Out, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		AnnotationRefName:        ref.TagStr(),
		AnnotationContainerdName: ref.Name(),
	})); err != nil {
		return fmt.Errorf("writing the image to the layout %s: %w", o.Out, err)
	}
	return nil
}

// clearLayout removes a previous layout at dir, so that no blob of an older
// build stays behind, and refuses to remove anything else.
func clearLayout(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("reading the output directory: %w", err)
	case len(entries) == 0:
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("%s exists and is not an OCI image layout: refusing to replace it", dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the previous image layout: %w", err)
	}
	return nil
}

// sha256Hex is the hex sha256 of b.
func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Archive writes the layout at dir as a tar archive at path, for the tools
// that take one file (`ctr images import`, `skopeo copy oci-archive:`, kind's
// `load image-archive`). Its entries come in lexical order with fixed owner,
// mode and time, so it is as reproducible as the layout.
func Archive(dir, path string, created time.Time) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".image-*.tar")
	if err != nil {
		return fmt.Errorf("creating the archive: %w", err)
	}
	defer func() {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: created.UTC().Truncate(time.Second), Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, info.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		return copyFile(tw, p)
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	// Readable by whoever loads it, as the layout's files are.
	//nolint:gosec // G302: an image is no secret.
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	return nil
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = io.Copy(w, f)
	return err
}
