package bench

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// MachineInfo is the machine the figures came from.
type MachineInfo struct {
	CPUs      int
	CPUModel  string
	MemTotal  uint64
	GoVersion string
	Kernel    string
	// LoadAverage is /proc/loadavg's first three fields when the run
	// started: other work on the machine skews the figures.
	LoadAverage string
}

// Describe describes this machine: nproc, the CPU model from /proc/cpuinfo,
// MemTotal from /proc/meminfo, the Go version and the kernel.
func Describe() MachineInfo {
	m := MachineInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if status, err := meminfo(); err == nil {
		m.MemTotal = status
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			m.LoadAverage = strings.Join(f[:3], " ")
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	return m
}

func meminfo() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb uint64
		if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); n == 1 {
			return kb * 1024, nil
		}
	}
	return 0, sc.Err()
}
