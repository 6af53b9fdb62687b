package cli

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/privatefile"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

func newBundleCommand(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Build OPA bundles of the policy",
	}
	var policyDir, out, signingKey, signingAlg, keyID string
	var epoch int64
	build := &cobra.Command{
		Use:   "build [--out FILE] [--policy DIR] [--epoch N]",
		Short: "Build the policy bundle, with a revision that is a digest of its content and the epoch of its rules",
		Long: `Build the policy bundle. Its revision is a digest of its content; its epoch,
written in the signed .manifest, is the policy tree's EPOCH file (the embedded
tree's without --policy), or --epoch. A manager with --bundle-key refuses a
signed bundle whose epoch is below the floor of its binary or below the
highest epoch activated in its cluster; raise EPOCH with each change that
closes a hole. A tree without EPOCH needs --epoch: the epoch is not guessed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := retired(cmd, "--out FILE"); err != nil {
				return err
			}
			b, err := policyFrom(policyDir)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("epoch") {
				if epoch < 0 {
					return usage.Errorf("--epoch %d: give a non-negative integer", epoch)
				}
				bundles.SetEpoch(b, epoch)
			} else if _, err := bundles.Epoch(b.Manifest); err != nil {
				return usage.Errorf("the policy tree %s has no %s file: give the epoch of its rules with --epoch", policyDir, bundles.EpochFile)
			}
			if signingKey != "" {
				key, err := signingKeyOf(signingKey, signingAlg)
				if err != nil {
					return err
				}
				if err := bundles.Sign(b, key, signingAlg, keyID); err != nil {
					return err
				}
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o750); err != nil {
				return fmt.Errorf("output directory: %w", err)
			}
			// Replaced whole: a link or a FIFO at out is replaced, never
			// written through (review of 2026-12-06).
			data, err := bundles.Bytes(b)
			if err != nil {
				return err
			}
			if err := privatefile.WriteMode(out, data, 0o644); err != nil {
				return err
			}
			got, _ := bundles.Epoch(b.Manifest)
			fmt.Fprintf(s.out, "wrote %s (revision %s, epoch %d)\n", out, b.Manifest.Revision, got)
			return nil
		},
	}
	build.Flags().StringVar(&policyDir, "policy", "", "the policy directory to build (default: the policy embedded in this binary)")
	build.Flags().StringVar(&out, "out", "bundle.tar.gz", "the bundle file to write")
	addRetiredOutput(build.Flags())
	build.Flags().StringVar(&signingKey, "signing-key", "", "sign the bundle with this private key (PEM), OPA's bundle signing")
	build.Flags().StringVar(&signingAlg, "signing-alg", "RS256", "the signing algorithm (RS256, ES256, PS256, ...)")
	build.Flags().StringVar(&keyID, "key-id", "ichor", "the key id written in the signature, which the manager's --bundle-key-id matches")
	build.Flags().Int64Var(&epoch, "epoch", 0, "the epoch of the rules, written in the signed manifest (default: the policy tree's EPOCH file)")
	cmd.AddCommand(build, newBundlePushCommand(s))
	return cmd
}

// policyFrom is the policy of a directory (--policy), or the one embedded in
// this binary when none is named.
func policyFrom(dir string) (*bundle.Bundle, error) {
	if dir == "" {
		return bundles.Default()
	}
	return bundles.FromDir(dir)
}

// bundleKeyFlags are the manager's flags that verify a signed bundle, for the
// commands that decide offline with one: the same key, key id and algorithm
// check here what the manager would accept.
type bundleKeyFlags struct {
	key, keyID, algorithm string
}

func (k *bundleKeyFlags) register(f *pflag.FlagSet) {
	f.StringVar(&k.key, "bundle-key", "", "verify the signed bundle tarball --bundle with this public key (PEM), as the manager's --bundle-key")
	f.StringVar(&k.keyID, "bundle-key-id", "ichor", "the key id of --bundle-key (as \"ichor bundle build --key-id\" writes it)")
	f.StringVar(&k.algorithm, "bundle-key-algorithm", "RS256", "the signing algorithm of --bundle-key")
}

// errUnverifiable is OPA's error for a signed bundle read without a key.
const errUnverifiable = "verification key not provided"

// load reads the bundle at path the caller named, verified with the key
// when one is given. One that is not there is the caller's to fix (exit 2),
// one that is there but broken or wrongly signed is not (exit 1).
// A signed bundle read without a key is refused, as the manager refuses it,
// with the flag that reads it.
func (k bundleKeyFlags) load(path string) (*bundle.Bundle, error) {
	if k.key == "" {
		b, err := bundles.Load(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, usage.Wrap(err)
		case err != nil && strings.Contains(err.Error(), errUnverifiable):
			return nil, usage.Errorf("%w: the bundle is signed; give the managers' public key with --bundle-key (and --bundle-key-id, --bundle-key-algorithm as theirs)", err)
		}
		return b, err
	}
	if path == "" {
		return nil, usage.Errorf("--bundle-key verifies --bundle: give the signed bundle tarball")
	}
	info, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, usage.Errorf("bundle: %w", err)
	case info.IsDir():
		return nil, usage.Errorf("--bundle %s is a directory, which cannot be signed; give a signed tarball with --bundle-key", path)
	}
	key, err := k.read()
	if err != nil {
		return nil, err
	}
	vc := bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{
		k.keyID: {Key: string(key), Algorithm: k.algorithm},
	}, k.keyID, "", nil)
	return bundles.LoadVerified(path, vc)
}

// read reads --bundle-key. A file that is not there, or that holds no PEM
// block where the algorithm takes a public key (all but HS*, whose key is a
// shared secret), is the caller's to fix (exit 2), as the manager's flag.
func (k bundleKeyFlags) read() ([]byte, error) {
	key, err := os.ReadFile(k.key)
	if err != nil {
		return nil, usage.Errorf("--bundle-key: %w", err)
	}
	if block, _ := pem.Decode(key); block == nil && !strings.HasPrefix(strings.ToUpper(k.algorithm), "HS") {
		return nil, usage.Errorf("--bundle-key %s holds no PEM public key (%s)", k.key, k.algorithm)
	}
	if err := engine.CheckVerificationKey(engine.VerificationKey{ID: k.keyID, PEM: string(key), Algorithm: k.algorithm}); err != nil {
		return nil, usage.Errorf("--bundle-key %s: %w", k.key, err)
	}
	return key, nil
}

// engineBundle loads the bundle at path (none: the embedded one) into the
// engine's options. A signed bundle is the engine's Source with the key, so
// that the engine verifies it as the manager's does; b is what was read, for
// the caller's own checks.
func (k bundleKeyFlags) engineBundle(opts *engine.Options, path string) (b *bundle.Bundle, err error) {
	if path == "" && k.key == "" {
		return nil, nil
	}
	if b, err = k.load(path); err != nil {
		return nil, err
	}
	if k.key == "" {
		opts.Bundle = b
		return b, nil
	}
	key, err := k.read()
	if err != nil {
		return nil, err
	}
	opts.Source = path
	opts.VerificationKeys = []engine.VerificationKey{{ID: k.keyID, PEM: string(key), Algorithm: k.algorithm}}
	return b, nil
}

func newBundlePushCommand(s streams) *cobra.Command {
	var keyPath, keyAlg, keyID string
	var force, belowFloor bool
	push := &cobra.Command{
		Use:   "push FILE oci://REGISTRY/REPOSITORY:TAG",
		Short: "Push a signed bundle to an OCI registry, where the manager's --bundle oci://... pulls it",
		Long: `Push a bundle tarball (ichor bundle build --signing-key) to an OCI registry in
OPA's layout: one application/vnd.oci.image.layer.v1.tar+gzip layer. The
registry login is read from the Docker credential store (docker login, oras
login). An unsigned bundle is refused: the manager refuses unsigned bundles
from a registry. With --key, the signature is verified with the managers' key
before anything is pushed. A bundle whose epoch is not above the epoch of the
bundle the tag holds now is refused (managers that have seen the tag's bundle
would refuse it), unless --force. So is what every manager refuses at
activation: a revision with a parenthesis or a control character (build with
ichor bundle build), METADATA labels, and, unless --below-floor (for managers
of an older release), an epoch below this release's floor. oci+http:// speaks
plain HTTP to the registry.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := bundles.ParseOCIRef(args[1])
			if err != nil {
				return usage.Wrap(err)
			}
			tarball, err := os.ReadFile(args[0])
			if err != nil {
				return usage.Errorf("bundle: %w", err)
			}
			opts := bundles.PushOptions{Force: force, BelowFloor: belowFloor}
			if keyPath != "" {
				key, err := os.ReadFile(keyPath)
				if err != nil {
					return usage.Errorf("--key: %w", err)
				}
				if err := engine.CheckVerificationKey(engine.VerificationKey{ID: keyID, PEM: string(key), Algorithm: keyAlg}); err != nil {
					return usage.Errorf("--key %s: %w", keyPath, err)
				}
				opts.Verification = bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{
					keyID: {Key: string(key), Algorithm: keyAlg},
				}, keyID, "", nil)
			}
			desc, err := bundles.PushOCI(cmd.Context(), ref, tarball, opts)
			if errors.Is(err, bundles.ErrPushDigest) || errors.Is(err, bundles.ErrPlainHTTPCredential) {
				return usage.Errorf("%s: %w", ref, err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(s.out, "pushed %s to %s (%s)\n", args[0], ref, desc.Digest)
			return nil
		},
	}
	push.Flags().StringVar(&keyPath, "key", "", "verify the signature with this public key (PEM), the manager's --bundle-key, before pushing")
	push.Flags().StringVar(&keyID, "key-id", "ichor", "the key id of --key, as the manager's --bundle-key-id")
	push.Flags().StringVar(&keyAlg, "key-algorithm", "RS256", "the signing algorithm of --key")
	push.Flags().BoolVar(&force, "force", false, "push even when the bundle's epoch is not above the epoch of the bundle the tag holds now")
	push.Flags().BoolVar(&belowFloor, "below-floor", false, "push even when the bundle's epoch is below this release's floor, for managers of an older release (which those of this release refuse)")
	return push
}

// maxSigningKey bounds a signing key read from a pipe: an RSA key of 16,384
// bits is about 12 KiB of PEM.
const maxSigningKey = 64 << 10

// signingKeyOf is what bundles.Sign is given of --signing-key: a file's
// path, as opa build takes it, so that the key's text is never in an error;
// the PEM key itself when the key comes from a pipe (<(vault ...)), whose
// path OPA would read again, from its "-----BEGIN" on (OPA takes any other
// text for a path, and quotes it whole). An HMAC secret has no such
// beginning: it is read from a file only.
func signingKeyOf(path, algorithm string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", usage.Errorf("--signing-key: %w", err)
	}
	if info.Mode().IsRegular() {
		return path, nil
	}
	if info.IsDir() {
		return "", usage.Errorf("--signing-key: %s is a directory", path)
	}
	if strings.HasPrefix(algorithm, "HS") {
		return "", usage.Errorf("--signing-key: an HMAC secret (%s) is read from a file, not from %s", algorithm, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", usage.Errorf("--signing-key: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSigningKey+1))
	if err != nil {
		return "", usage.Errorf("--signing-key: %w", err)
	}
	if len(data) > maxSigningKey {
		return "", usage.Errorf("--signing-key: %s holds more than %d bytes", path, maxSigningKey)
	}
	i := bytes.Index(data, []byte("-----BEGIN"))
	if i < 0 {
		return "", usage.Errorf("--signing-key: %s holds no PEM private key", path)
	}
	return string(data[i:]), nil
}
