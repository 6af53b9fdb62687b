package bundles_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/open-policy-agent/opa/v1/bundle"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/ichor-dev/ichor-policy/bundles"
)

func TestTheEmbeddedBundleCarriesTheFloor(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	epoch, err := bundles.Epoch(b.Manifest)
	require.NoError(t, err)
	assert.Equal(t, bundles.Floor(), epoch)
	assert.Positive(t, bundles.Floor())
	for _, m := range b.Modules {
		assert.NotContains(t, m.Path, bundles.EpochFile)
	}
}

// The epoch is in the manifest, which the signature covers: changed after
// signing, the bundle is refused.
func TestTheSignatureCoversTheEpoch(t *testing.T) {
	key := testKey(t)
	b, err := bundles.Default()
	require.NoError(t, err)
	bundles.SetEpoch(b, 7)
	require.NoError(t, bundles.Sign(b, key, "RS256", "ichor"))
	bundles.SetEpoch(b, 8)
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	_, err = bundles.ReadVerified(data, verification(t, key))
	require.ErrorContains(t, err, "digest mismatch")
	assert.Contains(t, err.Error(), ".manifest")
}

func verification(t *testing.T, private string) *bundle.VerificationConfig {
	t.Helper()
	return bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{"ichor": {Key: publicOf(t, private), Algorithm: "RS256"}}, "ichor", "", nil)
}

func TestEpochReadsWhatJSONDecodes(t *testing.T) {
	for _, v := range []any{int64(3), float64(3), "3"} {
		got, err := bundles.Epoch(bundle.Manifest{Metadata: map[string]any{bundles.EpochKey: v}})
		if s, ok := v.(string); ok {
			require.Error(t, err, s)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, int64(3), got)
	}
	_, err := bundles.Epoch(bundle.Manifest{Metadata: map[string]any{bundles.EpochKey: -1}})
	require.Error(t, err)
	_, err = bundles.Epoch(bundle.Manifest{})
	require.ErrorIs(t, err, bundles.ErrNoEpoch)
}

// ichor bundle push refuses an epoch not above the tag's current one (every
// manager that has seen the tag's bundle would refuse it), unless forced;
// the same bundle again is no change.
func TestPushRefusesAnEpochNotAboveTheTags(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref, err := bundles.ParseOCIRef(bundles.OCIPlainHTTPScheme + strings.TrimPrefix(srv.URL, "http://") + "/ichor/policy:stable")
	require.NoError(t, err)
	key := testKey(t)
	at := func(epoch int64, extra string) []byte {
		b, err := bundles.Default()
		require.NoError(t, err)
		if extra != "" {
			b.Data["ichor"].(map[string]any)["extra"] = extra
			b.Manifest.Revision = bundles.Digest(b)
		}
		bundles.SetEpoch(b, epoch)
		require.NoError(t, bundles.Sign(b, key, "RS256", "ichor"))
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		return data
	}
	// The epochs this release's managers take: from its floor up.
	floor := bundles.Floor()
	anon := func(context.Context, string) (auth.Credential, error) { return auth.EmptyCredential, nil }
	opts := bundles.PushOptions{Credential: anon, Verification: verification(t, key)}
	ctx := context.Background()

	_, err = bundles.PushOCI(ctx, ref, at(floor+1, ""), opts)
	require.NoError(t, err, "a tag that holds nothing yet")
	_, err = bundles.PushOCI(ctx, ref, at(floor+1, ""), opts)
	require.NoError(t, err, "the same bundle again")
	_, err = bundles.PushOCI(ctx, ref, at(floor+1, "rebuilt"), opts)
	require.ErrorIs(t, err, bundles.ErrEpochNotAbove, "another bundle of the same epoch")
	_, err = bundles.PushOCI(ctx, ref, at(floor, ""), opts)
	require.ErrorIs(t, err, bundles.ErrEpochNotAbove, "an older epoch")
	assert.ErrorContains(t, err, fmt.Sprintf("epoch %d is not above %d", floor, floor+1))
	assert.NotContains(t, err.Error(), "not checked", "with the key, the tag's epoch was verified")
	// Without the key the tag's bundle is not verified: the refusal says
	// its epoch is only its own claim (the review of 2026-12-06).
	unverified := opts
	unverified.Verification = nil
	_, err = bundles.PushOCI(ctx, ref, at(floor, ""), unverified)
	require.ErrorIs(t, err, bundles.ErrEpochNotAbove)
	assert.ErrorContains(t, err, "that bundle's signature was not checked (no --key), so its epoch is its own claim")
	_, err = bundles.PushOCI(ctx, ref, at(floor+2, ""), opts)
	require.NoError(t, err, "a newer epoch")

	// --below-floor, for managers of an older release, does not move the
	// tag back past a newer bundle: that takes --force too (review 181).
	belowFloor := opts
	belowFloor.BelowFloor = true
	_, err = bundles.PushOCI(ctx, ref, at(floor-1, ""), belowFloor)
	require.ErrorIs(t, err, bundles.ErrEpochNotAbove)

	forced := opts
	forced.Force = true

	// The tag's revision is its pusher's word (OPA checks none): the
	// refusal quotes it on one line, so it cannot print a success of its own.
	b, err := bundles.Default()
	require.NoError(t, err)
	bundles.SetEpoch(b, floor+3)
	b.Manifest.Revision = "x\nichor: pushed bundle.tar.gz to oci://reg/repo:tag"
	require.NoError(t, bundles.Sign(b, key, "RS256", "ichor"))
	forged, err := bundles.Bytes(b)
	require.NoError(t, err)
	// Pushed by another tool: ichor bundle push refuses such a revision.
	_, err = bundles.PushOCI(ctx, ref, forged, forced)
	require.ErrorIs(t, err, bundles.ErrBundleRevision)
	pushUnchecked(t, ref, forged)
	_, err = bundles.PushOCI(ctx, ref, at(floor+2, ""), opts)
	require.ErrorIs(t, err, bundles.ErrEpochNotAbove)
	assert.NotContains(t, err.Error(), "\n", "the tag's revision kept to the line")
	assert.ErrorContains(t, err, `(revision "x\nichor: pushed`)

	_, err = bundles.PushOCI(ctx, ref, at(floor, ""), forced)
	require.NoError(t, err, "forced")
	repo, err := newRepo(ref)
	require.NoError(t, err)
	b, err = bundles.TagBundle(ctx, repo, "stable", opts.Verification)
	require.NoError(t, err)
	epoch, err := bundles.Epoch(b.Manifest)
	require.NoError(t, err)
	assert.Equal(t, floor, epoch)

	unepoched, err := bundles.Default()
	require.NoError(t, err)
	delete(unepoched.Manifest.Metadata, bundles.EpochKey)
	require.NoError(t, bundles.Sign(unepoched, key, "RS256", "ichor"))
	data, err := bundles.Bytes(unepoched)
	require.NoError(t, err)
	_, err = bundles.PushOCI(ctx, ref, data, forced)
	require.ErrorIs(t, err, bundles.ErrNoEpoch, "a bundle without an epoch is never pushed")
}

// pushUnchecked pushes tarball to ref in the layout PushOCI writes, without
// its checks: what another tool (oras) could put behind a tag.
func pushUnchecked(t *testing.T, ref bundles.OCIRef, tarball []byte) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	layer := content.NewDescriptorFromBytes(bundles.OCILayerMediaType, tarball)
	config := content.NewDescriptorFromBytes(bundles.OCIConfigMediaType, []byte("{}"))
	require.NoError(t, store.Push(ctx, layer, bytes.NewReader(tarball)))
	require.NoError(t, store.Push(ctx, config, bytes.NewReader([]byte("{}"))))
	manifest, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "", oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}, ConfigDescriptor: &config})
	require.NoError(t, err)
	tag := ref.Reference.Reference
	require.NoError(t, store.Tag(ctx, manifest, tag))
	repo, err := newRepo(ref)
	require.NoError(t, err)
	_, err = oras.Copy(ctx, store, tag, repo, tag, oras.DefaultCopyOptions)
	require.NoError(t, err)
}
