package talosapi_test

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/secrets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

func startNode(t *testing.T, ca *talosapi.CA) *talosapi.Server {
	t.Helper()

	srv, err := talosapi.Start(t.Context(), talosapi.Options{
		CA:        ca,
		Nodename:  "worker-1",
		Hostname:  "worker-1",
		Addresses: []netip.Addr{netip.MustParseAddr("10.5.0.2"), netip.MustParseAddr("fd00::2")},
	})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)

	return srv
}

func newCA(t *testing.T) *talosapi.CA {
	t.Helper()

	ca, err := talosapi.NewCA()
	require.NoError(t, err)

	return ca
}

// connect uses the real Talos client with a certificate whose O= is orgs.
func connect(t *testing.T, ca *talosapi.CA, srv *talosapi.Server, orgs ...string) *client.Client {
	t.Helper()

	tlsConfig, err := ca.ClientTLSConfig(orgs...)
	require.NoError(t, err)

	c, err := client.New(t.Context(), client.WithEndpoints(srv.Endpoint()), client.WithTLSConfig(tlsConfig))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	return c
}

// assertDenied accepts the refusal both as a gRPC status and as the COSI client
// reports a refused write (an owner-conflict error that keeps only the text).
func assertDenied(t *testing.T, err error, what string) {
	t.Helper()

	if status.Code(err) == codes.PermissionDenied {
		return
	}

	assert.ErrorContains(t, err, "code = PermissionDenied", what)
}

func callCtx(t *testing.T) context.Context {
	t.Helper()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)

	return ctx
}

func TestReaderReadsIdentityResources(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	c := connect(t, ca, srv, "os:reader")
	ctx := callCtx(t)

	nodeIP, err := safe.StateGetByID[*k8s.NodeIP](ctx, c.COSI, k8s.KubeletID)
	require.NoError(t, err)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("10.5.0.2"), netip.MustParseAddr("fd00::2")}, nodeIP.TypedSpec().Addresses)

	nodename, err := safe.StateGetByID[*k8s.Nodename](ctx, c.COSI, k8s.NodenameID)
	require.NoError(t, err)
	assert.Equal(t, "worker-1", nodename.TypedSpec().Nodename)

	hostname, err := safe.StateGetByID[*network.HostnameStatus](ctx, c.COSI, network.HostnameID)
	require.NoError(t, err)
	assert.Equal(t, "worker-1", hostname.TypedSpec().Hostname)

	list, err := safe.StateListAll[*k8s.NodeIP](ctx, c.COSI)
	require.NoError(t, err)
	assert.Equal(t, 1, list.Len())

	version, err := c.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, "v1.14.1", version.GetMessages()[0].GetVersion().GetTag())

	assert.Equal(t, 3, srv.Calls(talosapi.MethodStateGet))
	assert.Equal(t, 1, srv.Calls(talosapi.MethodStateList))
	assert.Zero(t, srv.Denied(talosapi.MethodStateGet))

	certs := srv.ClientCertificates()
	require.Len(t, certs, 1)
	assert.Equal(t, []string{"os:reader"}, certs[0].Subject.Organization)
}

func TestSetIdentityIsSeenByTheNextRead(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	c := connect(t, ca, srv, "os:reader")
	ctx := callCtx(t)

	require.NoError(t, srv.SetIdentity(ctx, talosapi.Identity{
		Nodename:  "worker-2",
		Hostname:  "w2",
		Addresses: []netip.Addr{netip.MustParseAddr("2001:db8::7")},
	}))

	nodeIP, err := safe.StateGetByID[*k8s.NodeIP](ctx, c.COSI, k8s.KubeletID)
	require.NoError(t, err)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("2001:db8::7")}, nodeIP.TypedSpec().Addresses)

	nodename, err := safe.StateGetByID[*k8s.Nodename](ctx, c.COSI, k8s.NodenameID)
	require.NoError(t, err)
	assert.Equal(t, "worker-2", nodename.TypedSpec().Nodename)
}

func TestRebootNeedsOperator(t *testing.T) {
	for _, tc := range []struct {
		role    string
		allowed bool
	}{
		{"os:reader", false},
		{"os:etcd:backup", false},
		{"os:operator", true},
		{"os:admin", true},
	} {
		t.Run(tc.role, func(t *testing.T) {
			ca := newCA(t)
			srv := startNode(t, ca)
			c := connect(t, ca, srv, tc.role)

			err := c.Reboot(callCtx(t))
			if tc.allowed {
				require.NoError(t, err)
				assert.Equal(t, 1, srv.Reboots())

				return
			}

			assert.Equal(t, codes.PermissionDenied, status.Code(err), "err: %v", err)
			assert.Zero(t, srv.Reboots())
			assert.Equal(t, 1, srv.Denied(talosapi.MethodReboot))
		})
	}
}

func TestUnknownOrMissingRoleIsRefused(t *testing.T) {
	for name, orgs := range map[string][]string{
		"no O=":           nil,
		"empty O=":        {""},
		"unknown role":    {"system:masters"},
		"role look-alike": {"os:Reader"},
		"etcd backup":     {"os:etcd:backup"},
	} {
		t.Run(name, func(t *testing.T) {
			ca := newCA(t)
			srv := startNode(t, ca)
			c := connect(t, ca, srv, orgs...)
			ctx := callCtx(t)

			_, err := safe.StateGetByID[*k8s.NodeIP](ctx, c.COSI, k8s.KubeletID)
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "err: %v", err)

			_, err = c.Version(ctx)
			assert.Equal(t, codes.PermissionDenied, status.Code(err), "err: %v", err)
		})
	}
}

func TestStateIsReadOnlyEvenForAdmin(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	ctx := callCtx(t)

	forged := k8s.NewNodeIP(k8s.NamespaceName, "forged")
	forged.TypedSpec().Addresses = []netip.Addr{netip.MustParseAddr("192.0.2.1")}

	reader := connect(t, ca, srv, "os:reader")
	err := reader.COSI.Create(ctx, forged)
	assertDenied(t, err, "reader create")
	assert.ErrorContains(t, err, "not authorized", "the role check refuses a reader before the state sees it")
	assert.Equal(t, 1, srv.Denied(talosapi.MethodStateCreate))

	admin := connect(t, ca, srv, "os:admin")
	err = admin.COSI.Create(ctx, forged)
	assertDenied(t, err, "admin create")
	assert.ErrorContains(t, err, "write access is not allowed", "the access policy refuses even an admin")

	nodeIP, err := safe.StateGetByID[*k8s.NodeIP](ctx, admin.COSI, k8s.KubeletID)
	require.NoError(t, err)
	nodeIP.TypedSpec().Addresses = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	err = admin.COSI.Update(ctx, nodeIP)
	assertDenied(t, err, "admin update")

	err = reader.COSI.Destroy(ctx, nodeIP.Metadata())
	assertDenied(t, err, "reader destroy")
}

func TestSecretsNeedAdmin(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	ctx := callCtx(t)

	_, err := safe.StateGetByID[*secrets.OSRoot](ctx, connect(t, ca, srv, "os:reader").COSI, secrets.OSRootID)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "reader: %v", err)

	_, err = safe.StateGetByID[*secrets.OSRoot](ctx, connect(t, ca, srv, "os:operator").COSI, secrets.OSRootID)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "operator: %v", err)

	root, err := safe.StateGetByID[*secrets.OSRoot](ctx, connect(t, ca, srv, "os:admin").COSI, secrets.OSRootID)
	require.NoError(t, err)
	assert.Equal(t, "talosapi-test-token", root.TypedSpec().Token)
}

func TestClientFromAnotherCAIsRefused(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)

	other := newCA(t)
	tlsConfig, err := other.ClientTLSConfig("os:admin")
	require.NoError(t, err)

	tlsConfig.RootCAs = ca.Pool() // trust the node, present a foreign certificate

	c, err := client.New(t.Context(), client.WithEndpoints(srv.Endpoint()), client.WithTLSConfig(tlsConfig))
	require.NoError(t, err)

	defer c.Close() //nolint:errcheck

	_, err = safe.StateGetByID[*k8s.NodeIP](callCtx(t), c.COSI, k8s.KubeletID)
	require.Error(t, err)
	assert.Zero(t, srv.Calls(talosapi.MethodStateGet), "a foreign certificate must not reach a handler")
}

func TestUnavailableThenBack(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	c := connect(t, ca, srv, "os:reader")
	endpoint := srv.Endpoint()

	_, err := c.Version(callCtx(t))
	require.NoError(t, err)

	srv.SetUnavailable(true)

	_, err = c.Version(callCtx(t))
	assert.Equal(t, codes.Unavailable, status.Code(err), "err: %v", err)

	srv.SetUnavailable(false)
	assert.Equal(t, endpoint, srv.Endpoint())

	// gRPC reconnects with backoff, so the node is back within a few attempts.
	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, err := c.Version(callCtx(t))
		assert.NoError(ct, err)
	}, 10*time.Second, 100*time.Millisecond)
}

func TestHangingNodeEndsAtTheDeadline(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	c := connect(t, ca, srv, "os:reader")

	srv.SetHanging(true)

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()

	start := time.Now()
	_, err := c.Version(ctx)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "err: %v", err)
	assert.Less(t, time.Since(start), 3*time.Second)

	srv.SetHanging(false)

	assert.EventuallyWithT(t, func(ct *assert.CollectT) {
		_, err := c.Version(callCtx(t))
		assert.NoError(ct, err)
	}, 10*time.Second, 100*time.Millisecond)
}

func TestConcurrentReads(t *testing.T) {
	ca := newCA(t)
	srv := startNode(t, ca)
	c := connect(t, ca, srv, "os:reader")
	ctx := callCtx(t)

	var wg sync.WaitGroup

	for i := range 20 {
		wg.Go(func() {
			if i%5 == 0 {
				assert.NoError(t, srv.SetIdentity(ctx, talosapi.Identity{Nodename: "n", Hostname: "n"}))
			}

			_, err := safe.StateGetByID[*k8s.Nodename](ctx, c.COSI, k8s.NodenameID)
			assert.NoError(t, err)

			_ = srv.Calls(talosapi.MethodStateGet)
			_ = srv.ClientCertificates()
		})
	}

	wg.Wait()
	assert.Equal(t, 20, srv.Calls(talosapi.MethodStateGet))
}

func TestStopLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()

	ca := newCA(t)

	for range 3 {
		srv, err := talosapi.Start(t.Context(), talosapi.Options{CA: ca, Nodename: "n", Hostname: "n"})
		require.NoError(t, err)

		tlsConfig, err := ca.ClientTLSConfig("os:reader")
		require.NoError(t, err)

		c, err := client.New(t.Context(), client.WithEndpoints(srv.Endpoint()), client.WithTLSConfig(tlsConfig))
		require.NoError(t, err)

		// An open Watch must end too when the server stops.
		watchCtx, cancelWatch := context.WithCancel(t.Context())
		events := make(chan safe.WrappedStateEvent[*k8s.Nodename])
		require.NoError(t, safe.StateWatch(watchCtx, c.COSI, k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID).Metadata(), events))
		<-events

		srv.SetHanging(true)
		srv.Stop()
		srv.Stop() // idempotent

		cancelWatch()
		require.NoError(t, c.Close())
		require.NoError(t, srv.Err())
	}

	// Polled by hand: testify's Eventually runs its condition in goroutines of its own.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}

	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: before %d, after %d\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

func TestStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())

	srv, err := talosapi.Start(ctx, talosapi.Options{CA: newCA(t), Nodename: "n", Hostname: "n"})
	require.NoError(t, err)

	cancel()

	assert.Eventually(t, func() bool {
		var d net.Dialer

		conn, err := d.DialContext(t.Context(), "tcp", srv.Endpoint())
		if err == nil {
			conn.Close() //nolint:errcheck
		}

		return err != nil
	}, 5*time.Second, 20*time.Millisecond)

	srv.Stop()
}
