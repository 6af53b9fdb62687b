package bundles

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/ichor-dev/ichor-policy/internal/smallfile"
)

// Limits bound what a bundle may cost before OPA reads it. OPA's loader keeps
// every file of a bundle in memory before it checks the signature, and bounds
// only each file (up to 1 GiB by default): 40 files of 8 MiB of zeros are a
// 321 KiB download that costs half a gigabyte per replica. A bundle is
// therefore read twice: once here, as a stream that keeps nothing, counting
// what it would cost, and only then by OPA.
type Limits struct {
	// CompressedBytes bounds the tarball as it is downloaded or read.
	CompressedBytes int64
	// UncompressedBytes bounds the tar stream once decompressed: every
	// header and every file together.
	UncompressedBytes int64
	// FileBytes bounds each file (engine.MaxBundleFileBytes).
	FileBytes int64
	// DataFileBytes bounds each file OPA parses as a document before it
	// checks the file's digest (data.json, data.yaml, .manifest,
	// .signatures.json): parsed, a file of empty objects costs about
	// forty times its size (review 28: 8 MiB of "{}," took 294 MiB of
	// heap before its digest was found wrong).
	DataFileBytes int64
	// Files bounds the number of entries of the tar stream, directories
	// included: each is an allocation in OPA's loader.
	Files int
}

// DefaultLimits are chosen from the policy's own bundle (16 files, 26 KiB
// compressed and 114 KiB decompressed in this release, its largest data file
// 15 KiB), with room to grow about a hundredfold in every direction (data
// files sixtyfold), and well below the chart's memory
// limit (512 MiB) even when OPA holds a bundle several times over while it
// verifies, parses and compiles it.
var DefaultLimits = Limits{
	CompressedBytes:   2 << 20,
	UncompressedBytes: 16 << 20,
	FileBytes:         MaxFileBytes,
	DataFileBytes:     1 << 20,
	Files:             1000,
}

// ErrBundleTooLarge is a bundle beyond its Limits.
var ErrBundleTooLarge = errors.New("bundle too large")

// OrDefault is l with DefaultLimits in its zero fields.
func (l Limits) OrDefault() Limits {
	d := DefaultLimits
	if l.CompressedBytes > 0 {
		d.CompressedBytes = l.CompressedBytes
	}
	if l.UncompressedBytes > 0 {
		d.UncompressedBytes = l.UncompressedBytes
	}
	if l.FileBytes > 0 {
		d.FileBytes = l.FileBytes
	}
	if l.DataFileBytes > 0 {
		d.DataFileBytes = l.DataFileBytes
	}
	if l.Files > 0 {
		d.Files = l.Files
	}
	return d
}

// ReadAll reads a bundle tarball of at most CompressedBytes from r and scans
// it (Scan): what it returns is safe to hand to OPA's reader. Zero fields of
// l take DefaultLimits.
func (l Limits) ReadAll(r io.Reader) ([]byte, error) {
	data, err := l.ReadCompressed(r)
	if err != nil {
		return nil, err
	}
	if err := l.Scan(bytes.NewReader(data)); err != nil {
		return nil, err
	}
	return data, nil
}

// ReadCompressed reads at most CompressedBytes from r, and refuses more.
func (l Limits) ReadCompressed(r io.Reader) ([]byte, error) {
	l = l.OrDefault()
	data, err := io.ReadAll(io.LimitReader(r, l.CompressedBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	if int64(len(data)) > l.CompressedBytes {
		return nil, fmt.Errorf("%w: more than %d bytes compressed", ErrBundleTooLarge, l.CompressedBytes)
	}
	return data, nil
}

// ReadFile is ReadAll of a regular file. Anything else is refused once
// opened, without waiting (openFile): opening a FIFO for reading waits for a
// writer, and whoever could write the source's volume could so hold the
// manager's start and its file polls for good (reviews 162, 163).
func (l Limits) ReadFile(path string) ([]byte, error) {
	f, err := smallfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w: give the bundle tarball as a file", err)
	}
	defer f.Close()
	data, err := l.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("bundle %s refused: %w", path, err)
	}
	return data, nil
}

// Scan reads a gzipped tar stream through to its end without keeping it, and
// refuses it once it exceeds a limit: more bytes decompressed than
// UncompressedBytes (a gzip that never ends stops there), more entries than
// Files (a tar of many empty files stops there), or one file beyond
// FileBytes. Its cost is a fixed buffer, whatever the stream holds.
//
// What OPA's loader allocates is each file's declared size (it makes a
// buffer of hdr.Size), not what the stream carries: a sparse entry declares
// 8 MiB in a kilobyte. So the declared sizes count against
// UncompressedBytes too, and every entry that is not a regular file or a
// directory (sparse files, links, devices, fifos, global headers) is
// refused: a bundle has no use for them.
func (l Limits) Scan(r io.Reader) error {
	l = l.OrDefault()
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("bundle is not a gzipped tarball: %w", err)
	}
	defer gz.Close()
	counted := &countingReader{r: gz, limit: l.UncompressedBytes}
	tr := tar.NewReader(counted)
	var declared int64
	for files := 0; ; files++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if counted.over() {
			return l.uncompressedErr()
		}
		if err != nil {
			return fmt.Errorf("bundle is not a gzipped tarball: %w", err)
		}
		if files >= l.Files {
			return fmt.Errorf("%w: more than %d files", ErrBundleTooLarge, l.Files)
		}
		if len(hdr.Name) > MaxEntryName {
			// Quoted whole in every refusal and log line, once a poll, a
			// name of archive/tar's megabyte made a bundle of a kilobyte
			// megabytes of log (review 162).
			return fmt.Errorf("%w: an entry's name is %d bytes, more than %d (it begins %+.64q)", ErrBundleEntry, len(hdr.Name), MaxEntryName, hdr.Name)
		}
		if err := entryKind(hdr); err != nil {
			return err
		}
		if hdr.Size > l.FileBytes {
			return fmt.Errorf("%w: file %q is %d bytes, more than the size limit of %d bytes per file", ErrBundleTooLarge, hdr.Name, hdr.Size, l.FileBytes)
		}
		if dataFile(hdr.Name) && hdr.Size > l.DataFileBytes {
			return fmt.Errorf("%w: data file %q is %d bytes, more than the size limit of %d bytes per data file", ErrBundleTooLarge, hdr.Name, hdr.Size, l.DataFileBytes)
		}
		// hdr.Size <= FileBytes and the count is bounded: no overflow.
		if declared += hdr.Size; declared > l.UncompressedBytes {
			return fmt.Errorf("%w: its files declare more than %d bytes", ErrBundleTooLarge, l.UncompressedBytes)
		}
		if jsonDocument(hdr.Name) {
			// At most DataFileBytes, checked above.
			data, err := io.ReadAll(tr)
			if err != nil {
				if counted.over() {
					return l.uncompressedErr()
				}
				return fmt.Errorf("bundle is not a gzipped tarball: %w", err)
			}
			if err := checkJSONDocument(hdr.Name, data); err != nil {
				return err
			}
			continue
		}
		if yamlDocument(hdr.Name) {
			return fmt.Errorf("%w: %q is YAML, which OPA reads before it checks the file's signature (an alias bomb grows without bound there); give the data as data.json", ErrBundleEntry, hdr.Name)
		}
		//nolint:gosec // G110: the reads are counted and stop at UncompressedBytes (countingReader).
		if _, err := io.Copy(io.Discard, tr); err != nil {
			if counted.over() {
				return l.uncompressedErr()
			}
			return fmt.Errorf("bundle is not a gzipped tarball: %w", err)
		}
	}
}

// jsonDocument says whether OPA's bundle reader parses the file as a JSON
// document, the manifest included (dataFile but the YAML data files and the
// protobuf manifest).
func jsonDocument(name string) bool {
	return dataFile(name) && !yamlDocument(name) && !strings.HasSuffix(name, ".manifest.pb")
}

// yamlDocument says whether OPA's bundle reader parses the file as YAML.
func yamlDocument(name string) bool {
	base := path.Base(name)
	return base == "data.yaml" || base == "data.yml"
}

// checkJSONDocument refuses a document OPA would not read as the one JSON
// value it is. OPA reads a signed structured file (the manifest, a
// data.json) through util.Unmarshal to check its digest, before the digest
// is compared, and that falls back to YAML for what is not valid JSON: a
// megabyte of YAML aliases expands to gigabytes there, whoever signed it
// (review of 2026-12-06). And a key given twice in one object is hashed as
// its last value but decoded into the manifest's metadata as both merged,
// so keys the signature does not cover would reach the epoch guard.
func checkJSONDocument(name string, data []byte) error {
	if !json.Valid(data) {
		return fmt.Errorf("%w: %q is not one JSON document (OPA would read it as YAML before checking its signature)", ErrBundleEntry, name)
	}
	type frame struct {
		object, wantKey bool
		keys            map[string]struct{}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %q: %w", ErrBundleEntry, name, err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if delim, ok := tok.(json.Delim); ok && (delim == '}' || delim == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if top != nil && top.object {
			if top.wantKey {
				key, _ := tok.(string)
				if _, twice := top.keys[key]; twice {
					return fmt.Errorf("%w: %q has the key %+.64q twice in one object: its signature covers only the last", ErrBundleEntry, name, key)
				}
				if top.keys == nil {
					top.keys = map[string]struct{}{}
				}
				top.keys[key] = struct{}{}
				top.wantKey = false
				continue
			}
			top.wantKey = true
		}
		if delim, ok := tok.(json.Delim); ok {
			stack = append(stack, &frame{object: delim == '{', wantKey: true})
		}
	}
}

// dataFile says whether OPA's bundle reader parses the file as a document
// (bundle.Reader: data files, the manifest, the signatures, a delta's patch).
func dataFile(name string) bool {
	switch path.Base(name) {
	case "data.json", "data.yaml", "data.yml", ".signatures.json", "patch.json":
		return true
	}
	// OPA takes any file whose name ends so for a manifest (review 30 L3).
	return strings.HasSuffix(name, ".manifest") || strings.HasSuffix(name, ".manifest.pb")
}

// MaxEntryName is the longest name of a bundle's entry taken: a path in a
// policy tree, with room to spare.
const MaxEntryName = 1024

// ErrBundleEntry is a tar entry a bundle has no use for.
var ErrBundleEntry = errors.New("bundle entry refused")

// entryKind refuses every entry but a regular file or a directory. A sparse
// file is a regular file to archive/tar once read (PAX 0.1/1.0 keep type
// '0'), recognised by its GNU.sparse.* records.
func entryKind(hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeDir {
		return fmt.Errorf("%w: %q is of tar type %q; only regular files and directories are allowed", ErrBundleEntry, hdr.Name, hdr.Typeflag)
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("%w: %q is a sparse file", ErrBundleEntry, hdr.Name)
		}
	}
	return nil
}

func (l Limits) uncompressedErr() error {
	return fmt.Errorf("%w: more than %d bytes once decompressed", ErrBundleTooLarge, l.UncompressedBytes)
}

// countingReader reads up to limit bytes, then fails.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
}

var errOverLimit = errors.New("over the limit")

func (c *countingReader) Read(p []byte) (int, error) {
	if c.n >= c.limit {
		c.n = c.limit + 1
		return 0, errOverLimit
	}
	if rest := c.limit - c.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) over() bool { return c.n > c.limit }
