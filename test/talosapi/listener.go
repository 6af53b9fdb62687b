package talosapi

import (
	"net"
	"sync"
)

// mode is how the node answers new connections.
type mode int

const (
	serving  mode = iota
	refusing      // the node is down or firewalled with a reject: connections close at once
	hanging       // the node is black-holed: TCP accepts, TLS never starts
)

// gatedListener lets the test flip the node between reachable and unreachable
// without giving up the port, so the endpoint stays the same across an outage
// and no other process can take the port meanwhile.
type gatedListener struct {
	net.Listener

	mu     sync.Mutex
	mode   mode
	live   map[*trackedConn]struct{}
	held   []net.Conn
	closed bool
	// draining keeps the connections served when the listener closes:
	// gRPC's graceful stop answers their calls, then closes them itself.
	draining bool
	// accepted counts every connection accepted, in any mode.
	accepted int
}

func newGatedListener(inner net.Listener) *gatedListener {
	return &gatedListener{Listener: inner, live: map[*trackedConn]struct{}{}}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}

		l.mu.Lock()
		l.accepted++

		switch {
		case l.closed || l.mode == refusing:
			l.mu.Unlock()

			conn.Close() //nolint:errcheck // refusing on purpose; nothing to report

			continue
		case l.mode == hanging:
			l.held = append(l.held, conn)
			l.mu.Unlock()

			continue
		}

		tracked := &trackedConn{Conn: conn, l: l}
		l.live[tracked] = struct{}{}
		l.mu.Unlock()

		return tracked, nil
	}
}

// acceptedConns is how many connections reached the node, refused, held or
// served.
func (l *gatedListener) acceptedConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.accepted
}

// heldConns is how many connections the node holds unanswered (hanging).
func (l *gatedListener) heldConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()

	return len(l.held)
}

// setMode switches the mode and drops every connection made under the old one,
// so clients that already had a connection see the outage too.
func (l *gatedListener) setMode(m mode) {
	l.mu.Lock()
	defer l.mu.Unlock()

	if l.mode == m {
		return
	}

	l.mode = m
	l.dropLocked()
}

func (l *gatedListener) Close() error {
	l.mu.Lock()
	l.closed = true
	if l.draining {
		l.dropHeldLocked()
	} else {
		l.dropLocked()
	}
	l.mu.Unlock()

	return l.Listener.Close()
}

// drain makes Close leave the connections served to gRPC.
func (l *gatedListener) drain() {
	l.mu.Lock()
	defer l.mu.Unlock()

	l.draining = true
}

func (l *gatedListener) dropLocked() {
	for c := range l.live {
		c.Conn.Close() //nolint:errcheck // tearing down; the peer sees the reset
	}

	clear(l.live)
	l.dropHeldLocked()
}

// dropHeldLocked closes the connections held unanswered (hanging).
func (l *gatedListener) dropHeldLocked() {
	for _, c := range l.held {
		c.Close() //nolint:errcheck // tearing down; the peer sees the reset
	}

	l.held = nil
}

type trackedConn struct {
	net.Conn

	l *gatedListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.live, c)
	c.l.mu.Unlock()

	return c.Conn.Close()
}
