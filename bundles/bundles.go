// Package bundles builds, reads and writes OPA bundles of the policy tree, and
// holds the default bundle the binary serves when it is given none.
package bundles

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/ichor-dev/ichor-policy/policy"
)

// Roots are the data paths the bundle owns: the decision rules, the
// decision-log mask and the applied-verdict record. Declaring them lets OPA refuse a bundle that writes
// anywhere else.
var Roots = []string{"ichor", "system/log", "system/applied"}

// Default builds the bundle of the policy tree embedded in the binary.
func Default() (*bundle.Bundle, error) {
	b, err := FromFS(policy.FS)
	if err != nil {
		return nil, fmt.Errorf("build the embedded default bundle: %w", err)
	}
	return b, nil
}

// FromDir builds a bundle from a policy directory laid out like policy/.
func FromDir(dir string) (*bundle.Bundle, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("policy directory: %w", err)
	}
	return FromFS(os.DirFS(dir))
}

// FromFS builds a bundle from a policy tree: every .rego file but the tests,
// and every data.json. Its revision is a digest of its content, so the same
// rules always carry the same revision and any change carries a new one.
func FromFS(fsys fs.FS) (*bundle.Bundle, error) {
	loader, err := bundle.NewFSLoader(fsys)
	if err != nil {
		return nil, fmt.Errorf("read policy tree: %w", err)
	}
	loader = loader.WithFilter(func(path string, info fs.FileInfo, _ int) bool {
		return !info.IsDir() && (strings.HasSuffix(info.Name(), "_test.rego") || path == EpochFile)
	})
	b, err := bundle.NewCustomReader(loader).WithProcessAnnotations(true).Read()
	if err != nil {
		return nil, fmt.Errorf("read policy tree: %w", err)
	}
	if len(b.Modules) == 0 {
		return nil, fmt.Errorf("policy tree holds no Rego module")
	}
	b.Manifest.Roots = &Roots
	b.Manifest.Revision = Digest(&b)
	// A tree without EPOCH builds a bundle without an epoch, which `ichor
	// bundle build` refuses unless told one (--epoch).
	epoch, ok, err := readEpochFile(fsys)
	if err != nil {
		return nil, err
	}
	if ok {
		SetEpoch(&b, epoch)
	}
	return &b, nil
}

// Digest is a content digest of a bundle's modules and data, used as the
// revision of bundles built here.
func Digest(b *bundle.Bundle) string {
	h := sha256.New()
	mods := slices.Clone(b.Modules)
	slices.SortFunc(mods, func(a, b bundle.ModuleFile) int { return strings.Compare(a.Path, b.Path) })
	for _, m := range mods {
		// Paths are made relative to the tree so the digest does not depend
		// on where the tree was read from.
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(strings.TrimPrefix(m.Path, "/")), len(m.Raw))
		h.Write(m.Raw)
	}
	h.Write(util.MustMarshalJSON(b.Data))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:16]
}

// Write writes a bundle as the gzipped tarball OPA loads.
func Write(w io.Writer, b *bundle.Bundle) error {
	if err := bundle.NewWriter(w).Write(*b); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}

// Bytes returns a bundle as a gzipped tarball.
func Bytes(b *bundle.Bundle) ([]byte, error) {
	var buf bytes.Buffer
	if err := Write(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Sign signs a bundle with OPA's bundle signing (a .signatures.json JWT over
// every file's digest), as `opa build --signing-key` does. key is a PEM key,
// or the path of the file that holds the key or the secret, as that flag
// takes: OPA takes any other text for a path too, and its error then quotes
// the text whole, the key with it (review of 2026-12-06). Give a file's key
// by its path.
func Sign(b *bundle.Bundle, key, algorithm, keyID string) error {
	if err := b.GenerateSignature(bundle.NewSigningConfig(key, algorithm, ""), keyID, false); err != nil {
		return fmt.Errorf("sign bundle: %w", err)
	}
	return nil
}

// LoadVerified reads a bundle tarball within DefaultLimits and, with a
// verification configuration, refuses it unless it is signed by one of its
// keys and every file matches the signature.
func LoadVerified(path string, vc *bundle.VerificationConfig) (*bundle.Bundle, error) {
	data, err := DefaultLimits.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b, err := ReadVerified(data, vc)
	if err != nil {
		return nil, fmt.Errorf("bundle %s refused: %w", path, err)
	}
	if b.Manifest.Revision == "" {
		// As FromDir names a directory's: the engine refuses a bundle
		// without a revision (it names the policy in every decision), and
		// a tarball opa build made has none unless asked.
		b.Manifest.Revision = Digest(b)
	}
	return b, nil
}

// ReadVerified reads a bundle tarball that has passed Limits.ReadAll and,
// with a verification configuration, refuses it unless it is signed by one
// of its keys and every file matches the signature.
func ReadVerified(data []byte, vc *bundle.VerificationConfig) (*bundle.Bundle, error) {
	r := bundle.NewReader(bytes.NewReader(data)).WithProcessAnnotations(true).WithSizeLimitBytes(MaxFileBytes)
	if vc != nil {
		r = r.WithBundleVerificationConfig(vc)
	}
	b, err := r.Read()
	if err != nil {
		return nil, err
	}
	if len(b.Modules) == 0 {
		return nil, errors.New("the bundle holds no Rego module")
	}
	return &b, nil
}

// Load reads a bundle from a path: a policy directory laid out like policy/,
// or a bundle tarball (.tar.gz) as `ichor bundle build` or `opa build` writes.
func Load(path string) (*bundle.Bundle, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if info.IsDir() {
		return FromDir(path)
	}
	return LoadVerified(path, nil)
}
