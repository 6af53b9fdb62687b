package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/spf13/cobra"

	"github.com/ichor-dev/ichor-policy/bundles"
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
		Use:   "build [-o FILE] [--policy DIR] [--epoch N]",
		Short: "Build the policy bundle, with a revision that is a digest of its content and the epoch of its rules",
		Long: `Build the policy bundle. Its revision is a digest of its content; its epoch,
written in the signed .manifest, is the policy tree's EPOCH file (the embedded
tree's without --policy), or --epoch. A manager with --bundle-key refuses a
signed bundle whose epoch is below the floor of its binary or below the
highest epoch activated in its cluster; raise EPOCH with each change that
closes a hole. A tree without EPOCH needs --epoch: the epoch is not guessed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
				key, err := os.ReadFile(signingKey)
				if err != nil {
					return usage.Errorf("--signing-key: %w", err)
				}
				if err := bundles.Sign(b, string(key), signingAlg, keyID); err != nil {
					return err
				}
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o750); err != nil {
				return fmt.Errorf("output directory: %w", err)
			}
			f, err := os.Create(out)
			if err != nil {
				return fmt.Errorf("create %s: %w", out, err)
			}
			if err := bundles.Write(f, b); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("write %s: %w", out, err)
			}
			got, _ := bundles.Epoch(b.Manifest)
			fmt.Fprintf(s.out, "wrote %s (revision %s, epoch %d)\n", out, b.Manifest.Revision, got)
			return nil
		},
	}
	build.Flags().StringVar(&policyDir, "policy", "", "the policy directory to build (default: the policy embedded in this binary)")
	build.Flags().StringVarP(&out, "output", "o", "bundle.tar.gz", "the bundle file to write")
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

// loadBundle loads a bundle the caller named; one that is not there is the
// caller's to fix (exit 2), one that is there but broken is not.
func loadBundle(path string) (*bundle.Bundle, error) {
	b, err := bundles.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, usage.Wrap(err)
	}
	return b, err
}

func newBundlePushCommand(s streams) *cobra.Command {
	var keyPath, keyAlg, keyID string
	var force bool
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
would refuse it), unless --force. oci+http:// speaks plain HTTP to the registry.`,
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
			opts := bundles.PushOptions{Force: force}
			if keyPath != "" {
				key, err := os.ReadFile(keyPath)
				if err != nil {
					return usage.Errorf("--key: %w", err)
				}
				opts.Verification = bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{
					keyID: {Key: string(key), Algorithm: keyAlg},
				}, keyID, "", nil)
			}
			desc, err := bundles.PushOCI(cmd.Context(), ref, tarball, opts)
			if errors.Is(err, bundles.ErrPushDigest) {
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
	return push
}
