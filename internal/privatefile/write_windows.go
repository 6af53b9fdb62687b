package privatefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Write writes data to a temporary file beside path and renames it over
// path (MoveFileEx, which replaces a symbolic link at path rather than
// writing through it). renameio, which the other platforms use, does not
// promise an atomic replace here (golang/go#22397): the rename fails while
// another process has path open (Go opens files without delete sharing),
// and a reader never sees a part of a file. Windows keeps no Unix mode; the
// file's ACL is its directory's.
func Write(path string, data []byte) error { return WriteMode(path, data, Mode) }

// WriteMode is Write: Windows keeps no Unix mode.
func WriteMode(path string, data []byte, _ os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, errWrite := f.Write(data)
	errSync := f.Sync()
	errClose := f.Close()
	if err := errors.Join(errWrite, errSync, errClose); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
