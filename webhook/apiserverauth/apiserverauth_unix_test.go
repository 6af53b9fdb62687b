//go:build unix

package apiserverauth

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A client CA file that is a FIFO or a device is refused at once: opening a
// FIFO for reading waits for a writer, and /dev/zero reads without end, so
// the manager hung, or filled its memory, before any probe served (review
// 168).
func TestACAFileThatIsNoFileIsRefusedAtOnce(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for _, path := range []string{fifo, "/dev/zero"} {
		done := make(chan error, 1)
		go func() { _, err := Load(path, []string{"a"}, ""); done <- err }()
		select {
		case err := <-done:
			require.ErrorContains(t, err, "is not a regular file", path)
		case <-time.After(10 * time.Second):
			t.Fatalf("loading %s waits", path)
		}
	}
}
