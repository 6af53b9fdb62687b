package bundles_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/ichor-dev/ichor-policy/bundles"
)

func TestParseOCIRef(t *testing.T) {
	for source, want := range map[string]struct {
		registry, repo, ref, url string
		err                      string
	}{
		"oci://ghcr.io/acme/ichor-policy:v1":                                                             {registry: "ghcr.io", repo: "acme/ichor-policy", ref: "v1", url: "https://ghcr.io"},
		"oci+http://127.0.0.1:5000/ichor/policy:stable":                                                  {registry: "127.0.0.1:5000", repo: "ichor/policy", ref: "stable", url: "http://127.0.0.1:5000"},
		"oci://r.example/p@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef": {registry: "r.example", repo: "p", ref: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", url: "https://r.example"},
		"oci://ghcr.io/acme/ichor-policy":                                                                {err: "names no tag or digest"},
		"oci://ghcr.io/ACME/p:v1":                                                                        {err: "invalid reference"},
		"https://ghcr.io/acme/p:v1":                                                                      {err: "is not an OCI reference"},
		"oci://":                                                                                         {err: "invalid reference"},
	} {
		t.Run(source, func(t *testing.T) {
			ref, err := bundles.ParseOCIRef(source)
			if want.err != "" {
				require.ErrorContains(t, err, want.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, want.registry, ref.Registry)
			assert.Equal(t, want.repo, ref.Repository)
			assert.Equal(t, want.ref, ref.Reference.Reference)
			assert.Equal(t, want.url, ref.ServiceURL())
			assert.Equal(t, source, ref.String())
		})
	}
}

// What PushOCI refuses it refuses before it speaks to any registry: the
// reference names a host that does not resolve.
func TestPushOCIRefusesWhatNoManagerWouldLoad(t *testing.T) {
	ref, err := bundles.ParseOCIRef("oci://registry.invalid/ichor/policy:v1")
	require.NoError(t, err)
	b, err := bundles.Default()
	require.NoError(t, err)
	unsigned, err := bundles.Bytes(b)
	require.NoError(t, err)

	_, err = bundles.PushOCI(context.Background(), ref, unsigned, bundles.PushOptions{})
	require.ErrorContains(t, err, "not signed")
	_, err = bundles.PushOCI(context.Background(), ref, []byte("not a bundle"), bundles.PushOptions{})
	require.ErrorContains(t, err, "does not read")

	digest, err := bundles.ParseOCIRef("oci://registry.invalid/ichor/policy@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	require.NoError(t, err)
	_, err = bundles.PushOCI(context.Background(), digest, unsigned, bundles.PushOptions{})
	require.ErrorIs(t, err, bundles.ErrPushDigest)

	// A file beyond what a manager reads of a downloaded bundle.
	big, err := bundles.Default()
	require.NoError(t, err)
	big.Data["ichor"].(map[string]any)["padding"] = strings.Repeat("x", bundles.MaxFileBytes)
	require.NoError(t, bundles.Sign(big, testKey(t), "RS256", "ichor"))
	data, err := bundles.Bytes(big)
	require.NoError(t, err)
	_, err = bundles.PushOCI(context.Background(), ref, data, bundles.PushOptions{})
	require.ErrorContains(t, err, "size")

	// A signed bundle without a revision: every manager refuses it (review
	// 163).
	nameless, err := bundles.Default()
	require.NoError(t, err)
	nameless.Manifest.Revision = ""
	require.NoError(t, bundles.Sign(nameless, testKey(t), "RS256", "ichor"))
	data, err = bundles.Bytes(nameless)
	require.NoError(t, err)
	_, err = bundles.PushOCI(context.Background(), ref, data, bundles.PushOptions{})
	require.ErrorContains(t, err, "names none")
	require.ErrorIs(t, err, bundles.ErrBundleRevision)

	// What else every manager refuses at activation (review 178): a
	// revision they cannot write into a verdict's tail, METADATA labels,
	// a builtin reaching beyond the input, roots beyond Ichor's,
	// an epoch below this release's floor (pushed with --below-floor only,
	// for older managers: it then goes on to the registry; --force, for an
	// epoch not above the tag's, is another check: review 181).
	signed := func(change func(*bundle.Bundle)) []byte {
		t.Helper()
		b, err := bundles.Default()
		require.NoError(t, err)
		change(b)
		require.NoError(t, bundles.Sign(b, testKey(t), "RS256", "ichor"))
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		return data
	}
	_, err = bundles.PushOCI(context.Background(), ref, signed(func(b *bundle.Bundle) { b.Manifest.Revision = "a(b)" }), bundles.PushOptions{})
	require.ErrorIs(t, err, bundles.ErrBundleRevision)
	_, err = bundles.PushOCI(context.Background(), ref, signed(func(b *bundle.Bundle) {
		b.Modules[0].Raw = append([]byte("# METADATA\n# labels:\n#   team: platform\n"), b.Modules[0].Raw...)
	}), bundles.PushOptions{})
	require.ErrorIs(t, err, bundles.ErrBundleLabels)
	_, err = bundles.PushOCI(context.Background(), ref, signed(func(b *bundle.Bundle) {
		b.Modules[0].Raw = append(b.Modules[0].Raw, []byte("\n_sent := http.send({\"method\": \"GET\", \"url\": \"https://example.com\"})\n")...)
	}), bundles.PushOptions{})
	require.ErrorIs(t, err, bundles.ErrBundleBuiltins)
	_, err = bundles.PushOCI(context.Background(), ref, signed(func(b *bundle.Bundle) { b.Manifest.Roots = &[]string{""} }), bundles.PushOptions{})
	require.ErrorIs(t, err, bundles.ErrBundleRoots)
	belowFloor := signed(func(b *bundle.Bundle) { bundles.SetEpoch(b, bundles.Floor()-1) })
	_, err = bundles.PushOCI(context.Background(), ref, belowFloor, bundles.PushOptions{})
	require.ErrorIs(t, err, bundles.ErrEpochBelowFloor)
	require.NotErrorIs(t, err, bundles.ErrEpochNotAbove, "the tag holds nothing it was compared with")
	_, err = bundles.PushOCI(context.Background(), ref, belowFloor, bundles.PushOptions{Force: true})
	require.ErrorIs(t, err, bundles.ErrEpochBelowFloor, "--force is for an epoch not above the tag's")
	_, err = bundles.PushOCI(context.Background(), ref, belowFloor, bundles.PushOptions{BelowFloor: true})
	require.Error(t, err, "registry.invalid answers nothing")
	require.NotErrorIs(t, err, bundles.ErrEpochBelowFloor, "--below-floor pushes it")
}

// testKey is an RSA private key in PEM, to sign bundles with.
func testKey(t *testing.T) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
}

// publicOf is the PEM public key of a PEM RSA private key.
func publicOf(t *testing.T, private string) string {
	t.Helper()
	block, _ := pem.Decode([]byte(private))
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func newRepo(ref bundles.OCIRef) (*remote.Repository, error) {
	repo, err := remote.NewRepository(ref.Reference.String())
	if err != nil {
		return nil, err
	}
	repo.PlainHTTP = ref.PlainHTTP
	return repo, nil
}
