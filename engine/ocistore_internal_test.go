package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// A store whose index is past its bound (OPA's store adds an entry for each
// manifest it ever pulled, and never removes one: a tag moved at every poll
// for weeks) has every blob removed, with the reason: the next revision is
// fetched whole, and the disk stays bounded. Before, the pruning stopped
// there for good, and each revision after it stayed on disk until the
// manager's /tmp was full (review 197B F1).
func TestAStoreWhoseIndexIsPastItsBoundIsEmptied(t *testing.T) {
	root := storeWithABlob(t, make([]byte, maxOCIIndexBytes+1))
	removed, err := pruneOCIStore(root, bundles.DefaultLimits, "")
	require.ErrorIs(t, err, errIndexOverBound)
	assert.Contains(t, err.Error(), "every blob was removed")
	assert.Equal(t, 1, removed)
	assert.NoFileExists(t, blobOf(root))
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
