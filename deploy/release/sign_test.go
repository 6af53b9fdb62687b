package release

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A release signed with the publisher's Ed25519 key carries SHA256SUMS.sig,
// which openssl checks as docs/install.md says, against the public key
// alone; a SHA256SUMS changed by one byte does not verify (review 242 F1).
func TestSHA256SUMSIsSignedAsTheDocsVerifyIt(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "release.key")
	pubFile := filepath.Join(dir, "release.pub")
	out := filepath.Join(dir, "dist")
	require.NoError(t, os.Mkdir(out, 0o700))
	if openssl, err := exec.LookPath("openssl"); err == nil {
		// The key as the docs make it.
		require.NoError(t, exec.Command(openssl, "genpkey", "-algorithm", "ed25519", "-out", keyFile).Run()) //nolint:gosec // G204: the test's own files
		require.NoError(t, exec.Command(openssl, "pkey", "-in", keyFile, "-pubout", "-out", pubFile).Run())  //nolint:gosec // G204: the test's own files
	} else {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	}
	key, err := ReadSigningKey(keyFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(out, "a"), []byte("a"), 0o600))
	require.NoError(t, WriteChecksums(out, []string{"a"}))
	require.NoError(t, SignChecksums(out, key))

	sums, err := os.ReadFile(filepath.Join(out, Checksums))
	require.NoError(t, err)
	sig, err := os.ReadFile(filepath.Join(out, ChecksumsSignature))
	require.NoError(t, err)
	pub := key.Public().(ed25519.PublicKey)
	assert.True(t, ed25519.Verify(pub, sums, sig))
	tampered := append([]byte(nil), sums...)
	tampered[0] ^= 1
	assert.False(t, ed25519.Verify(pub, tampered, sig))

	openssl, err := exec.LookPath("openssl")
	if err != nil {
		return
	}
	verify := func() error {
		//nolint:gosec // G204: the test's own files
		return exec.Command(openssl, "pkeyutl", "-verify", "-pubin", "-inkey", pubFile, "-rawin",
			"-in", filepath.Join(out, Checksums), "-sigfile", filepath.Join(out, ChecksumsSignature)).Run()
	}
	require.NoError(t, verify(), "openssl does not verify the signature as docs/install.md says")
	require.NoError(t, os.WriteFile(filepath.Join(out, Checksums), tampered, 0o600))
	assert.Error(t, verify(), "openssl verifies a SHA256SUMS changed by one byte")
}

// Only an Ed25519 key in PKCS#8 PEM signs: another kind, or another
// encoding, is refused before anything is built.
func TestReadSigningKeyRefusesAnyOtherKey(t *testing.T) {
	dir := t.TempDir()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(ec)
	require.NoError(t, err)
	for name, data := range map[string][]byte{
		"ecdsa":    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		"not pem":  []byte("key"),
		"sec1 pem": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}),
	} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		_, err := ReadSigningKey(path)
		assert.Error(t, err, name)
	}
	_, err = ReadSigningKey(filepath.Join(dir, "missing"))
	assert.Error(t, err)
}

// A signing key inside the checkout is refused before anything is read or
// built: the release refuses untracked files, and cleaning the tree deletes
// the key (review 244 F2).
func TestASigningKeyInsideTheCheckoutIsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, key := range []string{filepath.Join(dir, "release.key"), filepath.Join(dir, "keys", "release.key")} {
		err := CheckSigningKeyOutside(dir, key)
		require.Error(t, err, key)
		assert.Contains(t, err.Error(), "is inside the checkout")
	}
	for _, key := range []string{filepath.Join(t.TempDir(), "release.key"), filepath.Join(dir, "..", "release.key"), filepath.Join(dir+"-keys", "release.key")} {
		assert.NoError(t, CheckSigningKeyOutside(dir, key), key)
	}
}
