//go:build !windows

package privatefile

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// Write replaces path with data, mode 0600 whatever the file it replaces
// had, through a temporary file in path's own directory (never a shared
// temporary directory) renamed over it. A symbolic link at path is replaced,
// not followed.
//
// renameio.WriteFile is not used as it is: it keeps the mode of the file it
// replaces, so a file someone loosened to 0644 would stay readable by all.
func Write(path string, data []byte) error {
	return replace(path, data, renameio.WithStaticPermissions(Mode))
}

// WriteMode is Write of a file others may read: mode perm less the umask,
// whatever the file it replaces had (a world-writable one stays so
// otherwise). A symbolic link, a FIFO or any other file at path is
// replaced, never written through, and an interrupted write leaves the old
// file whole.
func WriteMode(path string, data []byte, perm os.FileMode) error {
	return replace(path, data, renameio.WithPermissions(perm))
}

func replace(path string, data []byte, mode ...renameio.Option) error {
	// A device or a directory at path, or named by a link there
	// (/dev/stdout is a link to /proc/self/fd/1), would be replaced by a
	// file, not written to.
	for _, stat := range []func(string) (os.FileInfo, error){os.Lstat, os.Stat} {
		if info, err := stat(path); err == nil && info.Mode()&(os.ModeDir|os.ModeDevice|os.ModeCharDevice) != 0 {
			return fmt.Errorf("write %s: it is a %s, not a file", path, kind(info.Mode()))
		}
	}
	f, err := renameio.NewPendingFile(path, append([]renameio.Option{renameio.WithTempDir(filepath.Dir(path))}, mode...)...)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer f.Cleanup() //nolint:errcheck // after CloseAtomicallyReplace it does nothing; before, the error that matters is returned
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// kind names a file mode that is not a regular file's.
func kind(m os.FileMode) string {
	if m.IsDir() {
		return "directory"
	}
	return "device"
}
