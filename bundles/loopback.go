package bundles

import (
	"net"
	"strings"
)

// OnLoopback reports whether a host[:port] is this host's loopback:
// localhost, or a loopback address. A credential goes over plain http only
// there (a registry's, the decision-log service's token).
func OnLoopback(hostPort string) bool {
	host := hostPort
	if h, _, err := net.SplitHostPort(hostPort); err == nil {
		host = h
	} else {
		// A bracketed IPv6 address without a port: [::1].
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
