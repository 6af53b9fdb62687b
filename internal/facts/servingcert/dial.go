package servingcert

import (
	"context"
	"net"
)

type dialKey struct{}

// WithDial is ctx carrying dial, which a Reader without its own Dial uses.
// It is the seam through which a test of a whole command (cli.Run) maps the
// nodes' addresses to local listeners, as /etc/hosts would; a program never
// sets it.
func WithDial(ctx context.Context, dial func(ctx context.Context, network, address string) (net.Conn, error)) context.Context {
	return context.WithValue(ctx, dialKey{}, dial)
}

func dialFrom(ctx context.Context) func(ctx context.Context, network, address string) (net.Conn, error) {
	dial, _ := ctx.Value(dialKey{}).(func(ctx context.Context, network, address string) (net.Conn, error))
	return dial
}
