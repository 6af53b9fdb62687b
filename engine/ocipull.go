package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strings"

	godigest "github.com/opencontainers/go-digest"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// What OPA's OCI downloader (v1.22.4, download/oci_download.go) does with a
// tag: it resolves it with a HEAD of /manifests/<tag>, whose Content-Type
// becomes the root's media type, then copies the whole graph under that
// root (oras.Copy with the default options) into a local store on disk
// (a temporary directory, removed only when the engine stops) before it
// looks for the bundle layer: every layer, the config, the subject, and
// every child of an index, each followed by its media type. Each response
// is bounded by the limits; their number is bounded here, before a blob is
// fetched, by refusing any root that is not a single image manifest, and
// any image manifest that points to more than a bundle needs or to another
// manifest; and a pull's answers and bytes are bounded whatever the graph
// (limitsTransport).

// maxManifestLayers is the most layers a bundle's manifest may have. OPA's
// bundle is one layer (and a config); a few more leave room for a tool that
// adds, say, a signature or an SBOM layer.
const maxManifestLayers = 4

// manifestSlack is what a manifest's config and extra layers may add to
// the bundle's CompressedBytes.
const manifestSlack = 64 << 10

// ErrBundleManifest is a registry manifest that is not a bundle's.
var ErrBundleManifest = errors.New("bundle manifest refused")

// bundleManifestTypes are the media types of the root of a bundle's tag:
// an image manifest. Anything else (an image index, a Docker manifest
// list, an artifact manifest, none) is refused.
var bundleManifestTypes = map[string]bool{
	"application/vnd.oci.image.manifest.v1+json":           true,
	"application/vnd.docker.distribution.manifest.v2+json": true,
}

// isManifestRequest is a request of the registry API for a manifest: the
// first request of its chain, so that a registry that redirects a manifest
// to a path of its choice (a CDN's) does not take it past the checks.
func isManifestRequest(req *http.Request) bool {
	_, ok := manifestReference(firstRequest(req).URL.Path)
	return ok
}

// manifestReference is the reference a registry API path asks a manifest
// by (/v2/<name>/manifests/<reference>), and whether it asks one: the
// segment before the last is "manifests", whatever the repository's name
// holds. A repository named team/manifests/policy had its blobs taken for
// manifests, and was refused for good (review 197B F2).
func manifestReference(p string) (string, bool) {
	dir, ref := path.Split(p)
	if ref == "" || path.Base(dir) != "manifests" {
		return "", false
	}
	return ref, true
}

// firstRequest is the first request of req's redirect chain: the one OPA
// made, to the path it chose.
func firstRequest(req *http.Request) *http.Request {
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	return req
}

// pinnedManifest is the digest the first request of req's chain names, when
// the source is pinned to one (oci://host/repo@sha256:...); "" for a tag. A
// redirect's path is the registry's choice, not the source's (review 181).
func pinnedManifest(req *http.Request) godigest.Digest {
	ref, ok := manifestReference(firstRequest(req).URL.Path)
	if !ok {
		return ""
	}
	d, err := godigest.Parse(ref)
	if err != nil {
		return ""
	}
	return d
}

// checkPinnedDigest refuses an answer to a pinned manifest request that says
// it is another manifest: OPA takes the manifest to pull from the answer's
// Docker-Content-Digest and never compares it with the digest asked for, so
// a registry, or anyone on the path of a plain-http one, could have a source
// pinned to one bundle activate another signed bundle (review 181).
func checkPinnedDigest(req *http.Request, resp *http.Response) error {
	pinned := pinnedManifest(req)
	if pinned == "" {
		return nil
	}
	if got := resp.Header.Get("Docker-Content-Digest"); got != "" && got != pinned.String() {
		return fmt.Errorf("%w: the source is pinned to manifest %s, and the registry answered manifest %.80q", ErrBundleManifest, pinned, got)
	}
	return nil
}

// A pull's whole budget, whatever its graph: the manifest and a bundle's
// blobs, and a registry's token answers. checkManifest bounds what a
// manifest names; this bounds what is fetched, should a registry serve more
// than it names (oras follows what it is given).
const (
	// maxPullResponses is the most successful GETs of one pull: the
	// manifest, its layers and config, and a few token answers.
	maxPullResponses = 2 + maxManifestLayers + 4
)

// pullBudget is the most bytes of one pull: the manifest (each response is
// bounded by CompressedBytes) and its blobs' declared budget.
func pullBudget(limits bundles.Limits) int64 {
	return 2*limits.CompressedBytes + 2*manifestSlack
}

// checkManifestType refuses a manifest response whose media type is not a
// bundle's, and hands on the one it takes as a bundle's is written. OPA's
// downloader decides what to follow from the type the HEAD of the tag
// returns, so this is what stops an index before its children; and it
// matches that type exactly to fetch the root from /manifests/, where the
// root is checked as a manifest: a type with a parameter or other capitals,
// which the check reads as a bundle's, had the root fetched from /blobs/,
// unchecked (review 235 F1).
func checkManifestType(resp *http.Response) error {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || !bundleManifestTypes[mt] {
		return fmt.Errorf("%w: media type %q; a bundle's tag is one image manifest (not an index, a manifest list or an artifact manifest)", ErrBundleManifest, resp.Header.Get("Content-Type"))
	}
	resp.Header.Set("Content-Type", mt)
	return nil
}

type manifestDescriptor struct {
	MediaType string `json:"mediaType"`
	Size      int64  `json:"size"`
}

// layerCount is how many layers the manifest's longest layers list holds
// (its key in any case, as encoding/json matches it), counted without
// decoding them; 0 when data is not an object or no layers key holds a
// list, which json.Unmarshal then reports. Decoded into descriptors, a
// manifest of 2 MiB of empty layers took 100 MiB before its count was
// looked at (review 178 F8).
func layerCount(data []byte) int {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0
	}
	count := 0
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return 0
		}
		// Each key of the name counts, not only the last that encoding/json
		// keeps: it decodes every one, so a long first list followed by a
		// short one was decoded whole and then passed (review 223 F1).
		if key, _ := t.(string); strings.EqualFold(key, "layers") {
			count = max(count, listLength(value))
		}
	}
	return count
}

// listLength is how many elements the JSON value holds when it is a list,
// 0 otherwise: its commas outside strings and nested values, read without
// an allocation. value is valid JSON (json.Decoder checked it).
func listLength(value json.RawMessage) int {
	v := bytes.TrimSpace(value)
	if len(v) < 2 || v[0] != '[' {
		return 0
	}
	inner := v[1 : len(v)-1]
	if len(bytes.TrimSpace(inner)) == 0 {
		return 0
	}
	n, depth, inString, escaped := 1, 0, false, false
	for _, c := range inner {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
		case c == ',' && depth == 0:
			n++
		}
	}
	return n
}

// graphMediaTypes are the media types through which oras (v2.7.0,
// content.Successors) follows a node to its children: whatever the node, a
// layer or a config as much as the root. A layer or a config of one of these
// types would have OPA's downloader fetch another manifest's graph (an
// artifact manifest's from /blobs/, where no manifest check sees it), so a
// bundle's manifest may not name one.
var graphMediaTypes = map[string]bool{
	"application/vnd.oci.image.manifest.v1+json":                true,
	"application/vnd.oci.image.index.v1+json":                   true,
	"application/vnd.oci.artifact.manifest.v1+json":             true,
	"application/vnd.docker.distribution.manifest.v2+json":      true,
	"application/vnd.docker.distribution.manifest.list.v2+json": true,
}

// manifestGraph is every field through which oras follows a manifest to
// other content (content.Successors): an image manifest's config, layers
// and subject, an index's manifests, an artifact manifest's blobs.
type manifestGraph struct {
	Config    *manifestDescriptor  `json:"config"`
	Layers    []manifestDescriptor `json:"layers"`
	Subject   json.RawMessage      `json:"subject"`
	Manifests json.RawMessage      `json:"manifests"`
	Blobs     json.RawMessage      `json:"blobs"`
}

// maxManifestBytes bounds a manifest's body. A bundle's manifest (a config
// and at most maxManifestLayers layers) is well under a kilobyte with a few
// annotations; the compressed bound, 2 MiB, let a registry send one whose
// decoding in oras and OPA's downloader, into descriptors and annotation
// maps, took ten to fifty times that (review 223 F2).
const maxManifestBytes = 64 << 10

// readManifest reads a manifest's body, refused past maxManifestBytes.
func readManifest(body io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(body, maxManifestBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read manifest: %w", err)
	case len(data) > maxManifestBytes:
		return nil, fmt.Errorf("%w: larger than %d bytes; a bundle's manifest is a few hundred", ErrBundleManifest, maxManifestBytes)
	}
	return data, nil
}

// checkManifest refuses a manifest body that would have OPA's downloader
// fetch more than a bundle: another manifest (an index's children, a
// subject, whose own graph would follow), more than maxManifestLayers
// layers, or blobs whose declared sizes add up to more than the bundle's
// CompressedBytes and manifestSlack. oras verifies each blob against its
// declared size, so the declared sizes bound what is stored.
func checkManifest(data []byte, limits bundles.Limits) error {
	if n := layerCount(data); n > maxManifestLayers {
		return fmt.Errorf("%w: %d layers, more than the %d a bundle may have", ErrBundleManifest, n, maxManifestLayers)
	}
	var m manifestGraph
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("%w: not a manifest: %w", ErrBundleManifest, err)
	}
	if len(m.Manifests) > 0 || len(m.Blobs) > 0 || len(m.Subject) > 0 && string(m.Subject) != "null" {
		return fmt.Errorf("%w: it points to other manifests or blobs (an index, a subject or an artifact manifest); a bundle's tag is one image manifest", ErrBundleManifest)
	}
	if len(m.Layers) > maxManifestLayers {
		return fmt.Errorf("%w: %d layers, more than the %d a bundle may have", ErrBundleManifest, len(m.Layers), maxManifestLayers)
	}
	blobs := m.Layers
	if m.Config != nil {
		blobs = append(blobs, *m.Config)
	}
	var total int64
	budget := limits.CompressedBytes + manifestSlack
	for _, b := range blobs {
		if graphMediaTypes[b.MediaType] {
			return fmt.Errorf("%w: a layer or config of media type %s, a manifest whose own graph would be fetched; a bundle's layers are blobs", ErrBundleManifest, b.MediaType)
		}
		if b.Size < 0 {
			return fmt.Errorf("%w: a blob of negative size %d", ErrBundleManifest, b.Size)
		}
		// Each size is checked against the budget before it is added: no
		// overflow.
		if b.Size > budget || total+b.Size > budget {
			return fmt.Errorf("%w: its blobs declare more than %d bytes", bundles.ErrBundleTooLarge, budget)
		}
		total += b.Size
	}
	return nil
}
