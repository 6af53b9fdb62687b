// Command build builds the manager image as an OCI image layout, without a
// container daemon (`make image`; see package image).
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
	flag.StringVar(&o.Version, "version", "", "the version stamped into ichor, and the tag")
	flag.StringVar(&o.Revision, "revision", "", "the VCS revision, for the revision label")
	flag.StringVar(&o.Repository, "repository", "ghcr.io/ichor-dev/ichor-policy", "the image's name, without the tag")
	flag.StringVar(&o.LDFlags, "ldflags", "", "more linker flags (the version is stamped after them)")
	flag.StringVar(&o.Base, "base", "", "the base image: empty for an empty base, else an OCI image layout directory or NAME@sha256:DIGEST")
	flag.StringVar(&o.CABundle, "ca-bundle", image.DefaultCABundle, "the CA bundle the empty base carries; empty for none")
	flag.Parse()

	for _, s := range strings.Split(platforms, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-platforms: %w", err)
		}
		o.Platforms = append(o.Platforms, *p)
	}
	// The reproducible-builds convention; without it, the epoch, so that two
	// builds of the same source still agree.
	epoch := int64(0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		var err error
		if epoch, err = strconv.ParseInt(s, 10, 64); err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds: %w", s, err)
		}
	}
	o.Created = time.Unix(epoch, 0).UTC()

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
