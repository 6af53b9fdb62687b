package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// KubernetesVersion is the version of the control-plane binaries the harness
// runs; tools/envtest builds exactly this one.
const KubernetesVersion = "v1.37.2"

// modulePath identifies this repository's go.mod when the root is searched for.
const modulePath = "github.com/ichor-dev/ichor-policy"

// controlPlaneBinaries are the executables the harness starts from the assets
// directory.
var controlPlaneBinaries = []string{"kube-apiserver", "etcd", signerBinary}

// AssetsMissingError is Start's error (errors.As) when a control-plane binary
// is absent, so a caller such as the demo can tell the user what to run.
type AssetsMissingError struct {
	Dir     string
	Missing []string
}

func (e *AssetsMissingError) Error() string {
	return fmt.Sprintf("control-plane binaries not found in %s: run `make envtest-assets` (missing: %s)", e.Dir, strings.Join(e.Missing, ", "))
}

// DefaultAssetsDir is where `make envtest-assets` puts the binaries:
// ${XDG_CACHE_HOME:-$HOME/.cache}/ichor-policy/envtest/KubernetesVersion.
func DefaultAssetsDir() (string, error) {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("locate the default assets directory: %w", err)
		}

		cache = filepath.Join(home, ".cache")
	}

	return filepath.Join(cache, "ichor-policy", "envtest", KubernetesVersion), nil
}

// resolveAssetsDir picks the directory the way the Makefile does (an explicit
// option, then KUBEBUILDER_ASSETS, then the cache) and checks every binary is
// there, so a missing build is reported before anything is started.
func resolveAssetsDir(explicit string) (string, error) {
	dir := explicit
	if dir == "" {
		dir = os.Getenv("KUBEBUILDER_ASSETS")
	}

	if dir == "" {
		var err error
		if dir, err = DefaultAssetsDir(); err != nil {
			return "", err
		}
	}

	var missing []string

	for _, name := range controlPlaneBinaries {
		info, err := os.Stat(filepath.Join(dir, name)) //nolint:gosec // G703: a stat of the envtest assets directory
		if err != nil || info.IsDir() || info.Mode().Perm()&0o111 == 0 {
			missing = append(missing, name)
		}
	}

	if missing != nil {
		return "", &AssetsMissingError{Dir: dir, Missing: missing}
	}

	return dir, nil
}

// resolveCRDDir finds deploy/crds: an explicit option, else the one of the
// repository's root (repoRoot).
func resolveCRDDir(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("CRD directory: %w", err)
		}

		return explicit, nil
	}

	root, starts, ok := repoRoot()
	if !ok {
		return "", fmt.Errorf("deploy/crds not found above %v: set Options.CRDDir", starts)
	}

	return filepath.Join(root, "deploy", "crds"), nil
}

// repoRoot finds the repository's root: above this source file when its path
// is absolute, else (a build with -trimpath, as `make test` and the demo's
// binary are) above the working directory, a package's directory under
// `go test`. starts are the directories searched from.
func repoRoot() (root string, starts []string, ok bool) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}

	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}

	for _, start := range starts {
		if root, ok := findRepoRoot(start); ok {
			return root, starts, true
		}
	}

	return "", starts, false
}

// findRepoRoot walks up from dir to the directory whose go.mod declares this
// module; another module's go.mod on the way (a tool module) is skipped.
func findRepoRoot(dir string) (string, bool) {
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declaresModule(data) {
			if _, err := os.Stat(filepath.Join(dir, "deploy", "crds")); err == nil {
				return dir, true
			}
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", false
		}

		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}

		dir = parent
	}
}

func declaresModule(goMod []byte) bool {
	for line := range bytes.Lines(goMod) {
		if string(bytes.TrimSpace(line)) == "module "+modulePath {
			return true
		}
	}

	return false
}
