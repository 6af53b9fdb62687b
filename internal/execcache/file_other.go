//go:build !unix

package execcache

import (
	"context"
	"errors"
	"io/fs"
	"os"
)

// openNoFollow opens path for reading, refusing a symbolic link. Without
// O_NOFOLLOW the check and the open are two steps.
func openNoFollow(path string) (*os.File, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if info.Mode()&fs.ModeSymlink != 0 {
		return nil, errors.New("it is a symbolic link")
	}
	return os.Open(path)
}

// ownedByUser cannot read an owner here; the directory's permissions are
// what protect the cache.
func ownedByUser(fs.FileInfo) error { return nil }

// makesIn has no owner to compare here.
func makesIn(string, fs.FileInfo) error { return nil }

// openToOthers is false: Windows keeps no Unix mode (Go reports every file
// 0666, or 0444 read-only), and the file's ACL is its directory's, the
// user's profile.
func openToOthers(fs.FileInfo) bool { return false }

// lockFile does nothing where there is no flock(2): parallel runs may each
// ask for a credential.
func lockFile(context.Context, string) (func(), error) { return func() {}, nil }

// removeUnlocked removes the credential at credPath (none when empty) and
// the lock at lockPath if expired still says so; there are no locks here.
func removeUnlocked(lockPath, credPath string, expired func() bool) {
	if !expired() {
		return
	}
	if credPath != "" {
		_ = os.Remove(credPath)
	}
	_ = os.Remove(lockPath)
}
