//go:build unix

package heldtemp

import (
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// hold makes the lock file at path and locks it.
func hold(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil { //nolint:gosec // a descriptor fits an int
		f.Close()
		return nil, err
	}
	return f, nil
}

// gone reports whether the directory dir is held by no process: it is this
// user's, not a link, and its lock file, there for staleAge, can be taken.
// The lock taken is let go at once.
func gone(dir string, now time.Time, staleAge time.Duration) bool {
	info, err := os.Lstat(dir)
	if err != nil || !info.IsDir() || !mine(info) {
		return false
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false // not made here, or being made: not ours to judge
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || !mine(st) || now.Sub(st.ModTime()) < staleAge {
		return false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil { //nolint:gosec // a descriptor fits an int
		return false // held: its process lives
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:gosec // a descriptor fits an int
	return true
}

// mine reports whether info is of a file this process's user owns.
func mine(info os.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int64(st.Uid) == int64(os.Geteuid())
}
