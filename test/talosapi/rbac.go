package talosapi

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Full gRPC method names, for Calls and Denied.
const (
	MethodStateGet     = "/cosi.resource.State/Get"
	MethodStateList    = "/cosi.resource.State/List"
	MethodStateWatch   = "/cosi.resource.State/Watch"
	MethodStateCreate  = "/cosi.resource.State/Create"
	MethodStateUpdate  = "/cosi.resource.State/Update"
	MethodStateDestroy = "/cosi.resource.State/Destroy"
	MethodVersion      = machine.MachineService_Version_FullMethodName
	MethodReboot       = machine.MachineService_Reboot_FullMethodName
)

// rules are copied from machined's authorization table (Talos v1.14,
// internal/app/machined/pkg/system/services/machined.go) for every method this
// server registers; anything else falls back to os:admin, as in Talos.
func rules() map[string]role.Set {
	readers := role.MakeSet(role.Admin, role.Operator, role.Reader)
	admins := role.MakeSet(role.Admin)

	return map[string]role.Set{
		"/cosi.resource.State/Create":             admins,
		"/cosi.resource.State/Destroy":            admins,
		"/cosi.resource.State/Teardown":           admins,
		"/cosi.resource.State/TeardownAndDestroy": admins,
		"/cosi.resource.State/Get":                readers,
		"/cosi.resource.State/List":               readers,
		"/cosi.resource.State/Update":             admins,
		"/cosi.resource.State/Watch":              readers,
		MethodVersion:                             readers,
		MethodReboot:                              role.MakeSet(role.Admin, role.Operator),
	}
}

// notAuthorized is the error Talos's authz.Authorizer returns.
func notAuthorized() error {
	return status.Error(codes.PermissionDenied, "not authorized")
}

type rolesKey struct{}

func rolesFrom(ctx context.Context) role.Set {
	roles, ok := ctx.Value(rolesKey{}).(role.Set)
	if !ok {
		return role.Zero
	}

	return roles
}

// peerCertificate returns the verified client leaf certificate; mutual TLS
// guarantees there is one on every call that reaches a handler.
func peerCertificate(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}

	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no client certificate")
	}

	return tlsInfo.State.PeerCertificates[0], nil
}

// authorize does what Talos's authz.Injector (mode Enabled) and authz.Authorizer
// do together: the roles are the leaf certificate's O= values, and the method
// needs one of its listed roles.
func (s *Server) authorize(ctx context.Context, method string) (context.Context, error) {
	cert, err := peerCertificate(ctx)
	if err != nil {
		return ctx, err
	}

	s.recordCall(method, cert)

	roles, _ := role.Parse(cert.Subject.Organization)

	allowed, ok := s.rules[method]
	if !ok {
		allowed = role.MakeSet(role.Admin)
	}

	if !allowed.IncludesAny(roles) {
		s.recordDenied(method)

		return ctx, notAuthorized()
	}

	return context.WithValue(ctx, rolesKey{}, roles), nil
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := s.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}

	if err := s.wait(ctx); err != nil {
		return nil, err
	}

	return handler(ctx, req)
}

func (s *Server) streamInterceptor(srv any, stream grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := s.authorize(stream.Context(), info.FullMethod)
	if err != nil {
		return err
	}

	if err := s.wait(ctx); err != nil {
		return err
	}

	return handler(srv, &contextStream{ServerStream: stream, ctx: ctx, s: s, watch: info.FullMethod == MethodStateWatch})
}

type contextStream struct {
	grpc.ServerStream

	ctx context.Context //nolint:containedctx // the stream's own context, with roles added

	s     *Server
	watch bool
	// typ is the resource type a watch stream asked for; sent is whether
	// it has sent a message.
	typ  string
	sent bool
}

func (c *contextStream) Context() context.Context { return c.ctx }

// RecvMsg notes the resource type a watch asks for.
func (c *contextStream) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	if req, ok := m.(*cosiv1alpha1.WatchRequest); ok && err == nil {
		c.typ = req.GetType()
	}

	return err
}

// SendMsg drops a watch's messages while the node's watches are muted, holds
// a held type's first one (SetWatchHeld), and follows each with the empty
// messages asked for (SetEmptyWatchMessages).
func (c *contextStream) SendMsg(m any) error {
	if !c.watch {
		return c.ServerStream.SendMsg(m)
	}

	if c.s.watchesMuted() {
		return nil
	}

	if !c.sent {
		c.sent = true

		if held := c.s.heldFor(c.typ); held != nil {
			select {
			case <-held:
			case <-c.ctx.Done():
				return c.ctx.Err()
			}
		}
	}

	if err := c.ServerStream.SendMsg(m); err != nil {
		return err
	}

	for range c.s.emptyWatchMessages() {
		if err := c.ServerStream.SendMsg(&cosiv1alpha1.WatchResponse{}); err != nil {
			return err
		}
	}

	return nil
}

// accessPolicy mirrors Talos's resources.AccessPolicy, which machined wraps
// around the state it serves: the API is read-only for everyone (even
// os:admin), unknown types and namespaces are refused, and sensitive types need
// os:admin.
func accessPolicy(st state.State) state.FilteringRule {
	return func(ctx context.Context, access state.Access) error {
		if !access.Verb.Readonly() {
			return status.Error(codes.PermissionDenied, "write access is not allowed")
		}

		rd, err := safe.StateGet[*meta.ResourceDefinition](ctx, st, resource.NewMetadata(
			meta.NamespaceName, meta.ResourceDefinitionType, strings.ToLower(access.ResourceType), resource.VersionUndefined))
		if err != nil {
			if state.IsNotFoundError(err) {
				return status.Error(codes.PermissionDenied, fmt.Sprintf("resource type %q is not supported", access.ResourceType))
			}

			return err
		}

		switch rd.TypedSpec().Sensitivity {
		case meta.Sensitive:
			if !rolesFrom(ctx).Includes(role.Admin) {
				return notAuthorized()
			}
		case meta.NonSensitive:
		default:
			return fmt.Errorf("unexpected sensitivity %q", rd.TypedSpec().Sensitivity)
		}

		_, err = safe.StateGet[*meta.Namespace](ctx, st, resource.NewMetadata(
			meta.NamespaceName, meta.NamespaceType, access.ResourceNamespace, resource.VersionUndefined))
		if err != nil {
			if state.IsNotFoundError(err) {
				return status.Error(codes.PermissionDenied, fmt.Sprintf("namespace %q is not supported", access.ResourceNamespace))
			}

			return err
		}

		return nil
	}
}
