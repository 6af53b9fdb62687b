// Package heldtemp makes temporary directories that a process holds for as
// long as it lives, and removes those whose process is gone.
//
// The engine keeps its private copy of a bundle, and OPA's OCI store, in a
// temporary directory it removes when it stops. A process killed (the
// kernel's OOM killer, a SIGKILL after the grace period, a panic) leaves it
// behind, in the pod's emptyDir, which outlives the container: each unclean
// restart left a directory, up to a few MiB of a registry's blobs each,
// until /tmp was full and the kubelet evicted the pod (review 235 F2). A
// directory made here holds a lock file, locked (flock(2)) while its
// process lives; the kernel lets the lock go when the process dies, however
// it dies, so a directory whose lock can be taken is nobody's.
package heldtemp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// lockName is the lock file inside each directory.
const lockName = ".held"

// staleAge is how long a directory's lock file must have been there before
// a free lock means its process is gone: between making the directory and
// taking its lock a process holds none, and another's sweep must not take
// that moment for a death.
var staleAge = time.Minute

// Dir is a directory made by Make, held until Remove.
type Dir struct {
	path string
	lock *os.File
}

// Path is the directory's path.
func (d *Dir) Path() string { return d.path }

// Remove removes the directory and lets its lock go.
func (d *Dir) Remove() error {
	err := os.RemoveAll(d.path)
	if d.lock != nil {
		err = errors.Join(err, d.lock.Close())
	}
	return err
}

// Make makes a new directory in os.TempDir() named by pattern (as
// os.MkdirTemp names it; pattern must end in "-" or "*"), holds it, and
// removes the directories of the same pattern whose process is gone,
// reporting how many it removed. A directory it cannot tell is left alone.
func Make(pattern string) (*Dir, int, error) {
	path, err := os.MkdirTemp("", pattern)
	if err != nil {
		return nil, 0, err
	}
	lock, err := hold(filepath.Join(path, lockName))
	if err != nil {
		_ = os.RemoveAll(path)
		return nil, 0, fmt.Errorf("hold %s: %w", path, err)
	}
	d := &Dir{path: path, lock: lock}
	return d, removeStale(filepath.Dir(path), strings.TrimSuffix(pattern, "*"), path), nil
}

// removeStale removes the directories of parent named prefix* but self
// whose lock file is there, old enough, and free.
func removeStale(parent, prefix, self string) int {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return 0
	}
	removed := 0
	for _, e := range entries {
		path := filepath.Join(parent, e.Name())
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) || path == self {
			continue
		}
		if gone(path, time.Now(), staleAge) && os.RemoveAll(path) == nil {
			removed++
		}
	}
	return removed
}
