// Package netguard keeps the connections the manager makes to addresses
// others name (a tenant's kubeconfig server, a machine's Talos endpoint, a
// node's kubelet) out of the networks an operator denies: by default the
// manager's loopback, the node's link-local services (a cloud's instance
// metadata) and addresses that name no one host; the operator adds the pod
// and service networks. It checks the address each connection is about to
// reach, after DNS and before anything is sent, so a name that resolves
// elsewhere on the next connection is checked again, and a refused address
// tells whoever named it nothing of what listens there.
package netguard

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
)

// Denied is a list of networks no connection may reach. The zero value
// denies nothing.
type Denied []netip.Prefix

// DefaultKeyword, as an entry of a list Parse reads, stands for the default
// networks, so that an operator adds to them (default,10.96.0.0/12) rather
// than replacing them by mistake.
const DefaultKeyword = "default"

// defaultCIDRs are the networks DefaultKeyword stands for: no tenant's API
// server or node is on the manager's own loopback or on the link of the node
// it runs on, while a cloud's instance metadata service is, and whatever
// listens on the manager's loopback may be.
var defaultCIDRs = []string{
	"127.0.0.0/8",        // loopback
	"::1/128",            // loopback
	"169.254.0.0/16",     // link-local: instance metadata at 169.254.169.254
	"fe80::/10",          // link-local
	"fd00:ec2::254/128",  // AWS's instance metadata over IPv6, in a unique-local network
	"fd20:ce::254/128",   // Google Cloud's instance metadata over IPv6
	"100.100.100.200/32", // Alibaba Cloud's instance metadata
	"168.63.129.16/32",   // Azure's WireServer: the host's metadata and agent service for every VM
	"0.0.0.0/8",          // "this network": 0.0.0.0 reaches the local host
	"::/128",             // unspecified: reaches the local host
	"224.0.0.0/4",        // multicast: no one server
	"ff00::/8",           // multicast
}

// Default is the default networks, parsed.
func Default() Denied {
	d, err := Parse([]string{DefaultKeyword})
	if err != nil {
		panic(err) // a constant of this package
	}
	return d
}

// Parse reads networks in CIDR notation (10.0.0.0/8, fd00::/8), and
// DefaultKeyword for the default networks. A network written with host
// bits set (10.1.2.3/8) is refused, since it reads as one host to some and
// as the network to others, and so is an IPv4 network written as IPv6
// (::ffff:10.0.0.0/104): addresses are checked as the IPv4 address they
// reach, so it would deny nothing.
func Parse(entries []string) (Denied, error) {
	d := make(Denied, 0, len(entries))
	for _, e := range entries {
		s := strings.TrimSpace(e)
		if s == DefaultKeyword {
			for _, c := range defaultCIDRs {
				d = append(d, netip.MustParsePrefix(c))
			}
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither %q nor a network in CIDR notation (10.0.0.0/8, fd00::/8): %w", e, DefaultKeyword, err)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("%q has host bits set: write the network, %s", e, p.Masked())
		}
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("%q is an IPv4 network written as IPv6: write it as IPv4", e)
		}
		d = append(d, p)
	}
	return d, nil
}

// nat64 is the well-known prefix of NAT64 (RFC 6052): 64:ff9b::a9fe:a9fe
// reaches 169.254.169.254 through a NAT64 gateway.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// RefusedError is a connection not made because its address is in a
// denied network.
type RefusedError struct {
	Addr    netip.Addr
	Network netip.Prefix
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("address %s is in %s, a network the manager does not connect to: nothing was sent to it", e.Addr, e.Network)
}

// Check is a *RefusedError if addr is in a denied network. An IPv4 address
// written as IPv6 (::ffff:127.0.0.1, or behind NAT64's well-known prefix)
// is checked as the IPv4 address it reaches too, and a zone (fe80::1%eth0)
// is not a way around a network.
func (d Denied) Check(addr netip.Addr) error {
	a := addr.Unmap().WithZone("")
	candidates := []netip.Addr{a}
	if nat64.Contains(a) {
		b := a.As16()
		candidates = append(candidates, netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, p := range d {
		for _, c := range candidates {
			if p.Contains(c) {
				return &RefusedError{Addr: a, Network: p}
			}
		}
	}
	return nil
}

// Control is a net.Dialer's Control: it refuses a connection to an address
// in a denied network before the connection is attempted. An address it
// cannot read is refused too.
func (d Denied) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("a %s connection to %q, an address that is not an IP and port, is not made: %w", network, address, err)
	}
	return d.Check(ap.Addr())
}
