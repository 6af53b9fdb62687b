package harness

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// NodeOptions describes a Talos node's identity as Talos reports it.
type NodeOptions struct {
	// Name is the node's Kubernetes name (k8s.Nodename). Required.
	Name string
	// Hostname (network.HostnameStatus); Name if empty, as on a node whose
	// name was derived from its hostname.
	Hostname string
	// Addresses are k8s.NodeIP "kubelet", the addresses Talos gives the
	// kubelet as --node-ip.
	Addresses []netip.Addr
	// TalosVersion is reported by MachineService.Version; talosapi's default
	// if empty.
	TalosVersion string
	// CA is the OS CA the node serves with and trusts; the bundle's
	// (Env.TalosCA) if nil. A node of another cluster has its own
	// (SecretsBundleSecretWithOSCA).
	CA *talosapi.CA
}

// TalosNode is a Talos API test server for one node, serving with the bundle's
// OS CA and trusting only client certificates it signed. The embedded server
// gives Endpoint, SetIdentity, SetUnavailable, SetHanging, Calls and Stop.
type TalosNode struct {
	*talosapi.Server

	// Name is the node's Kubernetes name.
	Name string
}

// StartTalosNode serves a node until ctx is done, Stop, or Env.Stop.
func (e *Env) StartTalosNode(ctx context.Context, opts NodeOptions) (*TalosNode, error) {
	if opts.Name == "" {
		return nil, errors.New("harness: NodeOptions.Name is required")
	}

	hostname := opts.Hostname
	if hostname == "" {
		hostname = opts.Name
	}

	ca := opts.CA
	if ca == nil {
		ca = e.osCA
	}

	srv, err := talosapi.Start(ctx, talosapi.Options{
		CA:           ca,
		Nodename:     opts.Name,
		Hostname:     hostname,
		Addresses:    slices.Clone(opts.Addresses),
		TalosVersion: opts.TalosVersion,
	})
	if err != nil {
		return nil, fmt.Errorf("harness: Talos node %s: %w", opts.Name, err)
	}

	node := &TalosNode{Server: srv, Name: opts.Name}

	if err = e.track(func() { e.nodes = append(e.nodes, node) }); err != nil {
		srv.Stop()

		return nil, err
	}

	return node, nil
}
