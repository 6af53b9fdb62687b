// Package netguardtest is what the tests of a guarded connection share: a
// listener that counts what reached it.
package netguardtest

import (
	"net"
	"sync/atomic"
	"testing"
)

// Listener accepts connections on the loopback, counts them and closes
// them: what a server the manager must not reach would have seen. It is
// closed when the test ends.
func Listener(t testing.TB) (addr string, accepted *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on the loopback: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	accepted = &atomic.Int32{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	return l.Addr().String(), accepted
}
