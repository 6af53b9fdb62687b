package image

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// FlagTargets are where the flags that `make image` and `make release` share
// are written: the version and what the image is built from and named.
type FlagTargets struct {
	Version, Revision, Repository, LDFlags, Base, CABundle *string
}

// Register adds the shared flags to fs; versionUsage says what the version
// is to that command.
func (t FlagTargets) Register(fs *flag.FlagSet, versionUsage string) {
	fs.StringVar(t.Version, "version", "", versionUsage)
	fs.StringVar(t.Revision, "revision", "", "the VCS revision, for the image's revision label")
	fs.StringVar(t.Repository, "repository", "ghcr.io/ichor-dev/ichor-policy", "the image's name, without the tag")
	fs.StringVar(t.LDFlags, "ldflags", "", "more linker flags (the version is stamped after them)")
	fs.StringVar(t.Base, "base", "", "the image's base: empty for an empty base, else an OCI image layout directory or NAME@sha256:DIGEST")
	fs.StringVar(t.CABundle, "ca-bundle", DefaultCABundle, "the CA bundle the empty base carries; empty for none")
}

// ParsePlatforms reads a comma-separated list of OS/ARCH[/VARIANT].
func ParsePlatforms(list string) ([]v1.Platform, error) {
	var out []v1.Platform
	for _, s := range strings.Split(list, ",") {
		if strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("an empty platform in %q", list)
		}
		p, err := v1.ParsePlatform(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, *p)
	}
	return out, nil
}

// SourceDateEpoch is the reproducible-builds convention's time
// (SOURCE_DATE_EPOCH); without it, the epoch, so that two builds of the same
// source still agree.
func SourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	epoch, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not a number of seconds: %w", s, err)
	}
	return time.Unix(epoch, 0).UTC(), nil
}
