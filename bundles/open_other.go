//go:build !unix

package bundles

import "os"

// openFile opens path for reading: without FIFOs there is nothing to wait
// for.
func openFile(path string) (*os.File, error) {
	return os.Open(path)
}
