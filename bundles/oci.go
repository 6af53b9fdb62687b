package bundles

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/errdef"
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

// RedactedSource is a bundle source as logs and errors name it: a URL's or
// reference's password and query (where a signed URL keeps its signature)
// left out.
func RedactedSource(source string) string {
	isURL := strings.HasPrefix(source, "http://") || strings.HasPrefix(source, "https://")
	if !isURL && !IsOCI(source) {
		return source
	}
	u, err := url.Parse(source)
	if err != nil {
		return "(a bundle source that does not parse as a URL)"
	}
	return RedactedURL(u)
}

// RedactedURL is a URL as logs and errors name it: its password and query
// left out.
func RedactedURL(u *url.URL) string {
	if u.RawQuery == "" {
		return u.Redacted()
	}
	c := *u
	c.RawQuery = "..."
	return c.Redacted()
}

// IsOCI says whether a bundle source names an OCI registry.
func IsOCI(source string) bool {
	return strings.HasPrefix(source, OCIScheme) || strings.HasPrefix(source, OCIPlainHTTPScheme)
}

// ParseOCIRef reads an oci:// or oci+http:// bundle source. A tag or a digest
// is required: a bare repository would mean whatever "latest" is today.
func ParseOCIRef(source string) (OCIRef, error) {
	var ref OCIRef
	shown := RedactedSource(source)
	rest, ok := strings.CutPrefix(source, OCIScheme)
	if !ok {
		if rest, ok = strings.CutPrefix(source, OCIPlainHTTPScheme); !ok {
			return ref, fmt.Errorf("bundle source %q is not an OCI reference (%sREGISTRY/REPOSITORY:TAG)", shown, OCIScheme)
		}
		ref.PlainHTTP = true
	}
	if host, _, _ := strings.Cut(rest, "/"); strings.Contains(host, "@") {
		// A registry's credential is --bundle-registry-credentials'; one in
		// the reference would be logged with it.
		return ref, fmt.Errorf("bundle source %q carries a user before the registry: give the registry's credential with --bundle-registry-credentials", shown)
	}
	parsed, err := registry.ParseReference(rest)
	if err != nil {
		return ref, fmt.Errorf("bundle source %q: %w", shown, err)
	}
	if parsed.Reference == "" {
		return ref, fmt.Errorf("bundle source %q names no tag or digest: add :TAG or @sha256:DIGEST", shown)
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
	// Force pushes a bundle whose epoch is not above the one the tag holds
	// (which every manager that has seen the tag's bundle refuses).
	Force bool
	// BelowFloor pushes a bundle whose epoch is below this binary's floor,
	// which every manager of this release or later refuses: for managers
	// of an older release (review 181: one flag for both let a push meant
	// for older managers move a tag back past a newer bundle).
	BelowFloor bool
}

// ErrPlainHTTPCredential is a push over plain http to a registry off this
// host's loopback for which a credential is stored.
var ErrPlainHTTPCredential = errors.New("no credential over plain http")

// overPlainHTTP is cred for a registry reached over plain http: as the
// manager's, a credential goes in clear only to this host's loopback.
// docker login's for another host would be sent in clear, often one that
// pushes the organisation's images (review of 2026-12-06): asked for one
// (the registry answered 401), it refuses. It is asked only then, as
// before: a credential helper is not run for a registry that wants none.
func overPlainHTTP(cred auth.CredentialFunc) auth.CredentialFunc {
	return func(ctx context.Context, hostport string) (auth.Credential, error) {
		if OnLoopback(hostport) {
			return cred(ctx, hostport)
		}
		c, err := cred(ctx, hostport)
		if err != nil || c == auth.EmptyCredential {
			return auth.EmptyCredential, err
		}
		return auth.EmptyCredential, fmt.Errorf("%w: registry %s asks for the credential stored for it, which would go over plain http: push with oci:// (https), or to a registry on this host's loopback", ErrPlainHTTPCredential, hostport)
	}
}

// ErrEpochNotAbove is a push whose epoch is not above the tag's current one.
var ErrEpochNotAbove = errors.New("epoch not above the tag's")

// ErrEpochBelowFloor is a push whose epoch is below this binary's floor.
var ErrEpochBelowFloor = errors.New("epoch below this release's floor")

// PushOCI pushes a bundle tarball to a registry in OPA's OCI layout and
// returns the manifest's descriptor. The bundle must load and be signed:
// the manager refuses an unsigned bundle from any network source, so an
// unsigned push could only fail later, on every replica.
func PushOCI(ctx context.Context, ref OCIRef, tarball []byte, opts PushOptions) (ocispec.Descriptor, error) {
	if !isTag(ref) {
		return ocispec.Descriptor{}, ErrPushDigest
	}
	b, err := checkPushable(tarball, opts.Verification, opts.BelowFloor)
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
	if ref.PlainHTTP {
		cred = overPlainHTTP(cred)
	}
	repo.Client = &auth.Client{Client: retry.DefaultClient, Cache: auth.NewCache(), Credential: cred}
	if err := checkEpochAbove(ctx, repo, ref, b, opts); err != nil {
		return ocispec.Descriptor{}, err
	}

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
			// For people and registry tools only: managers read the epoch
			// from the signed manifest inside the bundle.
			EpochAnnotation: fmt.Sprint(b.Manifest.Metadata[EpochKey]),
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
// read, holds no module, is not signed (by the key of vc, when given; else
// the signature is checked by whoever pulls, with their key), names a
// revision the managers refuse, declares METADATA labels, or, unless
// belowFloor, carries an epoch below this binary's floor (review 178: such a
// bundle was pushed, and found out at the next poll of every replica).
func checkPushable(tarball []byte, vc *bundle.VerificationConfig, belowFloor bool) (*bundle.Bundle, error) {
	if err := DefaultLimits.Scan(bytes.NewReader(tarball)); errors.Is(err, ErrBundleTooLarge) {
		return nil, fmt.Errorf("every manager would refuse it: %w", err)
	} else if err != nil {
		return nil, fmt.Errorf("the bundle does not read: %w", err)
	}
	if int64(len(tarball)) > DefaultLimits.CompressedBytes {
		return nil, fmt.Errorf("every manager would refuse it: %w: more than %d bytes compressed", ErrBundleTooLarge, DefaultLimits.CompressedBytes)
	}
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
	if err := CheckRevision(b.Manifest.Revision); err != nil {
		// Every manager refuses it (reviews 163, 178): not pushed, rather
		// than found out at the next poll of every replica.
		return nil, fmt.Errorf("every manager would refuse it: %w", err)
	}
	if err := CheckManifest(b.Manifest); err != nil {
		return nil, fmt.Errorf("every manager would refuse it: %w", err)
	}
	for _, m := range b.Modules {
		if err := CheckModule(m.Path, m.Raw); err != nil {
			return nil, fmt.Errorf("every manager would refuse it: %w", err)
		}
	}
	epoch, err := Epoch(b.Manifest)
	if err != nil {
		return nil, err
	}
	if floor := Floor(); epoch < floor && !belowFloor {
		return nil, fmt.Errorf("%w: epoch %d is below %d, the floor of this release, whose managers refuse it (--below-floor pushes it for managers of an older release)", ErrEpochBelowFloor, epoch, floor)
	}
	return &b, nil
}

// EpochAnnotation is the OCI manifest annotation `ichor bundle push` writes
// the bundle's epoch under, for people and registry tools.
const EpochAnnotation = "dev.ichor.bundle.epoch"

// checkEpochAbove refuses, unless forced, a push whose epoch is not above
// the epoch of the bundle the tag holds now: every manager that has seen that
// bundle would refuse the new one. The same bundle again is no change.
func checkEpochAbove(ctx context.Context, repo *remote.Repository, ref OCIRef, b *bundle.Bundle, opts PushOptions) error {
	if opts.Force {
		return nil
	}
	current, err := TagBundle(ctx, repo, ref.Reference.Reference, opts.Verification)
	if errors.Is(err, errdef.ErrNotFound) {
		return nil
	}
	if errors.Is(err, ErrPlainHTTPCredential) {
		// Not the epoch's: --force would fail the same way.
		return err
	}
	if err != nil {
		return fmt.Errorf("read the bundle %s holds now, to compare epochs (--force to push regardless): %w", ref, err)
	}
	have, err := Epoch(current.Manifest)
	if err != nil {
		// A tag whose bundle has no epoch predates epochs: any epoch is above.
		return nil //nolint:nilerr // no epoch is below every epoch
	}
	want, _ := Epoch(b.Manifest)
	if want > have || (want == have && current.Manifest.Revision == b.Manifest.Revision) {
		return nil
	}
	why := "every manager that has seen that bundle refuses this one"
	if want == have {
		// Managers accept an equal epoch (a restart reloads the same
		// release), so a push at the same epoch leaves the tag's bundle
		// acceptable for ever: each release raises it.
		why = "at the same epoch both bundles stay acceptable to every manager, so the tag could be moved back to that one"
	}
	if opts.Verification == nil {
		// Without the key the tag's bundle was not verified: whoever may
		// push to the tag, without the signing key, could have made it
		// claim any epoch to hold the releases back.
		why += "; that bundle's signature was not checked (no --key), so its epoch is its own claim: give --key to check it"
	}
	return fmt.Errorf("%w: the bundle's epoch %d is not above %d, the epoch of the bundle %s holds now (revision %q); "+
		"%s: raise the epoch (the policy tree's EPOCH, or ichor bundle build --epoch), or push anyway with --force",
		ErrEpochNotAbove, want, have, ref, current.Manifest.Revision, why)
}

// TagBundle reads the bundle a tag of repo holds, within DefaultLimits, and
// verifies it with vc when given.
func TagBundle(ctx context.Context, repo *remote.Repository, tag string, vc *bundle.VerificationConfig) (*bundle.Bundle, error) {
	desc, err := repo.Resolve(ctx, tag)
	if err != nil {
		return nil, err
	}
	raw, err := content.FetchAll(ctx, repo, desc)
	if err != nil {
		return nil, err
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(raw, &manifest); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", tag, err)
	}
	for _, layer := range manifest.Layers {
		if layer.MediaType != OCILayerMediaType {
			continue
		}
		if layer.Size > DefaultLimits.CompressedBytes {
			return nil, fmt.Errorf("%w: the layer is %d bytes", ErrBundleTooLarge, layer.Size)
		}
		rc, err := repo.Fetch(ctx, layer)
		if err != nil {
			return nil, err
		}
		data, err := DefaultLimits.ReadAll(content.NewVerifyReader(rc, layer))
		rc.Close()
		if err != nil {
			return nil, err
		}
		if vc == nil {
			b, err := bundle.NewReader(bytes.NewReader(data)).WithSkipBundleVerification(true).Read()
			return &b, err
		}
		return ReadVerified(data, vc)
	}
	return nil, fmt.Errorf("the manifest of %s has no bundle layer (%s)", tag, OCILayerMediaType)
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
