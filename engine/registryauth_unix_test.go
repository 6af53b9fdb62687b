//go:build unix

package engine_test

import (
	"context"
	"io"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
)

// A credentials file that is a named pipe fails the start, where an open
// for reading would wait for a writer for ever.
func TestARegistryCredentialsFifoFailsTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	_, err := engine.New(context.Background(), engine.Options{
		Source: bundles.OCIScheme + "registry.example/ichor/policy:stable", VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: newSigner(t).public}},
		RegistryCredentials: path, StartTimeout: 2 * time.Second, DecisionLog: io.Discard, Log: io.Discard,
	})
	require.ErrorContains(t, err, "is not a regular file")
}
