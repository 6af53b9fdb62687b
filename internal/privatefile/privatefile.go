// Package privatefile writes files only their owner may read, atomically: a
// reader sees the old content or the new whole, never a part. On Windows,
// where no rename is promised atomic, a reader may rarely find no file, but
// never a part of one, and a symbolic link is replaced, not written through.
package privatefile

import "os"

// Mode is the mode Write gives a file.
const Mode os.FileMode = 0o600
