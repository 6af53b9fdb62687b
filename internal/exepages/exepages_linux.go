//go:build linux

package exepages

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
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
			if errno == unix.EINVAL || errno == unix.ENOSYS {
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

// exeRanges reads the read-only mappings of the running binary from
// /proc/self/smaps, told by the device and inode of /proc/self/exe (its path
// there may have been replaced or deleted since it started). A mapping with a
// page copied on write (a dynamic loader's relocations, made read-only after:
// not in ichor's static binary, but in a build with cgo) is left out, since
// dropping it would bring the file's bytes back in place of the copy.
func exeRanges() ([]addrRange, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return nil, fmt.Errorf("stat the running binary: %w", err)
	}
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	ino := strconv.FormatUint(st.Ino, 10)
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("read the process's mappings: %w", err)
	}
	var (
		ranges  []addrRange
		current *addrRange // the binary's read-only mapping being read, if any
	)
	s := bufio.NewScanner(bytes.NewReader(smaps))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") {
			// A mapping's header: start-end perms offset dev inode [path].
			current = nil
			if len(f) < 5 || f[3] != dev || f[4] != ino || strings.Contains(f[1], "w") {
				continue
			}
			r, err := parseRange(f[0])
			if err != nil {
				return nil, err
			}
			ranges = append(ranges, r)
			current = &ranges[len(ranges)-1]
			continue
		}
		if current != nil && f[0] == "Anonymous:" && (len(f) < 2 || f[1] != "0") {
			// Copied on write: not the file's any more.
			ranges = ranges[:len(ranges)-1]
			current = nil
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read the process's mappings: %w", err)
	}
	if len(ranges) == 0 {
		return nil, errors.New("no read-only mapping of the running binary in /proc/self/smaps")
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
