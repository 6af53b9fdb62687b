package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// TestASignedBundleIsCheckedOffline: check-csr and decisions replay take
// the manager's --bundle-key, --bundle-key-id and --bundle-key-algorithm, so
// the signed bundle the managers would load is the one decided with, and one
// they would refuse is refused here. Before, a signed bundle could not be read
// at all ("verification key not provided").
func TestASignedBundleIsCheckedOffline(t *testing.T) {
	dir := t.TempDir()
	private, public := signingKey(t, dir, "ichor")
	_, other := signingKey(t, dir, "other")
	garbage := filepath.Join(dir, "garbage.pub")
	require.NoError(t, os.WriteFile(garbage, []byte("not a key\n"), 0o600))
	signed := filepath.Join(dir, "signed.tar.gz")
	code, stdout, stderr := run(t, "", "bundle", "build", "--signing-key", private, "--out", signed)
	require.Equal(t, cli.ExitOK, code, stderr)
	revision := strings.TrimSuffix(strings.Fields(stdout)[3], ",")
	// Signed with the managers' public key as an HMAC secret: whoever
	// reads the public key can (review 246, F3).
	forged := filepath.Join(dir, "forged.tar.gz")
	code, _, stderr = run(t, "", "bundle", "build", "--signing-key", public, "--signing-alg", "HS256", "--out", forged)
	require.Equal(t, cli.ExitOK, code, stderr)

	csr := manifest(t, csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}})), false)
	log := decisionLog(t, dir)
	commands := map[string][]string{
		"check-csr": append([]string{"policy", "check-csr", "-o", "json", "-f", csr}, identity...),
		"replay":    {"decisions", "replay", log, "-o", "json"},
	}
	for _, tc := range []struct {
		name  string
		flags []string
		code  int
		want  string
	}{
		{"the managers' key", []string{"--bundle", signed, "--bundle-key", public}, cli.ExitOK, ""},
		{"the key id and algorithm given", []string{"--bundle", signed, "--bundle-key", public, "--bundle-key-id", "ichor", "--bundle-key-algorithm", "RS256"}, cli.ExitOK, ""},
		{"no key", []string{"--bundle", signed}, cli.ExitUsage, "the bundle is signed; give the managers' public key with --bundle-key"},
		{"another key", []string{"--bundle", signed, "--bundle-key", other}, cli.ExitError, "refused"},
		{"another key id", []string{"--bundle", signed, "--bundle-key", public, "--bundle-key-id", "prod"}, cli.ExitError, "refused"},
		{"a directory", []string{"--bundle", "../../policy", "--bundle-key", public}, cli.ExitUsage, "is a directory, which cannot be signed"},
		{"a key that is not there", []string{"--bundle", signed, "--bundle-key", filepath.Join(dir, "none.pub")}, cli.ExitUsage, "--bundle-key: open"},
		{"a key file that holds no key", []string{"--bundle", signed, "--bundle-key", garbage}, cli.ExitUsage, "holds no PEM public key (RS256)"},
		{"the public key as an HMAC secret", []string{"--bundle", forged, "--bundle-key", public, "--bundle-key-algorithm", "HS256"}, cli.ExitUsage, "given with the HMAC algorithm HS256, which would make its text the shared secret"},
	} {
		for name, args := range commands {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				code, stdout, stderr := run(t, "", append(append([]string{}, args...), tc.flags...)...)
				require.Equal(t, tc.code, code, stderr)
				assert.Contains(t, stderr, tc.want)
				if tc.code != cli.ExitOK {
					return
				}
				var out struct {
					Revision  string `json:"revision"`
					Candidate struct {
						Revision string `json:"revision"`
					} `json:"candidate"`
				}
				require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
				assert.Equal(t, revision, out.Revision+out.Candidate.Revision)
			})
		}
	}

	t.Run("--bundle-key without --bundle", func(t *testing.T) {
		code, _, stderr := run(t, "", append(commands["check-csr"], "--bundle-key", public)...)
		assert.Equal(t, cli.ExitUsage, code)
		assert.Contains(t, stderr, "--bundle-key verifies --bundle")
	})
}

// decisionLog is a decision log of one decision by the embedded bundle, as
// the manager writes it, in a file.
func decisionLog(t *testing.T, dir string) string {
	t.Helper()
	var buf bytes.Buffer
	e, err := engine.New(t.Context(), engine.Options{DecisionLog: &buf, ID: "test"})
	require.NoError(t, err)
	obj := csrgen.ServingObject("csr-1", "worker-1", request(t, csrgen.Request{DNSNames: []string{"worker-1"}}))
	_, err = e.KubeletServing(t.Context(), csrinput.KubeletServing{CSR: csrinput.Build(obj)})
	require.NoError(t, err)
	e.Stop(context.Background())
	path := filepath.Join(dir, "decisions.log")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o600))
	return path
}
