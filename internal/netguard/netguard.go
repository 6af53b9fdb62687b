// Package netguard keeps the connections the manager makes for a tenant out
// of the networks an operator denies: the manager's own host, the node's
// link-local services (a cloud's instance metadata), and whatever else the
// operator names (the pod and service networks). It checks the address each
// connection is about to reach, after DNS and before anything is sent, so a
// name that resolves elsewhere on the next connection is checked again, and
// a refused address tells the tenant nothing of what listens there.
package netguard

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
)

// Denied is a list of networks no connection for a tenant may reach. The
// zero value denies nothing.
type Denied []netip.Prefix

// DefaultCIDRs are the networks denied unless the operator says otherwise:
// no Kubernetes API server of a tenant is on the manager's own host or on
// the node's link, while the cloud's instance metadata services are, and
// so may be whatever listens on the manager's loopback.
var DefaultCIDRs = []string{
	"127.0.0.0/8",       // loopback
	"::1/128",           // loopback
	"169.254.0.0/16",    // link-local: instance metadata at 169.254.169.254
	"fe80::/10",         // link-local
	"fd00:ec2::254/128", // AWS's instance metadata over IPv6, in a unique-local network
	"0.0.0.0/8",         // "this network": 0.0.0.0 reaches the local host
	"::/128",            // unspecified: reaches the local host
	"224.0.0.0/4",       // multicast: no one server
	"ff00::/8",          // multicast
}

// Default is DefaultCIDRs, parsed.
func Default() Denied {
	d, err := Parse(DefaultCIDRs)
	if err != nil {
		panic(err) // a constant of this package
	}
	return d
}

// Parse reads networks in CIDR notation (10.0.0.0/8, fd00::/8). A network
// written with host bits set (10.1.2.3/8) is refused: it reads as one host
// to some and as the network to others.
func Parse(cidrs []string) (Denied, error) {
	d := make(Denied, 0, len(cidrs))
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q is not a network in CIDR notation (10.0.0.0/8, fd00::/8): %w", s, err)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("%q has host bits set: write the network, %s", s, p.Masked())
		}
		d = append(d, p)
	}
	return d, nil
}

// RefusedError is a connection not made because its address is in a
// denied network.
type RefusedError struct {
	Addr    netip.Addr
	Network netip.Prefix
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("address %s is in %s, a network the manager does not connect to for a tenant", e.Addr, e.Network)
}

// Check is a *RefusedError if addr is in a denied network. An IPv4 address
// written as IPv6 (::ffff:127.0.0.1) is checked as the IPv4 address it
// reaches, and a zone (fe80::1%eth0) is not a way around a network.
func (d Denied) Check(addr netip.Addr) error {
	a := addr.Unmap().WithZone("")
	for _, p := range d {
		if p.Contains(a) {
			return &RefusedError{Addr: a, Network: p}
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
