package bundles_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/bundles/bundlestest"
)

// Bomb is a gzipped tar of files of size zero bytes each, as someone who may
// write to a bundle source could serve it: 40 files of 8 MiB are about
// 321 KiB.
func Bomb(t testing.TB, files int, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	zeros := make([]byte, 1<<20)
	for i := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("/x%d/policy.rego", i), Mode: 0o600, Size: size, Typeflag: tar.TypeReg}))
		for left := size; left > 0; left -= int64(len(zeros)) {
			_, err := tw.Write(zeros[:min(left, int64(len(zeros)))])
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

func TestTheBundleOfThisReleaseIsWellWithinTheLimits(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	_, err = bundles.DefaultLimits.ReadAll(bytes.NewReader(data))
	require.NoError(t, err)

	files, uncompressed := 0, int64(0)
	gz, err := gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, io.LimitReader(gz, bundles.DefaultLimits.UncompressedBytes))
	require.NoError(t, err)
	uncompressed = n
	gz, err = gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	for tr := tar.NewReader(gz); ; files++ {
		if _, err := tr.Next(); err != nil {
			break
		}
	}
	t.Logf("the bundle of this release: %d bytes compressed, %d decompressed, %d files", len(data), uncompressed, files)
	// Room to grow tenfold in each direction.
	assert.Less(t, int64(len(data))*10, bundles.DefaultLimits.CompressedBytes)
	assert.Less(t, uncompressed*10, bundles.DefaultLimits.UncompressedBytes)
	assert.Less(t, files*10, bundles.DefaultLimits.Files)
}

// The reproduced attack: 40 files of 8 MiB of zeros, about 321 KiB on the
// wire, each file within the per-file limit, which OPA's loader held whole
// (320 MiB) before it checked anything else. The scan refuses it at the
// decompressed limit, having kept nothing.
func TestABombIsRefusedByItsSizeOnceDecompressedKeepingNothing(t *testing.T) {
	bomb := Bomb(t, 40, bundles.MaxFileBytes)
	t.Logf("bomb: %d bytes compressed, %d once decompressed", len(bomb), 40*bundles.MaxFileBytes)
	require.Less(t, int64(len(bomb)), bundles.DefaultLimits.CompressedBytes, "the bomb passes the compressed limit")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader(bomb))
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
	assert.ErrorContains(t, err, "once decompressed")
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated while refusing it: %d KiB", allocated>>10)
	// Generous: the bomb is 320 MiB decompressed; the scan keeps buffers of
	// the compressed bytes and of the tar reader.
	assert.Less(t, allocated, uint64(16<<20))
}

func TestATarOfManyEmptyFilesIsRefusedByItsCount(t *testing.T) {
	_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader(Bomb(t, bundles.DefaultLimits.Files+1, 0)))
	require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
	assert.ErrorContains(t, err, "files")
	_, err = bundles.DefaultLimits.ReadAll(bytes.NewReader(Bomb(t, bundles.DefaultLimits.Files, 0)))
	require.NoError(t, err)
}

func TestOneFileBeyondThePerFileLimitIsRefused(t *testing.T) {
	_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader(Bomb(t, 1, bundles.MaxFileBytes+1)))
	require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
	assert.ErrorContains(t, err, "per file")
}

// A file OPA parses before it checks its digest is held to less than other
// files (review 28: 8 MiB of "{}," parsed to 294 MiB of heap, then failed
// its digest): data files, the manifest and the signatures, wherever they
// are; a policy of the same size is not.
func TestADataFileBeyondItsOwnLimitIsRefused(t *testing.T) {
	file := func(name string, size int64) []byte {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, Typeflag: tar.TypeReg}))
		// One JSON string of the size: a document OPA reads as JSON.
		_, err := tw.Write([]byte(`"` + strings.Repeat("x", int(size-2)) + `"`))
		require.NoError(t, err)
		require.NoError(t, tw.Close())
		require.NoError(t, gz.Close())
		return buf.Bytes()
	}
	over := bundles.DefaultLimits.DataFileBytes + 1
	for _, name := range []string{"/data.json", "/a/b/data.yaml", "/x/data.yml", "/.manifest", "/x/y.manifest", "/.signatures.json", "/patch.json"} {
		_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader(file(name, over)))
		require.ErrorIs(t, err, bundles.ErrBundleTooLarge, name)
		assert.ErrorContains(t, err, "per data file", name)
		_, err = bundles.DefaultLimits.ReadAll(bytes.NewReader(file(name, over-1)))
		if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") {
			// Refused whatever its size (TestAStructuredFileThatIsNotOneJSONDocumentIsRefused).
			assert.ErrorIs(t, err, bundles.ErrBundleEntry, name)
			continue
		}
		assert.NoError(t, err, name)
	}
	_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader(file("/a/policy.rego", over)))
	assert.NoError(t, err, "a policy is held to the per-file limit only")
}

// endless is a gzip stream that never ends: a tar of files of 1 MiB of
// zeros (which decompress a thousandfold), or random bytes (which do not
// compress).
func endless(t *testing.T, random bool) io.Reader {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	go func() {
		gz := gzip.NewWriter(pw)
		block := make([]byte, 1<<20)
		if random {
			for {
				_, _ = rand.Read(block)
				if _, err := gz.Write(block); err != nil {
					return
				}
			}
		}
		tw := tar.NewWriter(gz)
		for i := 0; ; i++ {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("x%d", i), Mode: 0o600, Size: int64(len(block)), Typeflag: tar.TypeReg}); err != nil {
				return
			}
			if _, err := tw.Write(block); err != nil {
				return
			}
		}
	}()
	return pr
}

func TestAGzipThatNeverEndsIsRefused(t *testing.T) {
	// Of zeros: the scan stops at the decompressed limit.
	err := bundles.DefaultLimits.Scan(endless(t, false))
	require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
	assert.ErrorContains(t, err, "once decompressed")
	// Of random bytes: the read stops at the compressed limit.
	_, err = bundles.DefaultLimits.ReadAll(endless(t, true))
	require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
	assert.ErrorContains(t, err, "compressed")
}

func TestWhatIsNotAGzippedTarballIsRefused(t *testing.T) {
	_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader([]byte("not a tarball")))
	require.ErrorContains(t, err, "not a gzipped tarball")
}

// A sparse entry declares 8 MiB in a kilobyte, and OPA's loader allocates
// what it declares: it is refused as sparse. The declared sizes count too,
// so a tar whose files declare more than the budget is refused although
// its stream is small.
func TestASparseBombIsRefused(t *testing.T) {
	data := bundlestest.SparseBomb(40, bundles.MaxFileBytes)
	t.Logf("sparse bomb: %d bytes compressed, %d MiB declared", len(data), 40*bundles.MaxFileBytes>>20)
	_, err := bundles.DefaultLimits.ReadAll(bytes.NewReader(data))
	require.ErrorIs(t, err, bundles.ErrBundleEntry)
	assert.ErrorContains(t, err, "sparse")
}

func TestDeclaredSizesCountAgainstTheUncompressedBudget(t *testing.T) {
	limits := bundles.Limits{UncompressedBytes: 3<<20 + 1<<19}
	// Two files of 1 MiB fit. At the fourth header the stream holds a
	// little over 3 MiB, within the budget, but the files declare 4 MiB.
	_, err := limits.ReadAll(bytes.NewReader(Bomb(t, 2, 1<<20)))
	require.NoError(t, err)
	_, err = limits.ReadAll(bytes.NewReader(Bomb(t, 4, 1<<20)))
	require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
	assert.ErrorContains(t, err, "declare")
}

func TestOnlyRegularFilesAndDirectoriesAreAllowed(t *testing.T) {
	for _, typ := range []byte{tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo} {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "x/", Mode: 0o700, Typeflag: tar.TypeDir}))
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: "x/data.json", Mode: 0o600, Typeflag: typ, Linkname: "/etc/passwd"}))
		require.NoError(t, tw.Close())
		require.NoError(t, gz.Close())
		_, err := bundles.DefaultLimits.ReadAll(&buf)
		require.ErrorIs(t, err, bundles.ErrBundleEntry, "type %q", typ)
	}
}

// An entry whose name is longer than any policy tree's is refused, and the
// refusal quotes its beginning only: archive/tar takes names of a megabyte,
// and one such entry in a bundle of a kilobyte was quoted whole in every
// refusal and log line, once a poll (review 162).
func TestAnEntryWithAVeryLongNameIsRefusedBriefly(t *testing.T) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	name := strings.Repeat("\x01", 1<<19)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Typeflag: tar.TypeSymlink, Linkname: "x"}))
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	require.Less(t, buf.Len(), 8<<10, "the test's bundle is small")

	_, err := bundles.DefaultLimits.ReadAll(&buf)
	require.ErrorIs(t, err, bundles.ErrBundleEntry)
	assert.Contains(t, err.Error(), "an entry's name is 524288 bytes, more than 1024")
	assert.Less(t, len(err.Error()), 1<<10, "the refusal quotes the name whole")
}

// A file OPA parses as a document before it checks the file's digest must be
// one JSON document, each object's keys given once: OPA reads anything else
// as YAML (an alias bomb), and a key given twice is hashed as its last value
// but decoded into the manifest as both (review of 2026-12-06). YAML data
// files are refused outright.
func TestAStructuredFileThatIsNotOneJSONDocumentIsRefused(t *testing.T) {
	tarball := func(name, content string) []byte {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(content)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(content))
		require.NoError(t, err)
		require.NoError(t, tw.Close())
		require.NoError(t, gz.Close())
		return buf.Bytes()
	}
	for _, c := range []struct{ name, content, want string }{
		{"/.manifest", `[&a "xxxx", *a, *a]`, `"/.manifest" is not one JSON document`},
		{"/x/y.manifest", `revision: r1`, "not one JSON document"},
		{"/a/data.json", "\ufeff{}", "not one JSON document"},
		{"/a/data.json", `{} {}`, "not one JSON document"},
		{"/.signatures.json", `{"signatures": [] `, "not one JSON document"},
		{"/.manifest", `{"metadata":{"ichor_epoch":9},"revision":"r","metadata":{}}`, `has the key "metadata" twice`},
		{"/a/data.json", `{"a":[{"b":1,"c":{"d":1,"d":2}}]}`, `has the key "d" twice`},
		{"/a/data.json", `{"ab":1,"a\u0062":2}`, `has the key "ab" twice`},
		{"/a/data.yaml", `a: 1`, "is YAML"},
		{"/data.yml", `{}`, "is YAML"},
	} {
		err := bundles.DefaultLimits.Scan(bytes.NewReader(tarball(c.name, c.content)))
		require.ErrorIs(t, err, bundles.ErrBundleEntry, "%s %s", c.name, c.content)
		assert.ErrorContains(t, err, c.want, "%s %s", c.name, c.content)
	}
	for _, c := range []struct{ name, content string }{
		// The same key in two objects, in nested ones and in an array's.
		{"/a/data.json", `{"a":{"a":1},"b":[{"a":1},{"a":2}],"c":{"b":{"a":[]}}}`},
		{"/.manifest", `{"revision":"r","roots":["ichor"],"metadata":{"ichor_epoch":3}}`},
		{"/a/data.json", `[1, "two", null, true, {"": {}}, []]`},
		// Not a document OPA parses: read as any file.
		{"/a/policy.rego", `package a`},
		{"/.manifest.pb", "\x0a\x01r"},
	} {
		assert.NoError(t, bundles.DefaultLimits.Scan(bytes.NewReader(tarball(c.name, c.content))), "%s %s", c.name, c.content)
	}
}

// A tarball opa build made has no revision unless asked; the engine refuses
// a bundle without one (review 162), so the CLI's reader names it by its
// digest, as a directory is named, and a revision the bundle gives is kept.
func TestATarballWithoutARevisionIsNamedByItsDigest(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	given := b.Manifest.Revision
	require.NotEmpty(t, given)
	dir := t.TempDir()
	write := func(name string) string {
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		path := dir + "/" + name
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	kept, err := bundles.Load(write("given.tar.gz"))
	require.NoError(t, err)
	assert.Equal(t, given, kept.Manifest.Revision)

	b.Manifest.Revision = ""
	named, err := bundles.Load(write("none.tar.gz"))
	require.NoError(t, err)
	assert.Equal(t, bundles.Digest(named), named.Manifest.Revision)
}

// A bundle file that is a FIFO is refused without waiting: opening one
// for reading waits for a writer, and held the manager's start and its
// polls of the file for good (review 162).
func TestABundleFileThatIsAFIFOIsRefusedAtOnce(t *testing.T) {
	path := t.TempDir() + "/bundle.tar.gz"
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	done := make(chan error, 1)
	go func() {
		_, err := bundles.DefaultLimits.ReadFile(path)
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "is not a regular file")
	case <-time.After(10 * time.Second):
		// Unblock the open so that the goroutine ends.
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			_ = f.Close()
		}
		t.Fatal("the read of a FIFO waited for a writer")
	}
}
