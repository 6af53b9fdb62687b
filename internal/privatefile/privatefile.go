// Package privatefile writes files only their owner may read, atomically: a
// reader sees the old content or the new whole, never a part. On Windows,
// where renameio cannot replace a file atomically (its own maybe package
// falls back the same way), the file is written in place.
package privatefile

import "os"

// Mode is the mode Write gives a file.
const Mode os.FileMode = 0o600
