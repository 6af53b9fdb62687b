package privatefile

import (
	"fmt"
	"os"
)

// Write writes data to path, in place: renameio, which the other platforms
// use, cannot replace a file atomically here (golang/go#22397), and its
// maybe.WriteFile falls back to os.WriteFile too. Windows keeps no Unix
// mode; the file's ACL is its directory's.
func Write(path string, data []byte) error {
	if err := os.WriteFile(path, data, Mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
