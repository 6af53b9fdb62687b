//go:build linux

package exepages_test

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ichor-dev/ichor-policy/internal/exepages"
)

// The test binary's start touched its pages as ichor's does: once released,
// far fewer are resident, and the process runs on (its code is faulted back).
// Released again, it gives back pages again; how many depends on how much of
// what was faulted back the process (and the runtime beside it) is using at
// that moment, which a loaded machine makes most of them: a quarter was
// asked of the second release too, and failed under a CI run's load (2,196
// KiB before, 2,004 after).
func TestReleaseGivesBackTheBinarysPages(t *testing.T) {
	for round := range 2 {
		r, err := exepages.Release()
		if errors.Is(err, exepages.ErrUnsupported) {
			t.Skipf("this kernel cannot drop mapped pages: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("resident file pages %d KiB before, %d KiB after", r.FileBefore>>10, r.FileAfter>>10)
		released := r.FileAfter < r.FileBefore
		if round == 0 {
			released = r.FileAfter < r.FileBefore*3/4
		}
		if r.FileBefore <= 0 || !released {
			t.Fatalf("release %d: resident file pages %d bytes before, %d after: not released", round+1, r.FileBefore, r.FileAfter)
		}
	}
}

// A read-only mapping of the binary holding a page copied on write (as a
// dynamic loader's relocations are) keeps its copy: dropping it would bring
// the file's bytes back in its place.
func TestAMappingCopiedOnWriteIsKept(t *testing.T) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := os.Getpagesize()
	m, err := unix.Mmap(int(f.Fd()), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m) //nolint:errcheck // the test's own mapping
	if m[0] != 0x7f {
		t.Fatalf("the binary starts with %#x, not ELF's 0x7f", m[0])
	}
	m[0] = 'X'
	if err := unix.Mprotect(m, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if _, err := exepages.Release(); err != nil {
		t.Fatal(err)
	}
	if m[0] != 'X' {
		t.Fatalf("the copied page was dropped: %#x, the file's byte, is back", m[0])
	}
}
