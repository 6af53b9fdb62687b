package image

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// baseImage is what a platform's image is built on.
type baseImage struct {
	image v1.Image
	// layerType is the media type of the layer added on it: a Docker
	// manifest lists Docker layers, an OCI manifest OCI layers.
	layerType types.MediaType
	// labels record the base in the image (base.name, base.digest, the CA
	// bundle's sha256).
	labels map[string]string
}

// baseFunc returns the base for a platform; its layers may be files in work.
type baseFunc func(ctx context.Context, p v1.Platform, work string) (baseImage, error)

// resolveBase checks o.Base and returns how each platform's base is found:
// the empty base, a platform's image in an OCI layout, or in a registry by
// digest. A tag is refused: it can move, and the image built on it with it.
func resolveBase(o Options) (baseFunc, error) {
	if o.Base == "" {
		return emptyBase(o)
	}
	if strings.Contains(o.Base, "@") {
		ref, err := name.NewDigest(o.Base)
		if err != nil {
			return nil, fmt.Errorf("base image %q: %w", o.Base, err)
		}
		return remoteBase(ref), nil
	}
	if _, err := os.Stat(filepath.Join(o.Base, "oci-layout")); err == nil {
		idx, err := layout.ImageIndexFromPath(o.Base)
		if err != nil {
			return nil, fmt.Errorf("base image %s: %w", o.Base, err)
		}
		return layoutBase(o.Base, idx), nil
	}
	return nil, fmt.Errorf("base image %q is not pinned by digest: give NAME@sha256:DIGEST or an OCI image layout directory "+
		"(a tag can move, and the image built on it would move with it)", o.Base)
}

// remoteBase pulls the platform's image of ref, an image or an index,
// with the credentials of the Docker configuration (~/.docker/config.json).
func remoteBase(ref name.Digest) baseFunc {
	return func(ctx context.Context, p v1.Platform, _ string) (baseImage, error) {
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(p), remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return baseImage{}, fmt.Errorf("pulling the base image %s for %s: %w", ref, p.String(), err)
		}
		b, err := fromImage(img, p)
		if err != nil {
			return baseImage{}, fmt.Errorf("base image %s: %w", ref, err)
		}
		b.labels[AnnotationBaseName] = ref.String()
		return b, nil
	}
}

// layoutBase finds the platform's image in an OCI layout, through nested
// indexes. The layout's path says nothing about its content and differs
// between machines, so only the base's digest is recorded.
func layoutBase(dir string, idx v1.ImageIndex) baseFunc {
	return func(_ context.Context, p v1.Platform, _ string) (baseImage, error) {
		img, err := findImage(idx, p)
		if err != nil {
			return baseImage{}, fmt.Errorf("base image %s: %w", dir, err)
		}
		b, err := fromImage(img, p)
		if err != nil {
			return baseImage{}, fmt.Errorf("base image %s: %w", dir, err)
		}
		return b, nil
	}
}

var errNoPlatform = errors.New("no image for the platform")

// findImage is the first image for p in idx, depth first.
func findImage(idx v1.ImageIndex, p v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading the index: %w", err)
	}
	for _, d := range m.Manifests {
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("reading the index %s: %w", d.Digest, err)
			}
			img, err := findImage(child, p)
			if errors.Is(err, errNoPlatform) {
				continue
			}
			return img, err
		case d.MediaType.IsImage():
			if d.Platform != nil && !d.Platform.Satisfies(p) {
				continue
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("reading the image %s: %w", d.Digest, err)
			}
			if d.Platform == nil {
				cf, err := img.ConfigFile()
				if err != nil {
					return nil, fmt.Errorf("reading the configuration of %s: %w", d.Digest, err)
				}
				if cf.OS != p.OS || cf.Architecture != p.Architecture {
					continue
				}
			}
			return img, nil
		}
	}
	return nil, fmt.Errorf("%w %s", errNoPlatform, p.String())
}

// fromImage checks that img is for p (a digest of a single image names one
// platform, whatever was asked) and records its digest.
func fromImage(img v1.Image, p v1.Platform) (baseImage, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return baseImage{}, fmt.Errorf("reading its configuration: %w", err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		return baseImage{}, fmt.Errorf("it is for %s/%s, not %s", cf.OS, cf.Architecture, p.String())
	}
	digest, err := img.Digest()
	if err != nil {
		return baseImage{}, fmt.Errorf("reading its digest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return baseImage{}, fmt.Errorf("reading its media type: %w", err)
	}
	layerType := types.OCILayer
	if mt == types.DockerManifestSchema2 {
		layerType = types.DockerLayer
	}
	return baseImage{image: img, layerType: layerType, labels: map[string]string{AnnotationBaseDigest: digest.String()}}, nil
}

// emptyBase is an image with only what the static binary needs: a passwd
// and group naming the user it runs as (some libraries look the user up),
// its home, /tmp for the policy engine's bundle (the chart mounts an
// emptyDir there), and the CA bundle. The manager reaches the API server and
// the Talos APIs with their own CAs, but a bundle or decision-log URL may be
// a public HTTPS service, whose roots only the bundle holds.
func emptyBase(o Options) (baseFunc, error) {
	files := []file{
		{name: "/etc", mode: fs.ModeDir | 0o755},
		{name: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "/etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	}
	labels := map[string]string{}
	if o.CABundle != "" {
		pem, err := os.ReadFile(o.CABundle)
		if err != nil {
			return nil, fmt.Errorf("reading the CA bundle (Debian: apt-get install ca-certificates): %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the CA bundle %s holds no PEM certificate", o.CABundle)
		}
		files = append(files,
			file{name: "/etc/ssl", mode: fs.ModeDir | 0o755},
			file{name: "/etc/ssl/certs", mode: fs.ModeDir | 0o755},
			file{name: DefaultCABundle, mode: 0o644, data: pem})
		labels[LabelCABundle] = sha256Hex(pem)
	}
	files = append(files,
		file{name: "/home", mode: fs.ModeDir | 0o755},
		file{name: "/home/nonroot", mode: fs.ModeDir | 0o700, uid: UID},
		file{name: "/tmp", mode: fs.ModeDir | fs.ModeSticky | 0o777})

	return func(_ context.Context, p v1.Platform, work string) (baseImage, error) {
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		layer, err := newLayer(work, types.OCILayer, o.Created, files)
		if err != nil {
			return baseImage{}, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   layer,
			History: v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "ichor-policy make image: the empty base"},
		})
		if err != nil {
			return baseImage{}, fmt.Errorf("the empty base for %s: %w", p.String(), err)
		}
		return baseImage{image: img, layerType: types.OCILayer, labels: maps.Clone(labels)}, nil
	}, nil
}
