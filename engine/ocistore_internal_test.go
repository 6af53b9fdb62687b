package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// A store the pruning cannot read is left whole, with the reason: a blob is
// never removed on a guess of which ones the tag needs.
func TestAStoreThePruningCannotReadIsLeftWhole(t *testing.T) {
	for name, index := range map[string]string{
		"index not JSON":          `{"manifests":`,
		"tagged manifest missing": `{"manifests":[{"digest":"sha256:` + sixtyFour("c") + `","annotations":{"org.opencontainers.image.ref.name":"stable"}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			root := storeWithABlob(t, []byte(index))
			removed, err := pruneOCIStore(root, bundles.DefaultLimits, "")
			require.Error(t, err)
			assert.Zero(t, removed)
			assert.FileExists(t, blobOf(root))
		})
	}
	removed, err := pruneOCIStore(t.TempDir(), bundles.DefaultLimits, "")
	require.NoError(t, err, "nothing pulled yet")
	assert.Zero(t, removed)
}

// A store whose index is longer than any bound a read of it whole could
// take (OPA's store adds an entry for each manifest it ever pulled, and
// never removes one: a tag moved at every poll for weeks) is pruned as any:
// the tagged manifest and its layer are kept, the rest removed. Before, an
// index past 16 MiB stopped the pruning for good, and each revision after
// it stayed on disk until the manager's /tmp was full (review 197B F1).
func TestAStoreWithALongIndexIsPrunedAsAny(t *testing.T) {
	root := storeWithABlob(t, nil) // the blob is a revision gone by
	layer := []byte("a bundle")
	layerDigest := godigest.FromBytes(layer)
	manifest, err := json.Marshal(ocispec.Manifest{Layers: []ocispec.Descriptor{{MediaType: bundles.OCILayerMediaType, Digest: layerDigest, Size: int64(len(layer))}}})
	require.NoError(t, err)
	manifestDigest := godigest.FromBytes(manifest)
	for _, b := range [][]byte{layer, manifest} {
		require.NoError(t, os.WriteFile(filepath.Join(root, "blobs", "sha256", godigest.FromBytes(b).Encoded()), b, 0o600))
	}
	var index bytes.Buffer
	index.WriteString(`{"schemaVersion":2,"manifests":[`)
	for i := range 120_000 { // about 18 MiB
		fmt.Fprintf(&index, `{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":500},`, godigest.FromString(strconv.Itoa(i)))
	}
	fmt.Fprintf(&index, `{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%d,"annotations":{"org.opencontainers.image.ref.name":"stable"}}]}`, manifestDigest, len(manifest))
	require.Greater(t, index.Len(), 16<<20)
	require.NoError(t, os.WriteFile(filepath.Join(root, "index.json"), index.Bytes(), 0o600))

	removed, err := pruneOCIStore(root, bundles.DefaultLimits, "")
	require.NoError(t, err)
	assert.Equal(t, 1, removed)
	assert.NoFileExists(t, blobOf(root), "a revision gone by")
	assert.FileExists(t, filepath.Join(root, "blobs", "sha256", manifestDigest.Encoded()), "the tagged manifest")
	assert.FileExists(t, filepath.Join(root, "blobs", "sha256", layerDigest.Encoded()), "its layer")
}

// storeWithABlob is an OCI layout holding index and one blob (blobOf).
func storeWithABlob(t *testing.T, index []byte) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Dir(blobOf(root)), 0o700))
	require.NoError(t, os.WriteFile(blobOf(root), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(root, "index.json"), index, 0o600))
	return root
}

func blobOf(root string) string { return filepath.Join(root, "blobs", "sha256", "ab") }

func sixtyFour(c string) string { return strings.Repeat(c, 64) }
