package bundles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/retry"
)

// The two schemes of a bundle kept in an OCI registry. oci:// speaks HTTPS,
// as Helm's and Flux's oci:// do. oci+http:// is a registry spoken to over
// plain HTTP (a registry on localhost or in a lab): the scheme says the
// transport, so that the manager's --bundle-allow-insecure-http stays a
// permission, as it is for an http:// URL, and never changes how an oci://
// source is fetched.
const (
	OCIScheme          = "oci://"
	OCIPlainHTTPScheme = "oci+http://"
)

// The media types of OPA's OCI bundle layout: one gzipped tar layer, the
// bundle as `opa build` writes it, which OPA's downloader looks for among the
// manifest's layers (and an image config, as OPA's documented `oras push`).
const (
	OCILayerMediaType  = ocispec.MediaTypeImageLayerGzip
	OCIConfigMediaType = ocispec.MediaTypeImageConfig
)

// OCIRef is a bundle's place in a registry: oci://REGISTRY/REPOSITORY:TAG or
// oci://REGISTRY/REPOSITORY@sha256:DIGEST.
type OCIRef struct {
	registry.Reference
	// PlainHTTP is the oci+http:// scheme.
	PlainHTTP bool
}

// IsOCI says whether a bundle source names an OCI registry.
func IsOCI(source string) bool {
	return strings.HasPrefix(source, OCIScheme) || strings.HasPrefix(source, OCIPlainHTTPScheme)
}

// ParseOCIRef reads an oci:// or oci+http:// bundle source. A tag or a digest
// is required: a bare repository would mean whatever "latest" is today.
func ParseOCIRef(source string) (OCIRef, error) {
	var ref OCIRef
	rest, ok := strings.CutPrefix(source, OCIScheme)
	if !ok {
		if rest, ok = strings.CutPrefix(source, OCIPlainHTTPScheme); !ok {
			return ref, fmt.Errorf("bundle source %q is not an OCI reference (%sREGISTRY/REPOSITORY:TAG)", source, OCIScheme)
		}
		ref.PlainHTTP = true
	}
	parsed, err := registry.ParseReference(rest)
	if err != nil {
		return ref, fmt.Errorf("bundle source %q: %w", source, err)
	}
	if parsed.Reference == "" {
		return ref, fmt.Errorf("bundle source %q names no tag or digest: add :TAG or @sha256:DIGEST", source)
	}
	ref.Reference = parsed
	return ref, nil
}

// String is the source as it was given, scheme included.
func (r OCIRef) String() string {
	if r.PlainHTTP {
		return OCIPlainHTTPScheme + r.Reference.String()
	}
	return OCIScheme + r.Reference.String()
}

// ServiceURL is the registry's base URL, as OPA's OCI service expects it.
func (r OCIRef) ServiceURL() string {
	if r.PlainHTTP {
		return "http://" + r.Registry
	}
	return "https://" + r.Registry
}

// ErrPushDigest is a push to a digest reference: the registry computes the
// digest, so a push names a tag.
var ErrPushDigest = errors.New("give a tag, not a digest: the registry computes the digest of what is pushed")

// MaxFileBytes bounds each file of a bundle the manager fetches over the
// network (engine.MaxBundleFileBytes): OPA reads files into memory before it
// checks the signature. A push of a bundle beyond it is refused, since every
// manager would refuse it.
const MaxFileBytes = 8 << 20

// PushOptions are the options of PushOCI.
type PushOptions struct {
	// Credential answers the registry's login; nil reads the Docker
	// credential store (~/.docker/config.json and its helpers), where
	// `docker login` and `oras login` put them.
	Credential auth.CredentialFunc
	// Verification, when set, is the managers' key: a bundle it does not
	// verify is not pushed.
	Verification *bundle.VerificationConfig
}

// PushOCI pushes a bundle tarball to a registry in OPA's OCI layout and
// returns the manifest's descriptor. The bundle must load and be signed:
// the manager refuses an unsigned bundle from any network source, so an
// unsigned push could only fail later, on every replica.
func PushOCI(ctx context.Context, ref OCIRef, tarball []byte, opts PushOptions) (ocispec.Descriptor, error) {
	if !isTag(ref) {
		return ocispec.Descriptor{}, ErrPushDigest
	}
	b, err := checkPushable(tarball, opts.Verification)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	repo, err := remote.NewRepository(ref.Reference.String())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("registry %s: %w", ref, err)
	}
	repo.PlainHTTP = ref.PlainHTTP
	cred := opts.Credential
	if cred == nil {
		store, err := credentials.NewStoreFromDocker(credentials.StoreOptions{})
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("registry credentials: %w", err)
		}
		cred = credentials.Credential(store)
	}
	repo.Client = &auth.Client{Client: retry.DefaultClient, Cache: auth.NewCache(), Credential: cred}

	store := memory.New()
	layer := content.NewDescriptorFromBytes(OCILayerMediaType, tarball)
	config := content.NewDescriptorFromBytes(OCIConfigMediaType, []byte("{}"))
	for _, blob := range []struct {
		desc ocispec.Descriptor
		data []byte
	}{{layer, tarball}, {config, []byte("{}")}} {
		if err := store.Push(ctx, blob.desc, bytes.NewReader(blob.data)); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("stage the bundle: %w", err)
		}
	}
	manifest, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "", oras.PackManifestOptions{
		Layers:           []ocispec.Descriptor{layer},
		ConfigDescriptor: &config,
		ManifestAnnotations: map[string]string{
			ocispec.AnnotationTitle:    "ichor-policy bundle",
			ocispec.AnnotationRevision: b.Manifest.Revision,
		},
	})
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("pack the bundle: %w", err)
	}
	tag := ref.Reference.Reference
	if err := store.Tag(ctx, manifest, tag); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("stage the bundle: %w", err)
	}
	if _, err := oras.Copy(ctx, store, tag, repo, tag, oras.DefaultCopyOptions); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("push to %s: %w", ref, err)
	}
	return manifest, nil
}

// checkPushable refuses a bundle no manager would load: one that does not
// read, holds no module, or is not signed (by the key of vc, when given; else
// the signature is checked by whoever pulls, with their key).
func checkPushable(tarball []byte, vc *bundle.VerificationConfig) (*bundle.Bundle, error) {
	r := bundle.NewReader(bytes.NewReader(tarball)).WithSizeLimitBytes(MaxFileBytes)
	if vc != nil {
		r = r.WithBundleVerificationConfig(vc)
	} else {
		signed, err := hasSignatures(tarball)
		if err != nil {
			return nil, fmt.Errorf("the bundle does not read: %w", err)
		}
		if !signed {
			return nil, errors.New("the bundle is not signed, and the manager refuses unsigned bundles from a registry: build it with `ichor bundle build --signing-key KEY`")
		}
		r = r.WithSkipBundleVerification(true)
	}
	b, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("the bundle does not read: %w", err)
	}
	if len(b.Modules) == 0 {
		return nil, errors.New("the bundle holds no Rego module")
	}
	return &b, nil
}

// hasSignatures says whether a bundle tarball carries a signatures file.
func hasSignatures(tarball []byte) (bool, error) {
	loader := bundle.NewTarballLoaderWithBaseURL(bytes.NewReader(tarball), "")
	for {
		f, err := loader.NextFile()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if bundle.IsSignaturesFile(f.Path()) {
			return true, nil
		}
	}
}

func isTag(ref OCIRef) bool {
	return ref.ValidateReferenceAsTag() == nil
}
