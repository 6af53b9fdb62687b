package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// interruptGrace is how long a command other than the manager has to stop
// once interrupted, before the process ends without it: some waits watch no
// context (a FIFO's open, a terminal's read, client libraries' discovery
// against a server that accepted the connection and never answers), and a
// person who pressed Ctrl-C expects the prompt back, as kubectl gives it.
const interruptGrace = 2 * time.Second

// stopsGracefully is the annotation of a command that is given all the time
// it takes to stop once interrupted (the manager: its decision log is
// flushed, its shards released); a second signal still ends it at once.
const stopsGracefully = "ichor.dev/stops-gracefully"

// Main runs the command line args as RunAs does, with the process's
// SIGINT and SIGTERM: the first cancels the command's context; a second
// ends the command at once, and so does interruptGrace after the first
// unless the command stops gracefully. The status of a command left so is
// 128 plus the signal's number, as a shell reports a process the signal
// ended. (The signals stay caught: one left to its default while the
// process ignored it at start, as a shell's background job does SIGINT,
// would be ignored.)
func Main(argv0 string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- RunAs(ctx, argv0, args, stdin, stdout, stderr) }()

	var sig os.Signal
	select {
	case code := <-done:
		return code
	case sig = <-signals:
	}
	cancel()
	var grace <-chan time.Time
	if !gracefulStop(args) {
		grace = time.After(interruptGrace)
		// Not for the manager, whose standard error is its JSON log.
		fmt.Fprintf(stderr, "ichor: interrupted (%s): stopping; again to stop at once\n", sig)
	}
	select {
	case code := <-done:
		return code
	case <-grace:
		fmt.Fprintf(stderr, "ichor: interrupted (%s): the command did not stop within %s\n", sig, interruptGrace)
		return interruptedStatus(sig)
	case sig = <-signals:
		fmt.Fprintf(stderr, "ichor: interrupted again (%s): stopped at once\n", sig)
		return interruptedStatus(sig)
	}
}

// interruptedStatus is a shell's status of a process the signal ended.
func interruptedStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return ExitError
}

// gracefulStop reports whether the command args name stops gracefully.
func gracefulStop(args []string) bool {
	c, _, err := newRootWith(newStreams(nil, io.Discard, io.Discard)).Find(args)
	return err == nil && c.Annotations[stopsGracefully] == "true"
}
