// Package privatefile writes files only their owner may read, atomically: a
// reader sees the old content or the new whole, never a part. On Windows a
// replace fails while another process has the file open (a reader), and a
// symbolic link is replaced, not written through. WriteMode writes what
// others may read (a Talos patch, a bundle) the same way.
package privatefile

import "os"

// Mode is the mode Write gives a file.
const Mode os.FileMode = 0o600
