package bundles

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// docker login's credential goes over plain http only to this host's
// loopback, as the manager's does: asked for it by another host reached over
// plain http, the push refuses, without its text (review of 2026-12-06: it
// went in clear, and it often pushes the organisation's images). A registry
// that asks for none is pushed to as before.
func TestACredentialGoesOverPlainHTTPOnlyToTheLoopback(t *testing.T) {
	stored := auth.Credential{Username: "ada", Password: "s3cret-push-token"}
	asked := 0
	cred := overPlainHTTP(func(context.Context, string) (auth.Credential, error) {
		asked++
		return stored, nil
	})
	c, err := cred(t.Context(), "127.0.0.1:5000")
	require.NoError(t, err)
	assert.Equal(t, stored, c, "the loopback's credential")

	c, err = cred(t.Context(), "registry.example.com:5000")
	require.ErrorIs(t, err, ErrPlainHTTPCredential)
	assert.Equal(t, auth.EmptyCredential, c)
	assert.NotContains(t, err.Error(), "s3cret")
	assert.Equal(t, 2, asked)

	none := overPlainHTTP(func(context.Context, string) (auth.Credential, error) { return auth.EmptyCredential, nil })
	c, err = none(t.Context(), "registry.example.com:5000")
	require.NoError(t, err, "a registry without a stored credential")
	assert.Equal(t, auth.EmptyCredential, c)
}
