package approval

import (
	"context"
	"time"
)

// FinishGrace bounds how long a verdict write begun before the manager was
// told to stop may go on after it: within the manager's graceful shutdown
// (30 s) and the pod's termination grace period, with the decision log's
// flush after it.
const FinishGrace = 10 * time.Second

// stoppedKey carries, on a Finishing context, the Done channel of the
// context it outlives.
type stoppedKey struct{}

// Finishing returns the context of a verdict write begun while ctx was live,
// which ctx's end does not cut short for grace: a leader told to stop
// finishes the write and makes its record before it lets the leader Lease go
// (nobody else records a verdict of its own, and a write cut short that the
// API server applied would be in effect without its record), but does not
// wait past its own shutdown deadline on a slow API server. A write on it
// that conflicts after ctx ended reads the request once more (the conflict
// may be this very write, applied by an earlier try) and is not made again:
// another leader may be deciding the request by now.
func Finishing(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), stoppedKey{}, ctx.Done()))
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-out.Done():
		}
	})
	return out, func() {
		stopGrace()
		cancel()
	}
}

// stopping reports whether ctx is a Finishing context whose parent ended.
func stopping(ctx context.Context) bool {
	done, _ := ctx.Value(stoppedKey{}).(<-chan struct{})
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}
