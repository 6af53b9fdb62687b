// Package talosapi is a Talos API test server: a real gRPC server that speaks the
// COSI state API and a sliver of MachineService the way a Talos node does, over
// mutual TLS with a Talos OS CA, enforcing Talos roles from the client
// certificate's O=.
//
// It exists so the controller is tested with the real machinery client against
// real TLS and real RBAC, not against a fake: a reader credential that could
// reboot a node, or a client that accepted another CA, fails a test here.
//
// Served resources (as Talos v1.14 names them): k8s.NodeIP "kubelet",
// k8s.Nodename "nodename", network.HostnameStatus "hostname", and the sensitive
// secrets.OSRoot "os" (readable by os:admin only, as on a node).
package talosapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/cosi-project/runtime/pkg/state/registry"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/secrets"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Options configures a test node.
type Options struct {
	// CA is the cluster's OS CA: it signs the server certificate and is the only
	// issuer whose client certificates are accepted.
	CA *CA

	// Nodename, Hostname and Addresses are the node's identity as Talos reports
	// it (k8s.Nodename, network.HostnameStatus, k8s.NodeIP "kubelet").
	Nodename  string
	Hostname  string
	Addresses []netip.Addr

	// TalosVersion is reported by MachineService.Version; "v1.14.1" if empty.
	TalosVersion string
}

// Identity is what a node reports about itself.
type Identity struct {
	Nodename  string
	Hostname  string
	Addresses []netip.Addr
}

// Server is one running test node. It is safe for concurrent use.
type Server struct {
	grpc     *grpc.Server
	listener *gatedListener
	st       state.State
	rules    map[string]role.Set
	version  string

	serveDone chan struct{}
	serveErr  error
	stopOnce  sync.Once
	stopCtx   func() bool

	mu    sync.Mutex
	delay time.Duration
	// hold, while set, holds every call that arrives until it is closed.
	hold  chan struct{}
	muted bool
	// held is the resource type whose watch streams hold their first
	// message, and released is closed when they are let go.
	held     string
	released chan struct{}
	// empties is how many empty watch messages follow each one sent.
	empties  int
	calls    map[string]int
	denied   map[string]int
	reboots  int
	certs    []*x509.Certificate
	certSeen map[string]struct{}
}

// Start serves a test node on 127.0.0.1 on a free port until Stop is called or
// ctx is done.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.CA == nil {
		return nil, errors.New("talosapi: Options.CA is required")
	}

	st, err := newState(ctx)
	if err != nil {
		return nil, fmt.Errorf("talosapi: build state: %w", err)
	}

	s := &Server{
		st:        st,
		rules:     rules(),
		version:   opts.TalosVersion,
		serveDone: make(chan struct{}),
		calls:     map[string]int{},
		denied:    map[string]int{},
		certSeen:  map[string]struct{}{},
	}

	if s.version == "" {
		s.version = "v1.14.1"
	}

	if err = s.SetIdentity(ctx, Identity{Nodename: opts.Nodename, Hostname: opts.Hostname, Addresses: opts.Addresses}); err != nil {
		return nil, err
	}

	dnsNames := []string{"localhost"}
	if opts.Hostname != "" {
		dnsNames = append(dnsNames, opts.Hostname)
	}

	serverCert, err := opts.CA.serverCertificate(dnsNames, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
	if err != nil {
		return nil, fmt.Errorf("talosapi: server certificate: %w", err)
	}

	tlsConfig := &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    opts.CA.Pool(),
		MinVersion:   tls.VersionTLS12,
	}

	var lc net.ListenConfig

	inner, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("talosapi: listen: %w", err)
	}

	s.listener = newGatedListener(inner)

	s.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		grpc.UnaryInterceptor(s.unaryInterceptor),
		grpc.StreamInterceptor(s.streamInterceptor),
	)

	// The state is served through Talos's access policy, as machined serves it.
	cosiv1alpha1.RegisterStateServer(s.grpc, server.NewState(state.Filter(st, accessPolicy(st))))
	machine.RegisterMachineServiceServer(s.grpc, &machineService{s: s})

	go func() {
		defer close(s.serveDone)

		if err := s.grpc.Serve(s.listener); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.mu.Lock()
			s.serveErr = err
			s.mu.Unlock()
		}
	}()

	// AfterFunc holds no goroutine until ctx is done, and Stop unregisters it.
	s.stopCtx = context.AfterFunc(ctx, s.Stop)

	return s, nil
}

// Endpoint is the node's address as host:port, for client.WithEndpoints.
func (s *Server) Endpoint() string {
	return s.listener.Addr().String()
}

// State is the node's unfiltered resource state, for tests that need to remove
// or corrupt a resource; clients only ever see it through the access policy.
func (s *Server) State() state.State {
	return s.st
}

// SetIdentity replaces the node's NodeIP, Nodename and HostnameStatus, as
// Talos's controllers would after a configuration or network change.
func (s *Server) SetIdentity(ctx context.Context, id Identity) error {
	addrs := slices.Clone(id.Addresses)

	if err := safe.StateModify(ctx, s.st, k8s.NewNodeIP(k8s.NamespaceName, k8s.KubeletID), func(r *k8s.NodeIP) error {
		r.TypedSpec().Addresses = addrs

		return nil
	}); err != nil {
		return fmt.Errorf("talosapi: set NodeIP: %w", err)
	}

	if err := safe.StateModify(ctx, s.st, k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID), func(r *k8s.Nodename) error {
		r.TypedSpec().Nodename = id.Nodename
		r.TypedSpec().HostnameVersion = "1"

		return nil
	}); err != nil {
		return fmt.Errorf("talosapi: set Nodename: %w", err)
	}

	if err := safe.StateModify(ctx, s.st, network.NewHostnameStatus(network.NamespaceName, network.HostnameID), func(r *network.HostnameStatus) error {
		r.TypedSpec().Hostname = id.Hostname

		return nil
	}); err != nil {
		return fmt.Errorf("talosapi: set HostnameStatus: %w", err)
	}

	return nil
}

// SetUnavailable makes the node refuse connections (and drops open ones) while
// down is true, as a node that is off or behind a rejecting firewall; false
// brings it back on the same endpoint.
func (s *Server) SetUnavailable(down bool) {
	s.setMode(down, refusing)
}

// SetHanging makes the node accept TCP connections but never answer while hang
// is true, as a black-holed node: only the client's deadline ends a call.
func (s *Server) SetHanging(hang bool) {
	s.setMode(hang, hanging)
}

// Held is how many connections the node holds unanswered while hanging.
func (s *Server) Held() int {
	return s.listener.heldConns()
}

// Connections is how many connections reached the node, whatever it did
// with them.
func (s *Server) Connections() int {
	return s.listener.acceptedConns()
}

func (s *Server) setMode(on bool, m mode) {
	if on {
		s.listener.setMode(m)
	} else {
		s.listener.setMode(serving)
	}
}

// SetDelay makes every call that arrives from now on wait d (or until its
// caller gives up) before it is answered, as a slow node: a test can hold a
// reader in flight. Zero answers at once again; calls already waiting keep
// their wait.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.delay = d
}

// Hold makes every call that arrives from now on wait until release is
// called (or its caller gives up), as a slow node whose answer a test lets
// go at the moment it chooses: the test holds a reader in flight while it
// changes what the reader's caller decides on. release may be called more
// than once.
func (s *Server) Hold() (release func()) {
	ch := make(chan struct{})

	s.mu.Lock()
	s.hold = ch
	s.mu.Unlock()

	var once sync.Once

	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.hold == ch {
				s.hold = nil
			}
			s.mu.Unlock()

			close(ch)
		})
	}
}

// SetWatchesMuted makes the node send nothing on its watch streams while
// muted is true, the ones open and the ones opened meanwhile: a node whose
// state changes without its watchers hearing of it (a stalled stream, or a
// node that says one thing in its events and another when asked). Direct
// reads answer as ever.
func (s *Server) SetWatchesMuted(muted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.muted = muted
}

// SetWatchHeld makes the watch streams of the resource type typ (as
// "NodeIPs.kubernetes.talos.dev"; "" for none) that have not sent
// their first message yet hold it back, which the client waits for before
// its watch is open, until SetWatchHeld is called again: a node that answers
// a watcher's last stream late while its other streams run.
func (s *Server) SetWatchHeld(typ string) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.released != nil {
		close(s.released)
		s.released = nil
	}

	s.held = typ
	if typ != "" {
		s.released = make(chan struct{})
	}
}

// heldFor is the channel a watch stream of type typ waits on before its
// first message; nil when it is not held.
func (s *Server) heldFor(typ string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()

	if typ == "" || typ != s.held {
		return nil
	}

	return s.released
}

// SetEmptyWatchMessages makes every watch message sent from now on followed
// by n messages that hold no event: a node that floods its watchers with
// answers the event count does not see.
func (s *Server) SetEmptyWatchMessages(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.empties = n
}

func (s *Server) emptyWatchMessages() int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.empties
}

func (s *Server) watchesMuted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.muted
}

// wait holds a call until the hold in place when it arrived is released,
// then for the delay set when it arrived.
func (s *Server) wait(ctx context.Context) error {
	s.mu.Lock()
	d, hold := s.delay, s.hold
	s.mu.Unlock()

	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	if d <= 0 {
		return nil
	}

	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Calls is how many calls of the full gRPC method (e.g. MethodStateGet) reached
// the server with a verified client certificate, allowed or not.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.calls[method]
}

// Denied is how many calls of the method were refused for the caller's role.
func (s *Server) Denied(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.denied[method]
}

// Reboots is how many reboots were authorized (and, on purpose, not done).
func (s *Server) Reboots() int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.reboots
}

// ClientCertificates are the distinct client certificates that made calls, in
// the order first seen: tests read the O= a client really presented, and see
// whether it reused or renewed its credential.
func (s *Server) ClientCertificates() []*x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()

	return slices.Clone(s.certs)
}

// GoAway tells every client connected to stop opening calls on its
// connection (HTTP/2 GOAWAY), as a node whose API restarts or whose address
// moves to another node (a VIP's failover) does: the calls in flight are
// answered, then the connections close and the server stops. It returns at
// once.
func (s *Server) GoAway() {
	s.listener.drain()
	go s.grpc.GracefulStop()
}

// Stop closes every connection and waits for the server to finish. It is
// idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.stopCtx()
		s.grpc.Stop()
		s.listener.Close() //nolint:errcheck // grpc.Stop closed it already; this drops held connections
		<-s.serveDone
	})
}

// Err reports an error that ended serving early, if any.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.serveErr
}

func (s *Server) recordCall(method string, cert *x509.Certificate) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.calls[method]++

	key := string(cert.Raw)
	if _, ok := s.certSeen[key]; !ok {
		s.certSeen[key] = struct{}{}
		s.certs = append(s.certs, cert)
	}
}

func (s *Server) recordDenied(method string) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.denied[method]++
}

func (s *Server) recordReboot() {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.reboots++
}

// newState builds the resource state the way machined's v1alpha2 state does:
// per-namespace in-memory stores, with namespaces and resource definitions
// registered so the access policy can look them up.
func newState(ctx context.Context) (state.State, error) {
	st := state.WrapCore(namespaced.NewState(inmem.Build))

	namespaces := registry.NewNamespaceRegistry(st)
	if err := namespaces.RegisterDefault(ctx); err != nil {
		return nil, err
	}

	resources := registry.NewResourceRegistry(st)
	if err := resources.RegisterDefault(ctx); err != nil {
		return nil, err
	}

	for _, ns := range []struct{ name, description string }{
		{k8s.NamespaceName, "Kubernetes all node types resources."},
		{network.NamespaceName, "Networking resources."},
		{secrets.NamespaceName, "Resources with secret material."},
	} {
		if err := namespaces.Register(ctx, ns.name, ns.description); err != nil {
			return nil, err
		}
	}

	for _, r := range []meta.ResourceWithRD{
		&k8s.NodeIP{},
		&k8s.Nodename{},
		&network.HostnameStatus{},
		&secrets.OSRoot{},
	} {
		if err := resources.Register(ctx, r); err != nil {
			return nil, err
		}
	}

	// Something secret to refuse: the real node keeps its OS CA here.
	osRoot := secrets.NewOSRoot(secrets.OSRootID)
	osRoot.TypedSpec().Token = "talosapi-test-token"

	if err := st.Create(ctx, osRoot); err != nil {
		return nil, err
	}

	return st, nil
}
