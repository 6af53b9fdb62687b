package release

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// CheckCheckout refuses to release from dir anything but a clean checkout
// of the tag named version: the binaries and the chart are built from the
// work tree, and the build records no VCS state (GOFLAGS -buildvcs=false),
// so a tree with changes, or a commit past the tag, would ship under the
// tag's name with nothing in the files to say so. Untracked files count as
// changes: the Go build compiles an untracked .go file of a package's
// directory, an untracked go.work redirects the modules, and go:embed takes
// an untracked .rego file of the policy into the default bundle. So do
// ignored files (review 183: an ignored extra.go, vendor/ or .rego file
// passed), but for the build's own outputs (ignoredOutput), and files
// git is told to look past (update-index --assume-unchanged or
// --skip-worktree), whose changes git status does not show. The tag may
// share its commit with others (a release candidate's).
func CheckCheckout(ctx context.Context, dir, version string) error {
	status, err := git(ctx, dir, "status", "--porcelain", "--untracked-files=all", "--ignored=matching")
	if err != nil {
		return fmt.Errorf("a release is built from a git checkout of its tag: %w", err)
	}
	var changed []string
	for _, line := range strings.Split(status, "\n") {
		if path, ignored := strings.CutPrefix(line, "!! "); ignored && ignoredOutput(path) || line == "" {
			continue
		}
		changed = append(changed, line)
	}
	if len(changed) > 0 {
		return fmt.Errorf("the work tree has changes, untracked or ignored files (git status --ignored):\n%s\na release is built from a clean checkout of its tag (git clean -xdf removes what is not tracked)", strings.Join(changed, "\n"))
	}
	flags, err := git(ctx, dir, "ls-files", "-v")
	if err != nil {
		return fmt.Errorf("a release is built from a git checkout of its tag: %w", err)
	}
	for _, line := range strings.Split(flags, "\n") {
		// A lowercase tag is assume-unchanged; S is skip-worktree.
		if line != "" && (line[0] >= 'a' && line[0] <= 'z' || line[0] == 'S') {
			return fmt.Errorf("git is told not to look at changes of %q (update-index --assume-unchanged or --skip-worktree), so its content in the work tree may not be the tag's: git update-index --no-assume-unchanged --no-skip-worktree it, and check it out", line[2:])
		}
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

// CheckRevision refuses a revision to stamp (the image's
// org.opencontainers.image.revision, `ichor version`) other than the commit
// checked out: one taken from the environment would name another commit
// than the files' (review 183).
func CheckRevision(ctx context.Context, dir, revision string) error {
	head, err := git(ctx, dir, "rev-parse", "HEAD")
	if err != nil {
		return fmt.Errorf("a release is built from a git checkout of its tag: %w", err)
	}
	if revision != head {
		return fmt.Errorf("the revision to stamp, %q, is not HEAD (%s): leave REVISION unset, or check that commit out", revision, head)
	}
	return nil
}

// ignoredOutput reports whether an ignored path is one of the build's own
// outputs, which the release neither compiles nor packages: the
// repository's bin/ (tools and test binaries) and dist/ (a release's files),
// and the test binaries, profiles and binaries .gitignore names.
func ignoredOutput(path string) bool {
	switch {
	case strings.HasPrefix(path, "bin/"), strings.HasPrefix(path, "dist/"):
		return true
	case strings.Contains(path, "/"):
		// Only at the root: deeper, an ignored file of policy/ is
		// embedded, and a directory hides what it holds (review 184).
		return false
	case path == "ichor", strings.HasPrefix(path, "coverage"):
		return true
	}
	for _, suffix := range []string{".test", ".out", ".exe"} {
		if strings.HasSuffix(path, suffix) {
			return true
		}
	}
	return false
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
	// Neither the caller's choice of another repository, index or work
	// tree nor the repository's file-system monitor or untracked cache
	// (which may hide a change) decides what the checks see (review 184).
	full := append([]string{"-C", dir, "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false"}, args...)
	cmd := exec.CommandContext(ctx, "git", full...) //nolint:gosec // G204: git, with the release tree and fixed arguments
	cmd.Env = gitEnv(os.Environ())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// repositoryChoices are the variables by which git's caller chooses another
// repository, index or work tree than the directory's own.
var repositoryChoices = []string{"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
	"GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE"}

// gitEnv is environ without repositoryChoices: the rest (GIT_CONFIG_*, a
// container's safe.directory among them) is the caller's to give (review
// 185: every GIT_* variable was dropped, and git refused such a checkout).
func gitEnv(environ []string) []string {
	env := []string{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(repositoryChoices, name) {
			env = append(env, kv)
		}
	}
	return env
}
