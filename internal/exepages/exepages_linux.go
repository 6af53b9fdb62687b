//go:build linux

package exepages

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Release drops the process's mappings of the pages of its own executable
// that are still the file's (madvise MADV_DONTNEED on its read-only
// mappings, none of whose pages was copied on write): the next touch maps
// them again from the page cache. Unlike MADV_PAGEOUT, it needs no write
// permission on the binary, which a container running as another user than
// the image's owner lacks (the kernel then pages out nothing, silently), and
// it leaves the page cache to the kernel.
func Release() (Released, error) {
	before, err := residentFile()
	if err != nil {
		return Released{}, err
	}
	ranges, err := exeRanges()
	if err != nil {
		return Released{}, err
	}
	for _, r := range ranges {
		// The range is the process's own mapping, read from its smaps: no
		// Go memory is named, so no unsafe.Pointer is needed.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_DONTNEED); errno != 0 {
			// EPERM: a seccomp profile that refuses it.
			if errno == unix.EINVAL || errno == unix.ENOSYS || errno == unix.EPERM {
				return Released{}, fmt.Errorf("%w: madvise(MADV_DONTNEED): %w", ErrUnsupported, errno)
			}
			return Released{}, fmt.Errorf("release %#x-%#x of the binary: %w", r.start, r.end, errno)
		}
	}
	after, err := residentFile()
	if err != nil {
		return Released{}, err
	}
	return Released{FileBefore: before, FileAfter: after}, nil
}

type addrRange struct{ start, end uintptr }

// mapping is one mapping of /proc/self/smaps, as far as Release reads it.
type mapping struct {
	addrRange
	perms, dev, inode string
	// copied is whether any of its pages was copied on write (resident,
	// or swapped out), and counted whether smaps said so at all: a mapping
	// it says nothing of is taken for copied.
	copied, counted bool
}

// exeRanges reads the read-only mappings of the running binary from
// /proc/self/smaps. The binary is told by the mapping that holds this
// function's code, and its other segments by that mapping's device and
// inode as smaps gives them: a stat of /proc/self/exe can name another
// (overlayfs, before Linux 6.8, shows the layer's inode in the maps and its
// own to stat). A mapping with a page copied on write (a dynamic loader's
// relocations, made read-only after; a debugger's or a uprobe's breakpoint)
// is left out, since dropping it would bring the file's bytes back in place
// of the copy; so is one with a page swapped out, which may be such a copy.
func exeRanges() ([]addrRange, error) {
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("read the process's mappings: %w", err)
	}
	var maps []mapping
	s := bufio.NewScanner(bytes.NewReader(smaps))
	for s.Scan() {
		f := strings.Fields(s.Text())
		switch {
		case len(f) == 0:
		case !strings.HasSuffix(f[0], ":"):
			// A mapping's header: start-end perms offset dev inode [path].
			if len(f) < 5 {
				return nil, fmt.Errorf("a mapping %q of /proc/self/smaps has no device or inode", s.Text())
			}
			r, err := parseRange(f[0])
			if err != nil {
				return nil, err
			}
			maps = append(maps, mapping{addrRange: r, perms: f[1], dev: f[3], inode: f[4]})
		case (f[0] == "Anonymous:" || f[0] == "Swap:") && len(maps) > 0:
			// A page copied on write and then swapped out is no longer
			// Anonymous but Swap: dropping it would throw the copy away.
			m := &maps[len(maps)-1]
			m.counted = m.counted || f[0] == "Anonymous:"
			m.copied = m.copied || len(f) < 2 || f[1] != "0"
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read the process's mappings: %w", err)
	}
	code := reflect.ValueOf(exeRanges).Pointer()
	i := slices.IndexFunc(maps, func(m mapping) bool { return m.start <= code && code < m.end })
	if i < 0 || maps[i].inode == "0" {
		return nil, errors.New("the running binary's code is in no mapping of a file in /proc/self/smaps")
	}
	dev, inode := maps[i].dev, maps[i].inode
	var ranges []addrRange
	for _, m := range maps {
		if m.dev == dev && m.inode == inode && !strings.Contains(m.perms, "w") && m.counted && !m.copied {
			ranges = append(ranges, m.addrRange)
		}
	}
	return ranges, nil
}

func parseRange(field string) (addrRange, error) {
	start, end, ok := strings.Cut(field, "-")
	if !ok {
		return addrRange{}, fmt.Errorf("a mapping %q of /proc/self/smaps has no range", field)
	}
	a, errA := strconv.ParseUint(start, 16, 64)
	b, errB := strconv.ParseUint(end, 16, 64)
	if err := errors.Join(errA, errB); err != nil {
		return addrRange{}, fmt.Errorf("a mapping %q of /proc/self/smaps: %w", field, err)
	}
	if b <= a {
		return addrRange{}, fmt.Errorf("a mapping %q of /proc/self/smaps ends before it starts", field)
	}
	return addrRange{start: uintptr(a), end: uintptr(b)}, nil
}

// residentFile is the process's resident file-backed memory, in bytes.
func residentFile() (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read the process's status: %w", err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		value, ok := strings.CutPrefix(line, "RssFile:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read RssFile %q of the process's status: %w", value, err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("no RssFile in the process's status")
}
