// Command release writes the files of a release into a directory (`make
// release VERSION=vX.Y.Z`; see package release).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

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
	flag.StringVar(&o.Version, "version", "", "the release's version, vX.Y.Z")
	flag.StringVar(&o.Revision, "revision", "", "the VCS revision, for the image's revision label")
	flag.StringVar(&o.Repository, "repository", "ghcr.io/ichor-dev/ichor-policy", "the image's name, without the tag")
	flag.StringVar(&o.LDFlags, "ldflags", "", "more linker flags (the version is stamped after them)")
	flag.StringVar(&imagePlatforms, "image-platforms", "linux/amd64,linux/arm64", "the image's platforms, comma separated")
	flag.StringVar(&pluginPlatforms, "plugin-platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64", "the kubectl plugin's platforms, comma separated")
	flag.StringVar(&o.Base, "base", "", "the image's base: empty for an empty base, else an OCI image layout directory or NAME@sha256:DIGEST")
	flag.StringVar(&o.CABundle, "ca-bundle", image.DefaultCABundle, "the CA bundle the empty base carries; empty for none")
	flag.StringVar(&o.Helm, "helm", "", "the helm binary that packages the chart (tools/helm)")
	flag.StringVar(&o.SBOMTool, "sbom-tool", "", "cyclonedx-gomod (tools/cyclonedx-gomod), which writes the SBOM")
	flag.Parse()
	if o.Helm == "" || o.SBOMTool == "" {
		return fmt.Errorf("-helm and -sbom-tool are required")
	}
	var err error
	if o.ImagePlatforms, err = platforms(imagePlatforms); err != nil {
		return fmt.Errorf("-image-platforms: %w", err)
	}
	if o.PluginPlatforms, err = platforms(pluginPlatforms); err != nil {
		return fmt.Errorf("-plugin-platforms: %w", err)
	}
	epoch := int64(0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if epoch, err = strconv.ParseInt(s, 10, 64); err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds: %w", s, err)
		}
	}
	o.Created = time.Unix(epoch, 0).UTC()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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

func platforms(list string) ([]v1.Platform, error) {
	var out []v1.Platform
	for _, s := range strings.Split(list, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, *p)
	}
	return out, nil
}
