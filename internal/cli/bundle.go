package cli

import (
	"fmt"
	"os"
	"path/filepath"

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
	build := &cobra.Command{
		Use:   "build [-o FILE] [--policy DIR]",
		Short: "Build the policy bundle, with a revision that is a digest of its content",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			b, err := bundles.Default()
			if policyDir != "" {
				b, err = bundles.FromDir(policyDir)
			}
			if err != nil {
				return err
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
			fmt.Fprintf(s.out, "wrote %s (revision %s)\n", out, b.Manifest.Revision)
			return nil
		},
	}
	build.Flags().StringVar(&policyDir, "policy", "", "the policy directory to build (default: the policy embedded in this binary)")
	build.Flags().StringVarP(&out, "output", "o", "bundle.tar.gz", "the bundle file to write")
	build.Flags().StringVar(&signingKey, "signing-key", "", "sign the bundle with this private key (PEM), OPA's bundle signing")
	build.Flags().StringVar(&signingAlg, "signing-alg", "RS256", "the signing algorithm (RS256, ES256, PS256, ...)")
	build.Flags().StringVar(&keyID, "key-id", "ichor", "the key id written in the signature, which the manager's --bundle-key-id matches")
	cmd.AddCommand(build)
	return cmd
}
