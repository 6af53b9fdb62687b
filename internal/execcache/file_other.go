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

// lockFile does nothing where there is no flock(2): parallel runs may each
// ask for a credential.
func lockFile(context.Context, string) (func(), error) { return func() {}, nil }
