package bench_test

import (
	"syscall"
	"testing"
	"time"
)

// cpuMeter reads the process's CPU time (user and system, every thread: the
// garbage collector and the engine's own goroutines included) around a
// benchmark's loop. On a loaded machine the wall time per operation mostly
// measures the wait for a core; the CPU time per operation is what the work
// costs.
type cpuMeter struct{ start time.Duration }

func startCPU() cpuMeter { return cpuMeter{start: cpuTime()} }

// report adds cpu-ns/op, the CPU time per operation since startCPU.
func (m cpuMeter) report(b *testing.B) {
	if b.N > 0 {
		b.ReportMetric(float64(cpuTime()-m.start)/float64(b.N), "cpu-ns/op")
	}
}

func cpuTime() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
