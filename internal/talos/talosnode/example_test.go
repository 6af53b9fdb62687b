package talosnode_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

// Example reads a test node's identity the way the approver reads a real one.
func Example() {
	ctx := context.Background()

	ca, err := talosapi.NewCA()
	if err != nil {
		panic(err)
	}

	node, err := talosapi.Start(ctx, talosapi.Options{
		CA:        ca,
		Nodename:  "worker-1",
		Hostname:  "worker-1",
		Addresses: []netip.Addr{netip.MustParseAddr("10.5.0.2"), netip.MustParseAddr("fd00::2")},
	})
	if err != nil {
		panic(err)
	}
	defer node.Stop()

	reader, err := talosnode.NewReader(talosnode.Options{
		CACertPEM:           ca.CertPEM,
		CAKeyPEM:            ca.KeyPEM,
		CertificateLifetime: 10 * time.Minute,
		Timeout:             5 * time.Second,
	})
	if err != nil {
		panic(err)
	}

	id, err := reader.Read(ctx, node.Endpoint())
	if err != nil {
		panic(err)
	}

	fmt.Println(id.Nodename, id.Hostname, id.Addresses)
	fmt.Println(node.ClientCertificates()[0].Subject.Organization)
	// Output:
	// worker-1 worker-1 [10.5.0.2 fd00::2]
	// [os:reader]
}
