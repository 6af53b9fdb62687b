//go:build !unix

package smallfile

import "os"

// open opens path for reading: without FIFOs there is nothing to wait for.
func open(path string) (*os.File, error) {
	return os.Open(path)
}
