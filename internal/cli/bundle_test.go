package cli_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/open-policy-agent/opa/v1/bundle"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// signingKey writes an RSA key pair and returns the private and public paths.
func signingKey(t *testing.T, dir, name string) (private, public string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	private, public = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".pub")
	require.NoError(t, os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600))
	require.NoError(t, os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600))
	return private, public
}

func TestBundlePushWritesOPAsOCILayout(t *testing.T) {
	// The login comes from the Docker credential store: an empty one here.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	private, public := signingKey(t, dir, "ichor")
	_, strangerPublic := signingKey(t, dir, "stranger")
	signed, unsigned := filepath.Join(dir, "signed.tar.gz"), filepath.Join(dir, "unsigned.tar.gz")
	code, _, stderr := run(t, "", "bundle", "build", "--out", signed, "--signing-key", private)
	require.Equal(t, 0, code, stderr)
	code, _, stderr = run(t, "", "bundle", "build", "--out", unsigned)
	require.Equal(t, 0, code, stderr)
	ref := "oci+http://" + host + "/ichor/policy:v1"

	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"unsigned":             {[]string{unsigned, ref}, 1, "the bundle is not signed"},
		"signed by another":    {[]string{signed, ref, "--key", strangerPublic}, 1, "verification"},
		"no tag":               {[]string{signed, "oci+http://" + host + "/ichor/policy"}, 2, "names no tag or digest"},
		"not an oci reference": {[]string{signed, "https://" + host + "/ichor/policy:v1"}, 2, "is not an OCI reference"},
		"missing file":         {[]string{filepath.Join(dir, "absent.tar.gz"), ref}, 2, "no such file"},
		"one argument":         {[]string{signed}, 2, "accepts 2 arg(s)"},
		"a digest":             {[]string{signed, "oci+http://" + host + "/ichor/policy@sha256:" + strings.Repeat("ab", 32)}, 2, "give a tag, not a digest"},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := run(t, "", append([]string{"bundle", "push"}, tc.args...)...)
			assert.Equal(t, tc.code, code, stderr)
			assert.Contains(t, stderr, tc.want)
		})
	}
	// Nothing reached the registry.
	resp, err := http.Get(srv.URL + "/v2/ichor/policy/manifests/v1")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	code, stdout, stderr := run(t, "", "bundle", "push", signed, ref, "--key", public)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "pushed "+signed+" to "+ref+" (sha256:")

	req, err := http.NewRequest(http.MethodGet, srv.URL+"/v2/ichor/policy/manifests/v1", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var manifest ocispec.Manifest
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&manifest))
	require.Len(t, manifest.Layers, 1)
	assert.Equal(t, ocispec.MediaTypeImageLayerGzip, manifest.Layers[0].MediaType, "the layer OPA's downloader looks for")
	data, err := os.ReadFile(signed)
	require.NoError(t, err)
	assert.Equal(t, int64(len(data)), manifest.Layers[0].Size)
}

func TestManagerRefusesAMalformedOCIBundleReference(t *testing.T) {
	for _, ref := range []string{"oci://ghcr.io/acme/policy", "oci://ghcr.io/ACME/policy:v1"} {
		code, _, stderr := run(t, "", "manager", "--bundle", ref)
		assert.Equal(t, 2, code, stderr)
		assert.Contains(t, stderr, "--bundle: bundle source "+strconv.Quote(ref))
	}
}

// TestManagerRefusesFlagValuesItCouldNeverUse: an audit that could never
// judge, or a tenant's bound that keeps nothing, is a usage error at start.
func TestManagerRefusesFlagValuesItCouldNeverUse(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, []byte("not a CA"), 0o600))
	for _, args := range [][]string{
		{"--kubelet-port", "0"}, {"--kubelet-port", "70000"}, {"--kubelet-serving-audit-interval", "-1m"},
		{"--tenant-max-csrs", "0"}, {"--tenant-max-csr-mib", "-1"}, {"--tenant-max-csr-mib", "9223372036854775807"},
		// A ticker panics on a negative interval after the start; a
		// nanosecond reads the bundle without pause (review of 2026-12-05).
		{"--bundle-poll-interval", "-1s"}, {"--bundle-poll-interval", "1ns"}, {"--resync-interval", "-1m"}, {"--resync-interval", "0"},
		// A URL that could never be uploaded to started, and dropped every
		// entry.
		{"--decision-log-url", "decisions.example.com"}, {"--decision-log-url", "ftp://decisions.example.com"}, {"--decision-log-url", "https://"},
		// Plain http without the opt-in: anyone on the path reads and drops
		// the decision log.
		{"--decision-log-url", "http://decisions.example.com"}, {"--decision-log-url", "HTTP://decisions.example.com"},
		// A token for no service, or beside a password in the URL: which
		// credential is sent would be a guess.
		{"--decision-log-token-file", caFile}, {"--decision-log-url", "https://ichor:s3cret@decisions.example.com", "--decision-log-token-file", caFile},
		// A network the operator meant to deny, mistyped, would deny
		// nothing.
		{"--remote-kubeconfig-denied-networks", "10.0.0.0"}, {"--remote-kubeconfig-denied-networks", "127.0.0.0/8,10.1.2.3/8"},
		{"--node-denied-networks", "localhost"}, {"--node-denied-networks", "::ffff:10.0.0.0/104"},
		// A webhook that could not tell the API server's certificate
		// from another of its CA's, or that would check names on no
		// certificate at all.
		{"--webhook-client-ca", filepath.Join(t.TempDir(), "absent.crt"), "--webhook-client-names", "apiserver"},
		{"--webhook-client-ca", caFile}, {"--webhook-client-names", "apiserver"},
		// No webhook served, and ready all the same; every stop dropping
		// the upload buffer; a key that is no file (review 168).
		{"--webhook-port", "-1"}, {"--webhook-port", "0"}, {"--webhook-port", "65536"},
		{"--decision-log-flush-timeout", "0s"}, {"--decision-log-flush-timeout", "-1s"},
		// A bound taken for the default without a word, and one whose
		// bytes overflow so that every decision failed (review 202 F6).
		{"--decision-log-buffer-events", "0"}, {"--decision-log-buffer-events", "-1"},
		{"--decision-log-file-max-mib", "8796093022208"},
		{"--bundle-key", "/dev/zero"}, {"--bundle-key", t.TempDir()},
		// A pin that is no SHA-256, or of no key (review 166).
		{"--bundle-key-sha256", "abc", "--bundle-key", caFile}, {"--bundle-key-sha256", strings.Repeat("ab", 32)},
		{"--webhook-client-ca-sha256", strings.Repeat("ab", 32)},
		{"--webhook-client-ca-sha256", "abc", "--webhook-client-ca", caFile, "--webhook-client-names", "apiserver"},
	} {
		code, _, stderr := run(t, "", append([]string{"manager"}, args...)...)
		assert.Equal(t, 2, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, args[0], args)
		assert.NotContains(t, stderr, "unknown flag", args)
	}
	// A key file whose digest is not the one pinned: refused, whatever else
	// is right (review 166: the file's writers are not the key's).
	code, _, stderr := run(t, "", "manager", "--bundle-key", caFile, "--bundle-key-sha256", strings.Repeat("AB", 32))
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "not the "+strings.Repeat("ab", 32)+" --bundle-key-sha256 pins (the chart's manager.bundle.verification.sha256): refusing to start with it")
	// The file's own digest, in either case, is past that check (the start
	// then stops at what else is missing, here a kubeconfig).
	caData, err := os.ReadFile(caFile)
	require.NoError(t, err)
	sum := sha256.Sum256(caData)
	for _, pin := range []string{hex.EncodeToString(sum[:]), strings.ToUpper(hex.EncodeToString(sum[:]))} {
		_, _, stderr = run(t, "", "manager", "--bundle-key", caFile, "--bundle-key-sha256", pin, "--kubeconfig", filepath.Join(t.TempDir(), "absent"))
		assert.NotContains(t, stderr, "--bundle-key-sha256", pin)
	}
	// The networks' errors say what is wrong with the value, not only
	// which flag.
	for arg, want := range map[string]string{
		"--remote-kubeconfig-denied-networks=10.0.0.0":    `"10.0.0.0" is neither "default" nor a network in CIDR notation`,
		"--node-denied-networks=default,10.1.2.3/8":       `"10.1.2.3/8" has host bits set: write the network, 10.0.0.0/8`,
		"--node-denied-networks=::ffff:10.0.0.0/104":      `"::ffff:10.0.0.0/104" is an IPv4 network written as IPv6`,
		"--remote-kubeconfig-denied-networks=default,ten": `"ten" is neither "default" nor a network`,
		"--webhook-client-ca=" + caFile:                   "no client names: name the common name of the API server's webhook client certificate",
		"--webhook-client-names=apiserver":                "--webhook-client-names without --webhook-client-ca",
	} {
		code, _, stderr := run(t, "", "manager", arg)
		assert.Equal(t, 2, code, "%s: %s", arg, stderr)
		assert.Contains(t, stderr, want, arg)
	}
	// A password in the URL is not printed.
	code, _, stderr = run(t, "", "manager", "--decision-log-url", "ftp://ichor:s3cret@decisions.example.com")
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "ftp://ichor:xxxxx@decisions.example.com")
	assert.NotContains(t, stderr, "s3cret")
	code, _, stderr = run(t, "", "manager", "--decision-log-url", "http://ichor:s3cret@decisions.example.com")
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "--decision-log-allow-insecure-http")
	assert.NotContains(t, stderr, "s3cret")
}

// ichor bundle build writes the epoch (the policy tree's EPOCH, or
// --epoch, never guessed), and ichor bundle push refuses an epoch not above
// the tag's bundle unless --force.
func TestBundleEpochsFromBuildToPush(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := "oci+http://" + strings.TrimPrefix(srv.URL, "http://") + "/ichor/policy:stable"
	dir := t.TempDir()
	private, public := signingKey(t, dir, "ichor")
	build := func(args ...string) string {
		t.Helper()
		out := filepath.Join(dir, strconv.Itoa(len(args))+strings.Join(args, "")+".tar.gz")
		out = filepath.Join(dir, strings.NewReplacer("/", "_", "-", "_").Replace(filepath.Base(out)))
		code, stdout, stderr := run(t, "", append([]string{"bundle", "build", "--out", out, "--signing-key", private}, args...)...)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, "epoch ")
		return out
	}
	floor := strconv.FormatInt(bundles.Floor(), 10)
	embedded := build()
	data, err := bundles.DefaultLimits.ReadFile(embedded)
	require.NoError(t, err)
	b, err := bundle.NewReader(bytes.NewReader(data)).WithSkipBundleVerification(true).Read()
	require.NoError(t, err)
	epoch, err := bundles.Epoch(b.Manifest)
	require.NoError(t, err)
	assert.Equal(t, bundles.Floor(), epoch, "the embedded tree's epoch")

	// A policy tree without EPOCH: the epoch is not guessed.
	tree := filepath.Join(dir, "policy")
	require.NoError(t, os.CopyFS(tree, os.DirFS("../../policy")))
	require.NoError(t, os.Remove(filepath.Join(tree, bundles.EpochFile)))
	code, _, stderr := run(t, "", "bundle", "build", "--policy", tree, "--out", filepath.Join(dir, "x.tar.gz"))
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "give the epoch of its rules with --epoch")

	above := build("--epoch", floor+"0")
	code, _, stderr = run(t, "", "bundle", "push", above, ref, "--key", public)
	require.Equal(t, 0, code, stderr)
	code, _, stderr = run(t, "", "bundle", "push", embedded, ref, "--key", public)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "the bundle's epoch "+floor+" is not above "+floor+"0")
	code, _, stderr = run(t, "", "bundle", "push", embedded, ref, "--key", public, "--force")
	assert.Equal(t, 0, code, stderr)
}

// The signing key goes to OPA by its path, as opa build gives it: given the
// key's text, OPA takes any text that does not begin "-----BEGIN" for a path
// to stat, and its error quotes the text whole (review of 2026-12-06). An
// HMAC secret longer than a file name, or holding a NUL, was printed, and so
// was a PEM key after a blank line whose base64 made a long path part.
func TestASigningKeyIsSignedWithAndNeverPrinted(t *testing.T) {
	dir := t.TempDir()
	private, _ := signingKey(t, dir, "ichor")
	key, err := os.ReadFile(private)
	require.NoError(t, err)
	blankFirst := filepath.Join(dir, "blank-first.pem")
	require.NoError(t, os.WriteFile(blankFirst, append([]byte("\n"), key...), 0o600))
	for name, tc := range map[string]struct {
		key, alg string
	}{
		"a PEM key after a blank line": {string(key), "RS256"},
		"a long HMAC secret":           {strings.Repeat("s3cret", 60), "HS256"},
		"an HMAC secret holding a NUL": {"s3cret\x00" + strings.Repeat("k", 40), "HS256"},
	} {
		t.Run(name, func(t *testing.T) {
			path := blankFirst
			if tc.alg != "RS256" {
				path = filepath.Join(t.TempDir(), "secret")
				require.NoError(t, os.WriteFile(path, []byte(tc.key), 0o600))
			}
			code, stdout, stderr := run(t, "", "bundle", "build", "--out", filepath.Join(t.TempDir(), "b.tar.gz"), "--signing-key", path, "--signing-alg", tc.alg)
			assert.Equal(t, 0, code, stderr)
			// The PEM key's first line of base64, or the secret.
			lines := strings.Split(strings.TrimSpace(tc.key), "\n")
			assert.NotContains(t, stdout+stderr, lines[min(1, len(lines)-1)], "the key was printed")
		})
	}
}

// A PEM key from a pipe (--signing-key <(vault ...)) signs as from a file;
// an HMAC secret from a pipe is refused, saying why, without its text.
func TestASigningKeyFromAPipe(t *testing.T) {
	dir := t.TempDir()
	private, public := signingKey(t, dir, "ichor")
	key, err := os.ReadFile(private)
	require.NoError(t, err)
	feed := func(data []byte) string {
		fifo := filepath.Join(t.TempDir(), "key")
		require.NoError(t, syscall.Mkfifo(fifo, 0o600))
		go func() {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			if err == nil {
				_, _ = f.Write(data)
				_ = f.Close()
			}
		}()
		return fifo
	}
	signed := filepath.Join(dir, "signed.tar.gz")
	code, _, stderr := run(t, "", "bundle", "build", "--out", signed, "--signing-key", feed(append([]byte("\n"), key...)))
	require.Equal(t, 0, code, stderr)
	pub, err := os.ReadFile(public)
	require.NoError(t, err)
	_, err = bundles.LoadVerified(signed, bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{
		"ichor": {Key: string(pub), Algorithm: "RS256"},
	}, "ichor", "", nil))
	require.NoError(t, err, "the bundle signed from a pipe does not verify")

	// Never opened: the secret stays in the pipe.
	fifo := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	code, _, stderr = run(t, "", "bundle", "build", "--out", filepath.Join(dir, "h.tar.gz"), "--signing-alg", "HS256", "--signing-key", fifo)
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "an HMAC secret (HS256) is read from a file")
}
