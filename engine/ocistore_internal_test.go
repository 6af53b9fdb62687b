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
// never removed on a guess.
func TestAStoreThePruningCannotReadIsLeftWhole(t *testing.T) {
	blob := func(root string) string { return filepath.Join(root, "blobs", "sha256", "ab") }
	for name, index := range map[string]string{
		"index not JSON":          `{"manifests":`,
		"tagged manifest missing": `{"manifests":[{"digest":"sha256:` + sixtyFour("c") + `","annotations":{"org.opencontainers.image.ref.name":"stable"}}]}`,
		"index over its bound":    "",
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Dir(blob(root)), 0o700))
			require.NoError(t, os.WriteFile(blob(root), []byte("x"), 0o600))
			data := []byte(index)
			if index == "" {
				data = make([]byte, maxOCIIndexBytes+1)
			}
			require.NoError(t, os.WriteFile(filepath.Join(root, "index.json"), data, 0o600))
			removed, err := pruneOCIStore(root, bundles.DefaultLimits, "")
			require.Error(t, err)
			assert.Zero(t, removed)
			assert.FileExists(t, blob(root))
		})
	}
	removed, err := pruneOCIStore(t.TempDir(), bundles.DefaultLimits, "")
	require.NoError(t, err, "nothing pulled yet")
	assert.Zero(t, removed)
}

func sixtyFour(c string) string { return strings.Repeat(c, 64) }
