package engine

// OPA's evaluator recurses deeply (a continuation for every expression it
// evaluates), and a credential admission's decision, its decision-log mask
// included, takes between 256 and 512 KiB of stack. A goroutine starts with
// a few KiB, and each time its stack is full the runtime doubles it and
// copies it, adjusting every frame: with OPA's thousands of frames, an
// admission decision in a new goroutine (the webhook server's for each
// request) took about 40% more CPU than in a grown one
// (BenchmarkAdmissionStack in test/bench), and the copies were 8 to 11% of
// the manager's CPU for admissions. Grown first, the stack is doubled as
// often, but while it holds a few large frames that are cheap to copy.
const (
	// admissionStack is how much stack GrowStack takes: the runtime then
	// makes the stack 512 KiB, the power of two above it and the frames
	// below.
	admissionStack = 256 << 10
	// stackFrame is one call's frame in growStack: a local of more than
	// 128 KiB would be moved to the heap by the compiler, and grow nothing.
	stackFrame = 32 << 10
)

// GrowStack makes the calling goroutine's stack large enough for an
// admission decision. A handler whose goroutine is new for each request
// calls it just before the decision; on a stack already that large it costs
// the zeroing of 256 KiB (about 2.5 µs).
func GrowStack() {
	growStack(admissionStack / stackFrame)
}

// stackIndex is always 0. Reading frame[stackIndex] keeps each frame, which
// the compiler would drop if it were never read.
var stackIndex int

//go:noinline
func growStack(frames int) byte {
	var frame [stackFrame]byte
	if frames > 1 {
		frame[stackIndex] = growStack(frames - 1)
	}
	return frame[stackIndex]
}
