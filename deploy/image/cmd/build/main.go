// Command build builds the manager image as an OCI image layout, without a
// container daemon (`make image`; see package image).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ichor-dev/ichor-policy/deploy/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "make image: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	o := image.Options{Dir: "."}
	var platforms, archive string
	flag.StringVar(&o.Out, "o", "dist/image", "the OCI image layout directory to write")
	flag.StringVar(&archive, "archive", "", "also write the layout as this tar archive")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "the platforms of the image index, comma separated")
	image.FlagTargets{Version: &o.Version, Revision: &o.Revision, Repository: &o.Repository, LDFlags: &o.LDFlags, Base: &o.Base, CABundle: &o.CABundle}.
		Register(flag.CommandLine, "the version stamped into ichor, and the tag")
	flag.Parse()

	var err error
	if o.Platforms, err = image.ParsePlatforms(platforms); err != nil {
		return fmt.Errorf("-platforms: %w", err)
	}
	if o.Created, err = image.SourceDateEpoch(); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	digest, err := image.Build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Printf("Wrote the image %s:%s (index %s, %s) to %s\n", o.Repository, o.Version, digest, platforms, o.Out)
	if archive != "" {
		if err := image.Archive(o.Out, archive, o.Created); err != nil {
			return err
		}
		fmt.Printf("Wrote its archive to %s\n", archive)
	}
	return nil
}
