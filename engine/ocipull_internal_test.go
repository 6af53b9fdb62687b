package engine

import (
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// A manifest of as many empty layers as the compressed limit holds (two
// MiB, some 700,000 of them) is refused for its count without decoding
// them: decoded into descriptors first, they took 100 MiB before their
// count was looked at (review 178 F8). Every "layers" key counts, in any
// case: encoding/json decodes each before it keeps the last (review 223 F1).
func TestAManifestsLayersAreCountedBeforeTheyAreDecoded(t *testing.T) {
	limits := bundles.DefaultLimits
	layers := int(limits.CompressedBytes/3) - 20
	huge := `{"schemaVersion":2,"layers":[` + strings.Repeat(`{},`, layers-1) + `{}]}`
	require.LessOrEqual(t, int64(len(huge)), limits.CompressedBytes)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err := checkManifest([]byte(huge), limits)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrBundleManifest)
	assert.ErrorContains(t, err, strconv.Itoa(layers)+" layers, more than the 4 a bundle may have")
	allocated := after.TotalAlloc - before.TotalAlloc
	// The decoder's buffer as it grows and one copy of the list: a few
	// times the manifest, where decoding the layers took fifty.
	assert.Less(t, float64(allocated), 8*float64(limits.CompressedBytes), "bytes allocated to refuse a %d-byte manifest", len(huge))
	t.Logf("%d layers in %d bytes refused with %d bytes allocated", layers, len(huge), allocated)

	for _, c := range []struct{ name, manifest, want string }{
		{"a long list before a short one", `{"layers":[{},{},{},{},{},{}],"Layers":[{"size":1}]}`, "6 layers, more than the 4"},
		{"a long list after a short one, in another case", `{"layers":[{"size":1}],"LAYERS":[{},{},{},{},{}]}`, "5 layers, more than the 4"},
		{"a long list before null", "{\"layer\u017f\":[{},{},{},{},{}],\"layers\":null}", "5 layers, more than the 4"},
		{"one list", `{"layers":[{"size":1},{"size":2}]}`, ""},
		{"not a list", `{"layers":{"a":1}}`, "not a manifest"},
		{"not JSON", `{"layers":[{},{},{},{},{},`, "not a manifest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkManifest([]byte(c.manifest), limits)
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, c.want)
		})
	}
}

// listLength counts a list's elements as a JSON reader does: commas in
// strings (escaped quotes and backslashes among them) and in nested values
// are not separators.
func TestAListIsCountedAsJSONReadsIt(t *testing.T) {
	for list, want := range map[string]int{
		`[]`: 0, ` [ ] `: 0, `[{}]`: 1, `[{},{}]`: 2, `[1, "a,b", {"c": [1, 2]}, [3, 4]]`: 4,
		`["\",", "\\", ","]`: 3, `["\"", 1]`: 2, `["\\\"", 2]`: 2, `{"a": 1}`: 0, `"[1,2]"`: 0, `null`: 0,
	} {
		assert.Equal(t, want, listLength([]byte(list)), list)
	}
}

// A manifest's body is read no further than maxManifestBytes, before it is
// parsed: what oras and OPA's downloader decode afterwards (annotations,
// descriptors) is bounded by it (review 223 F2).
func TestAManifestLargerThanABundlesIsRefusedAsItIsRead(t *testing.T) {
	reg := &answers{status: http.StatusOK, size: maxManifestBytes + 1}
	tr := &limitsTransport{base: reg, limits: bundles.DefaultLimits, oci: true, plainHTTP: true}
	_, err := do(t, tr, http.MethodGet, "manifests/stable")
	require.ErrorIs(t, err, ErrBundleManifest)
	assert.ErrorContains(t, err, "larger than 65536 bytes")

	// One of the bound is read, and judged as a manifest (these bytes are
	// not one).
	reg.size = maxManifestBytes
	_, err = do(t, tr, http.MethodGet, "manifests/stable")
	require.ErrorIs(t, err, ErrBundleManifest)
	assert.ErrorContains(t, err, "not a manifest")
}
