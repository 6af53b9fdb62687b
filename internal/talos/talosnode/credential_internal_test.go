package talosnode

import (
	"context"
	"crypto/tls"
	"net/netip"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// TestReaderCredentialCannotReboot takes the very credential Read uses and
// shows the node lets it read but refuses an operator action.
func TestReaderCredentialCannotReboot(t *testing.T) {
	ca, err := talosapi.NewCA()
	require.NoError(t, err)

	srv, err := talosapi.Start(t.Context(), talosapi.Options{
		CA: ca, Nodename: "worker-1", Hostname: "worker-1", Addresses: []netip.Addr{netip.MustParseAddr("10.5.0.2")},
	})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)

	r, err := NewReader(Options{CACertPEM: ca.CertPEM, CAKeyPEM: ca.KeyPEM})
	require.NoError(t, err)

	cert, err := r.credential()
	require.NoError(t, err)

	c, err := client.New(t.Context(),
		client.WithEndpoints(srv.Endpoint()),
		client.WithTLSConfig(&tls.Config{RootCAs: r.roots, Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}),
	)
	require.NoError(t, err)

	defer c.Close() //nolint:errcheck

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	_, err = safe.StateGetByID[*k8s.NodeIP](ctx, c.COSI, k8s.KubeletID)
	require.NoError(t, err)

	_, err = c.Version(ctx)
	require.NoError(t, err)

	err = c.Reboot(ctx)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "err: %v", err)
	assert.Zero(t, srv.Reboots())
	assert.Equal(t, 1, srv.Denied(talosapi.MethodReboot))

	// Shutdown is not served at all; the os:admin fallback refuses it first.
	_, err = c.MachineClient.Shutdown(ctx, nil)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "err: %v", err)
}

// TestForeignClientCertificateIsRefusedByTheNode trusts the node's CA but signs
// the credential with another cluster's OS CA: the node itself must refuse it.
func TestForeignClientCertificateIsRefusedByTheNode(t *testing.T) {
	ca, err := talosapi.NewCA()
	require.NoError(t, err)

	other, err := talosapi.NewCA()
	require.NoError(t, err)

	srv, err := talosapi.Start(t.Context(), talosapi.Options{CA: ca, Nodename: "worker-1", Hostname: "worker-1"})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)

	r, err := NewReader(Options{CACertPEM: other.CertPEM, CAKeyPEM: other.KeyPEM, Timeout: 3 * time.Second})
	require.NoError(t, err)

	r.roots = ca.Pool()

	_, err = r.Read(t.Context(), srv.Endpoint())
	require.Error(t, err)
	t.Logf("refused: %v", err)
	assert.Zero(t, srv.Calls(talosapi.MethodStateGet), "a foreign certificate must not reach a handler")
}
