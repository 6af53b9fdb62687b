package netguard_test

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/netguard/netguardtest"
)

func TestTheDefaultDeniesTheHostAndItsLinkOnly(t *testing.T) {
	d := netguard.Default()
	for _, s := range []string{
		"127.0.0.1", "127.1.2.3", "::1",
		"::ffff:127.0.0.1", // IPv4 written as IPv6
		"169.254.169.254", "fe80::1", "fe80::1%eth0", "fd00:ec2::254", "fd20:ce::254", "100.100.100.200", "168.63.129.16",
		"64:ff9b::a9fe:a9fe", // 169.254.169.254 through NAT64
		"0.0.0.0", "::", "224.0.0.1", "ff02::1",
	} {
		var refused *netguard.RefusedError
		require.ErrorAs(t, d.Check(netip.MustParseAddr(s)), &refused, s)
		assert.Equal(t, netip.MustParseAddr(s).Unmap().WithZone(""), refused.Addr, s)
		assert.Contains(t, refused.Error(), "address "+refused.Addr.String()+" is in "+refused.Network.String()+", a network the manager does not connect to: nothing was sent to it")
	}
	for _, s := range []string{"10.0.0.1", "192.168.1.10", "8.8.8.8", "2001:db8::1", "fd00:ec2::253", "::ffff:10.0.0.1", "169.255.0.1"} {
		assert.NoError(t, d.Check(netip.MustParseAddr(s)), s)
	}
	assert.NoError(t, netguard.Denied(nil).Check(netip.MustParseAddr("127.0.0.1")), "the zero value denies nothing")
}

func TestParseRefusesWhatIsNotANetwork(t *testing.T) {
	for _, s := range []string{"10.0.0.0", "10.0.0.0/33", "ten", "", "10.1.2.3/8", "fe80::1/10", "::ffff:10.0.0.0/104", "Default"} {
		_, err := netguard.Parse([]string{"127.0.0.0/8", s})
		assert.Error(t, err, s)
	}
	d, err := netguard.Parse([]string{" 10.0.0.0/8", "fd00::/8 "})
	require.NoError(t, err)
	assert.Error(t, d.Check(netip.MustParseAddr("10.9.9.9")))
	assert.Error(t, d.Check(netip.MustParseAddr("::ffff:10.9.9.9")), "an IPv4 network denies its addresses written as IPv6")
	assert.Error(t, d.Check(netip.MustParseAddr("fd12::1")))
	assert.NoError(t, d.Check(netip.MustParseAddr("127.0.0.1")), "a list without the keyword replaces the default")

	// The keyword adds the default networks to the operator's.
	d, err = netguard.Parse([]string{"default", "10.96.0.0/12"})
	require.NoError(t, err)
	assert.Error(t, d.Check(netip.MustParseAddr("127.0.0.1")))
	assert.Error(t, d.Check(netip.MustParseAddr("10.96.0.1")))
	assert.Equal(t, netguard.Default(), d[:len(d)-1])

	d, err = netguard.Parse(nil)
	require.NoError(t, err)
	assert.Empty(t, d)
}

// A dialer with Control connects to nothing in a denied network, whether it
// is named by address or by a name that resolves into it.
func TestADeniedAddressIsNeverConnectedTo(t *testing.T) {
	addr, accepted := netguardtest.Listener(t)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)

	denied := &net.Dialer{Timeout: 5 * time.Second, Control: netguard.Default().Control}
	for _, host := range []string{"127.0.0.1", "localhost", "::ffff:127.0.0.1"} {
		_, err := denied.DialContext(t.Context(), "tcp", net.JoinHostPort(host, port))
		var refused *netguard.RefusedError
		require.ErrorAs(t, err, &refused, host)
	}
	// The same listener, reached without the guard: the refusals above
	// were the guard's, and had they connected the count would show it.
	allowed := &net.Dialer{Timeout: 5 * time.Second, Control: netguard.Denied{}.Control}
	c, err := allowed.DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	_ = c.Close()
	require.Eventually(t, func() bool { return accepted.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, int32(1), accepted.Load(), "a refused address was connected to")
}

func TestControlRefusesAnAddressItCannotRead(t *testing.T) {
	err := netguard.Default().Control("unix", "/run/socket", nil)
	require.Error(t, err)
	var refused *netguard.RefusedError
	assert.False(t, errors.As(err, &refused))
	require.ErrorAs(t, netguard.Default().Control("tcp6", "[fe80::1%eth0]:443", nil), &refused, "a zone is no way around a network")
	assert.NoError(t, netguard.Default().Control("tcp4", "10.0.0.1:443", nil))
}
