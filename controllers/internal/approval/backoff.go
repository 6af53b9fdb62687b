package approval

import "time"

// Backoff is a wait that doubles with each attempt, from Initial up to Max.
//
// It is a function of the attempts, not a stateful stepper like
// apimachinery's wait.Backoff or a workqueue rate limiter: the attempts are
// kept in a Memo beside the verdict they belong to, and forgotten with it, so
// that a second count kept by a limiter cannot disagree with the memo.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// OnChangeOnly is the wait of a verdict looked at again only when something
// it was reached on changes (Memo.Pending): no timer.
func OnChangeOnly(int) time.Duration { return 0 }

// After is the wait after attempts earlier attempts: Initial after none,
// doubled for each, never above Max.
func (b Backoff) After(attempts int) time.Duration {
	wait := b.Initial
	for i := 0; i < attempts && wait < b.Max; i++ {
		wait *= 2
	}
	return min(wait, b.Max)
}
