//go:build !linux

package exepages

// Release does nothing but on Linux, whose /proc/self/smaps tells which
// mappings are the binary's pages unchanged.
func Release() (Released, error) { return Released{}, ErrUnsupported }
