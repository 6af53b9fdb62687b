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
// tag's name with nothing in the files to say so. Untracked files count as
// changes, unless git ignores them: the Go build compiles an untracked .go
// file of a package's directory, and an untracked go.work redirects the
// modules. The tag may share its commit with others (a release candidate's).
func CheckCheckout(ctx context.Context, dir, version string) error {
	status, err := git(ctx, dir, "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return fmt.Errorf("a release is built from a git checkout of its tag: %w", err)
	}
	if status != "" {
		return fmt.Errorf("the work tree has changes or untracked files (git status):\n%s\na release is built from a clean checkout of its tag", status)
	}
	head, err := git(ctx, dir, "rev-parse", "HEAD")
	if err != nil {
		return fmt.Errorf("a release is built from a git checkout of its tag: %w", err)
	}
	tagged, err := git(ctx, dir, "rev-parse", "--verify", "--quiet", "refs/tags/"+version+"^{commit}")
	if err != nil || tagged != head {
		return fmt.Errorf("HEAD is not the tag %s: tag the commit (git tag %s), or check the tag out", version, version)
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
