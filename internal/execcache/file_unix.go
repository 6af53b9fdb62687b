//go:build unix

package execcache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"time"
)

// lockPoll is how often a held lock is tried again.
const lockPoll = 100 * time.Millisecond

// openNoFollow opens path for reading, refusing a symbolic link in its last
// element (O_NOFOLLOW: the check and the open are one step, so the file
// cannot be swapped for a link between them).
func openNoFollow(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, errors.New("it is a symbolic link")
	}
	return f, err
}

// ownedByUser refuses a file or directory that is not the user's.
func ownedByUser(info fs.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("its owner cannot be read")
	}
	if int64(st.Uid) != int64(os.Getuid()) {
		return fmt.Errorf("it belongs to uid %d, not to you (uid %d): its owner, or root, can remove it", st.Uid, os.Getuid())
	}
	return nil
}

// makesIn refuses, to the superuser run by sudo, to make a directory inside
// dir (info) when dir is the invoking user's (SUDO_UID): their HOME kept.
// Only then: root in a container whose HOME is mounted from a host user's
// (a CI job's) has no other cache, and one refused there asked for a
// credential at every kubectl call (review 237 F2).
func makesIn(dir string, info fs.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	sudoUID := os.Getenv("SUDO_UID")
	if !ok || os.Geteuid() != 0 || st.Uid == 0 || sudoUID != strconv.FormatUint(uint64(st.Uid), 10) {
		return nil
	}
	return fmt.Errorf("it would be made as root inside %s, which belongs to uid %s, who ran sudo and could then not use it (run it as that user, or with root's own HOME: sudo -H)", dir, sudoUID)
}

// openToOthers says whether a file's mode lets its group or others in.
func openToOthers(info fs.FileInfo) bool { return info.Mode().Perm()&0o077 != 0 }

// lockFile takes an exclusive flock(2) on path (made 0600 if absent, never
// through a symbolic link), trying again until ctx ends. A lock taken on a
// file that is no longer at path (removeUnlocked removed it meanwhile) is
// no lock: it is let go and path opened again.
func lockFile(ctx context.Context, path string) (func(), error) {
	ticker := time.NewTicker(lockPoll)
	defer ticker.Stop()
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		if f == nil {
			var err error
			if f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600); err != nil {
				return nil, fmt.Errorf("lock the credential cache: %w", err)
			}
		}
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) //nolint:gosec // a descriptor fits an int
		if err == nil {
			if !stillAt(f, path) {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:gosec // a descriptor fits an int
				f.Close()
				f = nil
				continue
			}
			held := f
			f = nil
			return func() {
				_ = syscall.Flock(int(held.Fd()), syscall.LOCK_UN) //nolint:gosec // a descriptor fits an int
				held.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock the credential cache: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock the credential cache: another exec-credential held it until %w", ctx.Err())
		case <-ticker.C:
		}
	}
}

// stillAt says whether the open file f is the file at path.
func stillAt(f *os.File, path string) bool {
	open, err := f.Stat()
	if err != nil {
		return false
	}
	now, err := os.Lstat(path)
	return err == nil && os.SameFile(open, now)
}

// removeUnlocked removes the credential at credPath (none when empty) and
// the lock at lockPath if no run holds that lock, and if expired, asked
// under the lock, still says so: a run renewing the credential holds the
// lock while it asks and stores, and a credential stored meanwhile is not
// the one judged expired.
func removeUnlocked(lockPath, credPath string, expired func() bool) {
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil { //nolint:gosec // a descriptor fits an int
		return
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:errcheck,gosec // closing lets it go anyway; a descriptor fits an int
	if !stillAt(f, lockPath) || !expired() {
		return
	}
	if credPath != "" {
		_ = os.Remove(credPath)
	}
	_ = os.Remove(lockPath)
}
