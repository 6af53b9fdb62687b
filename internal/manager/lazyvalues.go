package manager

import (
	"slices"

	"github.com/go-logr/logr"
)

// lazyValues is a log sink that keeps the values a logger is given
// (WithValues) and hands them to the sink beneath only with a line that is
// written. zap encodes a logger's values as they are given, into a clone of
// its encoder: each approval's three loggers (the requester's, the
// request's, the verdict's) paid that every time, up to 3% of the manager's
// CPU in a burst (1.6% on average), though the sampler drops most of the
// lines they were made for. A line carries the same fields in the same
// order as zap's own With gives it (a Kubernetes object among them is
// shortened to its kind and name, as controller-runtime's encoder shortens
// a line's own; given to With, it was written whole). The values are read
// when a line is written, not when they are given, so what a logger is
// given must not change afterwards: the project passes strings, values and
// slices made for the call.
type lazyValues struct {
	sink   logr.LogSink
	values []any
}

// withLazyValues is logger with its values kept until a line is written.
func withLazyValues(logger logr.Logger) logr.Logger {
	sink := logger.GetSink()
	if sink == nil {
		return logger
	}
	// The sink was set up (Init) for the logr.Logger calling it; this sink
	// is one more frame between them, which a sink that names the caller
	// must skip.
	if cd, ok := sink.(logr.CallDepthLogSink); ok {
		sink = cd.WithCallDepth(1)
	}
	return logr.New(&lazyValues{sink: sink})
}

// Init does nothing: the sink beneath was set up by the logger it came from.
func (l *lazyValues) Init(logr.RuntimeInfo) {}

func (l *lazyValues) Enabled(level int) bool { return l.sink.Enabled(level) }

func (l *lazyValues) Info(level int, msg string, keysAndValues ...any) {
	l.sink.Info(level, msg, l.with(keysAndValues)...)
}

func (l *lazyValues) Error(err error, msg string, keysAndValues ...any) {
	l.sink.Error(err, msg, l.with(keysAndValues)...)
}

// with is the logger's values followed by a line's own, in a new slice: the
// logger's are shared with every logger made from it.
func (l *lazyValues) with(keysAndValues []any) []any {
	if len(l.values) == 0 {
		return keysAndValues
	}
	return append(slices.Clip(l.values), keysAndValues...)
}

func (l *lazyValues) WithValues(keysAndValues ...any) logr.LogSink {
	if !wellFormed(keysAndValues) {
		// The sink beneath says what is wrong with them and keeps what it
		// can, as it would have.
		return &lazyValues{sink: l.sink.WithValues(l.values...).WithValues(keysAndValues...)}
	}
	return &lazyValues{sink: l.sink, values: append(slices.Clip(l.values), keysAndValues...)}
}

// wellFormed: pairs of a string key and a value. Kept as they are, others
// would be read with a line's own, which a pair broken off would shift.
func wellFormed(keysAndValues []any) bool {
	if len(keysAndValues)%2 != 0 {
		return false
	}
	for i := 0; i < len(keysAndValues); i += 2 {
		if _, ok := keysAndValues[i].(string); !ok {
			return false
		}
	}
	return true
}

func (l *lazyValues) WithName(name string) logr.LogSink {
	return &lazyValues{sink: l.sink.WithName(name), values: l.values}
}

func (l *lazyValues) WithCallDepth(depth int) logr.LogSink {
	cd, ok := l.sink.(logr.CallDepthLogSink)
	if !ok {
		return l
	}
	return &lazyValues{sink: cd.WithCallDepth(depth), values: l.values}
}
