package engine

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// OPA's OCI downloader copies each new revision's blobs into a store on
// disk (an OCI layout) and never removes one, so the store grows by a
// bundle with every revision the tag ever pointed to: a tag moved often
// enough, by its owner or by anyone who may push unsigned blobs to the
// repository, fills the manager's /tmp (64 MiB in the chart) and gets every
// replica evicted. The engine gives OPA the store's directory
// (persistence_directory) and, before each pull starts, removes every blob
// that the manifest tagged now does not reference: the store holds one
// revision, and the one being pulled.

// ociStoreDir is where OPA's OCI downloader keeps its store under the
// persistence directory (plugins/bundle: filepath.Join(dir, "oci")).
func ociStoreDir(persistence string) string { return filepath.Join(persistence, "oci") }

// maxKeptManifests bounds the manifests the pruning keeps: the one each
// tag names (OPA's store tags the source's one tag) and the one pinned.
const maxKeptManifests = 64

// pruneOCIStore removes from the OCI layout at root every blob that no
// tagged manifest references, nor the manifest pinned (the source's own
// digest, when it names one: OPA's store tags no name for a pull by digest,
// so its blobs were removed before each poll and the whole bundle fetched
// again, review 178), and reports how many it removed. It must not run
// during a pull: a blob being copied is referenced by no tag yet.
func pruneOCIStore(root string, limits bundles.Limits, pinned godigest.Digest) (int, error) {
	manifests, err := keptManifests(filepath.Join(root, ocispec.ImageIndexFile), pinned)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // nothing pulled yet
	}
	if err != nil {
		return 0, fmt.Errorf("read the OCI store's index: %w", err)
	}
	keep := map[string]bool{}
	for _, m := range manifests {
		if err := m.Digest.Validate(); err != nil {
			return 0, fmt.Errorf("read the OCI store's index: %w", err)
		}
		keep[blobName(m.Digest)] = true
		data, err := readBounded(filepath.Join(root, ocispec.ImageBlobsDir, blobName(m.Digest)), limits.CompressedBytes)
		if err != nil {
			return 0, fmt.Errorf("read the tagged manifest %s: %w", m.Digest, err)
		}
		var manifest ocispec.Manifest
		if err := json.Unmarshal(data, &manifest); err != nil {
			return 0, fmt.Errorf("read the tagged manifest %s: %w", m.Digest, err)
		}
		for _, d := range append([]ocispec.Descriptor{manifest.Config}, manifest.Layers...) {
			if err := d.Digest.Validate(); err == nil {
				keep[blobName(d.Digest)] = true
			}
		}
	}
	return removeBlobs(root, keep)
}

// removeBlobs removes from the OCI layout at root every blob not in keep,
// and reports how many it removed.
func removeBlobs(root string, keep map[string]bool) (int, error) {
	// The walk and the removals stay inside the store's blobs directory,
	// whatever links it holds.
	blobs, err := os.OpenRoot(filepath.Join(root, ocispec.ImageBlobsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("prune the OCI store: %w", err)
	}
	defer blobs.Close()
	removed := 0
	err = fs.WalkDir(blobs.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() || keep[path]:
			return nil
		}
		if err := blobs.Remove(path); err != nil {
			return err
		}
		removed++
		return nil
	})
	if err != nil {
		return removed, fmt.Errorf("prune the OCI store: %w", err)
	}
	return removed, nil
}

// keptManifests are the manifests of the store's index at path that the
// pruning keeps: those tagged, and the one pinned. The index is read as a
// stream, one entry at a time: OPA's store adds an entry (about 200 bytes)
// for each manifest it ever pulled and never removes one, so a tag moved at
// every poll makes it grow for as long as the process lives. Read whole
// within a bound, it passed 16 MiB after about 80,000 manifests (four weeks
// of a tag moved every 30 s, by anyone who may push), and the pruning
// stopped for good: the store filled the manager's /tmp (review 197B F1).
func keptManifests(path string, pinned godigest.Digest) ([]ocispec.Descriptor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := json.NewDecoder(bufio.NewReader(f))
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	var kept []ocispec.Descriptor
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, err
		}
		if key != "manifests" {
			// schemaVersion, mediaType, annotations: OPA's store writes
			// them, a line each.
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, err
			}
			continue
		}
		if err := expectDelim(dec, '['); err != nil {
			return nil, err
		}
		for dec.More() {
			var m ocispec.Descriptor
			if err := dec.Decode(&m); err != nil {
				return nil, err
			}
			if m.Annotations[ocispec.AnnotationRefName] == "" && (pinned == "" || m.Digest != pinned) {
				continue // pulled once, by digest only: a revision gone by
			}
			if kept = append(kept, m); len(kept) > maxKeptManifests {
				return nil, fmt.Errorf("more than %d tagged manifests", maxKeptManifests)
			}
		}
		if err := expectDelim(dec, ']'); err != nil {
			return nil, err
		}
	}
	return kept, expectDelim(dec, '}')
}

// expectDelim reads the next token of dec, which must be delim.
func expectDelim(dec *json.Decoder, delim json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != delim {
		return fmt.Errorf("%v where %v was expected", tok, delim)
	}
	return nil
}

// blobName is a blob's path under the layout's blobs directory, as fs.FS
// names it.
func blobName(d godigest.Digest) string { return d.Algorithm().String() + "/" + d.Encoded() }

// readBounded reads a file of at most max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is over %d bytes", path, max)
	}
	return data, nil
}
