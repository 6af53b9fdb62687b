//go:build !linux

package exepages

// Release does nothing where there is no MADV_PAGEOUT.
func Release() (Released, error) { return Released{}, ErrUnsupported }
