package release

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// CheckCheckout refuses to release from dir anything but a clean checkout
// of the tag named version: the binaries and the chart are built from the
// work tree, and the build records no VCS state (GOFLAGS -buildvcs=false),
// so a tree with changes, or a commit past the tag, would ship under the
// tag's name with nothing in the files to say so. Untracked files are not
// looked at (a release builds only what git tracks into the chart, and the
// Go build ignores what no package imports).
func CheckCheckout(ctx context.Context, dir, version string) error {
	status, err := git(ctx, dir, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return fmt.Errorf("a release is built from a git checkout of its tag: %w", err)
	}
	if status != "" {
		return fmt.Errorf("the work tree has changes (git status):\n%s\na release is built from a clean checkout of its tag", status)
	}
	tag, err := git(ctx, dir, "describe", "--exact-match", "--tags", "HEAD")
	if err != nil || tag != version {
		return fmt.Errorf("HEAD is not the tag %s (git describe --exact-match --tags: %q): tag the commit (git tag %s), or check the tag out", version, tag, version)
	}
	return nil
}

// CheckOutEmpty refuses an output directory holding files already: a file
// left by an earlier release (a platform dropped since) would be published
// beside this one's, outside its SHA256SUMS. An absent directory is fine.
func CheckOutEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the output directory: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("the output directory %s holds %d files already (%s...): remove them, or give another -o", dir, len(entries), entries[0].Name())
	}
	return nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...) //nolint:gosec // G204: git, with the release tree and fixed arguments
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}
