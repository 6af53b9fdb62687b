package release

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ChecksumsSignature is the name of the signature of SHA256SUMS: the raw
// 64-byte Ed25519 signature of the file's bytes, which
// `openssl pkeyutl -verify -rawin` checks against the publisher's key.
//
// SHA256SUMS alone proves nothing of where the files came from: whoever can
// replace a file on the release page can replace it too, and the chart it
// lists pins their image (review 242 F1). Signed with a key whose public half
// the reader has from elsewhere (the publisher's site, a previous release,
// the repository at a tag they trust), it does.
const ChecksumsSignature = Checksums + ".sig"

// ReadSigningKey reads an Ed25519 private key in PKCS#8 PEM (`openssl genpkey
// -algorithm ed25519`). Any other key is refused: one algorithm, one
// verification command in the docs.
func ReadSigningKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: the releaser's own key file
	if err != nil {
		return nil, fmt.Errorf("the signing key: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("the signing key %s is not a PKCS#8 PEM PRIVATE KEY (openssl genpkey -algorithm ed25519)", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the signing key %s: %w", path, err)
	}
	ed, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("the signing key %s is a %T, not an Ed25519 key", path, key)
	}
	return ed, nil
}

// CheckSigningKeyOutside refuses a signing key inside the checkout at dir:
// the release refuses a tree with untracked files, and the way its message
// gives to clean one (git clean -xdf) deletes the key with them (review
// 244 F2).
func CheckSigningKeyOutside(dir, key string) error {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	absKey, err := filepath.Abs(key)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(absDir, absKey); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("the signing key %s is inside the checkout %s: keep it outside (the release refuses untracked files, and cleaning the tree would delete it)", key, absDir)
	}
	return nil
}

// SignChecksums writes ChecksumsSignature beside SHA256SUMS in dir, and
// checks it.
func SignChecksums(dir string, key ed25519.PrivateKey) error {
	sums, err := os.ReadFile(filepath.Join(dir, Checksums)) //nolint:gosec // G304: the release's own output
	if err != nil {
		return fmt.Errorf("reading %s to sign it: %w", Checksums, err)
	}
	sig := ed25519.Sign(key, sums)
	if !ed25519.Verify(key.Public().(ed25519.PublicKey), sums, sig) {
		return errors.New("the signature of SHA256SUMS does not verify with the key's own public half")
	}
	//nolint:gosec // G306: public
	if err := os.WriteFile(filepath.Join(dir, ChecksumsSignature), sig, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", ChecksumsSignature, err)
	}
	return nil
}
