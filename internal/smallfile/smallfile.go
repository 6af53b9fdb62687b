// Package smallfile reads the small files an operator names to a process (a
// key, a CA, a credential, a bundle): a regular file, opened without waiting,
// and read to a bound. A FIFO would hold the reader for good (opening one for
// reading waits for a writer), a device such as /dev/zero would be read until
// memory runs out, and a directory holds nothing to read (reviews 163, 168).
package smallfile

import (
	"fmt"
	"io"
	"os"
)

// Open opens path for reading, without waiting, and refuses anything but a
// regular file. The check is of the file opened, so a FIFO or a device
// swapped in after a look at the path is refused too; a link (a Secret's
// file, which the kubelet moves) is followed.
func Open(path string) (*os.File, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !info.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, info.Mode().Type())
	}
	return f, nil
}

// Read is the content of the regular file at path, refused past limit
// bytes. No error quotes the content.
func Read(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, err)
	case int64(len(data)) > limit:
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}
