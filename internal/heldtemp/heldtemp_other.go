//go:build !unix

package heldtemp

import (
	"os"
	"time"
)

// hold makes the lock file at path; without flock(2) it holds nothing.
func hold(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
}

// gone is false: without flock(2) no directory can be told to be nobody's.
func gone(string, time.Time, time.Duration) bool { return false }
