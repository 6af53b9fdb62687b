// Command release writes the files of a release into a directory (`make
// release VERSION=vX.Y.Z`; see package release).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ichor-dev/ichor-policy/deploy/image"
	"github.com/ichor-dev/ichor-policy/deploy/release"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "make release: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	o := release.Options{Dir: "."}
	var imagePlatforms, pluginPlatforms string
	flag.StringVar(&o.Out, "o", "dist", "the directory to write the release to")
	image.FlagTargets{Version: &o.Version, Revision: &o.Revision, Repository: &o.Repository, LDFlags: &o.LDFlags, Base: &o.Base, CABundle: &o.CABundle}.
		Register(flag.CommandLine, "the release's version, vX.Y.Z")
	flag.StringVar(&imagePlatforms, "image-platforms", "linux/amd64,linux/arm64", "the image's platforms, comma separated")
	flag.StringVar(&pluginPlatforms, "plugin-platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64", "the kubectl plugin's platforms, comma separated")
	flag.StringVar(&o.Helm, "helm", "", "the helm binary that packages the chart (tools/helm)")
	flag.StringVar(&o.SBOMTool, "sbom-tool", "", "cyclonedx-gomod (tools/cyclonedx-gomod), which writes the SBOM")
	signingKey := flag.String("signing-key", "", "an Ed25519 private key, PKCS#8 PEM (openssl genpkey -algorithm ed25519), to sign SHA256SUMS with (SHA256SUMS.sig); empty: unsigned")
	rehearsal := flag.Bool("rehearsal", false, "build from the work tree as it is, tagged or not (never to publish: the files carry the version without being its tag's)")
	flag.Parse()
	if o.Helm == "" || o.SBOMTool == "" {
		return fmt.Errorf("-helm and -sbom-tool are required")
	}
	var err error
	if *signingKey != "" {
		// Read before anything is built: a key that cannot sign fails
		// the release at once, not after its images.
		if err := release.CheckSigningKeyOutside(o.Dir, *signingKey); err != nil {
			return err
		}
		if o.SigningKey, err = release.ReadSigningKey(*signingKey); err != nil {
			return err
		}
	}
	if o.ImagePlatforms, err = image.ParsePlatforms(imagePlatforms); err != nil {
		return fmt.Errorf("-image-platforms: %w", err)
	}
	if o.PluginPlatforms, err = image.ParsePlatforms(pluginPlatforms); err != nil {
		return fmt.Errorf("-plugin-platforms: %w", err)
	}
	if o.Created, err = image.SourceDateEpoch(); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !*rehearsal {
		if err := release.CheckCheckout(ctx, o.Dir, o.Version); err != nil {
			return fmt.Errorf("%w (REHEARSAL=1 builds the tree as it is, not to publish)", err)
		}
		if err := release.CheckRevision(ctx, o.Dir, o.Revision); err != nil {
			return err
		}
	}
	if err := release.CheckOutEmpty(o.Out); err != nil {
		return err
	}
	res, err := release.Build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Printf("Wrote the release %s to %s (image %s@%s):\n", o.Version, o.Out, o.Repository, res.ImageDigest)
	for _, f := range res.Files {
		fmt.Printf("  %s\n", f)
	}
	return nil
}
