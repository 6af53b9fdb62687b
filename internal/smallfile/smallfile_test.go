//go:build unix

package smallfile_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/smallfile"
)

// A regular file is read to its bound; a FIFO (which would hold the reader
// for good), a device read without end, a directory and a file past the
// bound are refused, each at once.
func TestOnlyARegularFileWithinItsBoundIsRead(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(file, []byte("0123456789"), 0o600))
	data, err := smallfile.Read(file, 10)
	require.NoError(t, err)
	assert.Equal(t, "0123456789", string(data))
	_, err = smallfile.Read(file, 9)
	require.ErrorContains(t, err, "larger than 9 bytes")

	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(file, link))
	data, err = smallfile.Read(link, 10)
	require.NoError(t, err, "a link to a file (a Secret's) is followed")
	assert.Equal(t, "0123456789", string(data))

	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() { _, err := smallfile.Read(fifo, 10); done <- err }()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "is not a regular file")
	case <-time.After(10 * time.Second):
		t.Fatal("reading a FIFO waits for a writer")
	}
	for _, path := range []string{"/dev/zero", dir} {
		_, err := smallfile.Read(path, 10)
		require.ErrorContains(t, err, "is not a regular file", path)
	}
	_, err = smallfile.Read(filepath.Join(dir, "none"), 10)
	require.ErrorIs(t, err, os.ErrNotExist)
}
