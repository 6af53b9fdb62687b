// Package memlimit keeps the Go runtime's soft memory limit (GOMEMLIMIT)
// below the container's memory limit.
//
// The chart sets both (manager.goMemLimit and resources.limits.memory) and
// cannot compare them: Helm has no arithmetic on quantities. A soft limit at
// or above the container's never acts, since the kernel kills the pod before
// the collector works harder, and the container's limit also counts the
// binary's resident pages, which the soft limit does not. An operator who
// lowers the container's limit and leaves the soft limit as it was gets
// OOM kills where the soft limit was meant to trade CPU for memory; the
// manager lowers the soft limit at its start and says so.
package memlimit

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/ichor-dev/ichor-policy/internal/smallfile"
)

// Reserve is what the container's limit counts besides the Go runtime's
// memory, the binary's resident pages (67 to 96 MiB measured:
// docs/performance.md, "Growth and memory"), as docs/install.md's rule for
// goMemLimit has it: the limit less 90 MiB.
const Reserve int64 = 90 << 20

// Fit is what Apply found and did, in bytes: the container's limit (0 for
// none), and the runtime's soft limit before and after (math.MaxInt64 for
// none).
type Fit struct {
	Container, Before, After int64
}

// Lowered says whether Apply lowered the soft limit.
func (f Fit) Lowered() bool { return f.After < f.Before }

// Target is the highest soft limit that fits a container limit: the limit
// less Reserve, but never below half the limit, so that a small container
// is not left a soft limit the heap always exceeds (the collector would run
// without pause). 0 for no container limit.
func Target(container int64) int64 {
	if container <= 0 {
		return 0
	}
	return max(container-Reserve, container/2)
}

// Apply lowers the runtime's soft limit to Target(container) when one was
// set above it; a process without a soft limit (GOMEMLIMIT unset: the
// operator's choice, the chart's goMemLimit empty) or without a container
// limit is left as it is.
func Apply(container int64) Fit {
	before := debug.SetMemoryLimit(-1)
	fit := Fit{Container: container, Before: before, After: before}
	if target := Target(container); target > 0 && before != math.MaxInt64 && before > target {
		debug.SetMemoryLimit(target)
		fit.After = target
	}
	return fit
}

// cgroupRoot is where the cgroup file systems are mounted; a test's
// directory in tests.
var cgroupRoot = "/sys/fs/cgroup"

// procCgroup lists the process's cgroups; a test's file in tests.
var procCgroup = "/proc/self/cgroup"

// unlimited is the least value cgroup v1 reports for no limit (the largest
// multiple of the page size below 2^63); anything this high is no limit.
const unlimited = 1 << 62

// ContainerLimit is the memory limit of the process's cgroup (cgroup v2's
// memory.max, else v1's memory.limit_in_bytes), 0 when it has none. The
// cgroup's path comes from /proc/self/cgroup, so a process that sees the
// whole hierarchy reads its own cgroup's limit, not the root's; a container
// whose cgroup is mounted at the root while /proc/self/cgroup names the
// host's path (cgroup v1 without a cgroup namespace) reads the mount's root.
func ContainerLimit() (int64, error) {
	list, err := smallfile.Read(procCgroup, 64<<10)
	if err != nil {
		return 0, fmt.Errorf("read the process's cgroups: %w", err)
	}
	v2, v1 := cgroupPaths(list)
	var files []string
	if v2 != "" {
		files = append(files, path.Join(cgroupRoot, v2, "memory.max"), path.Join(cgroupRoot, "memory.max"))
	}
	if v1 != "" {
		files = append(files, path.Join(cgroupRoot, "memory", v1, "memory.limit_in_bytes"), path.Join(cgroupRoot, "memory", "memory.limit_in_bytes"))
	}
	if len(files) == 0 {
		return 0, errors.New("the process is in no memory cgroup")
	}
	var errs []error
	for _, f := range slices.Compact(files) {
		limit, err := readLimit(f)
		if err == nil {
			return limit, nil
		}
		errs = append(errs, err)
	}
	return 0, fmt.Errorf("no memory limit could be read: %w", errors.Join(errs...))
}

// cgroupPaths are the process's cgroup v2 path and its v1 memory
// controller's path, each "" when /proc/self/cgroup lists none. Each line is
// hierarchy-ID:controllers:path; v2's has ID 0 and no controllers. Only the
// process's own cgroup is read, not its ancestors': a limit set on the pod
// alone (no container limit) is not seen, and GOMEMLIMIT is then kept as it
// was set, as it was before this package; the chart sets a container limit.
func cgroupPaths(list []byte) (v2, v1 string) {
	for line := range bytes.Lines(list) {
		fields := strings.SplitN(strings.TrimSpace(string(line)), ":", 3)
		// A cgroup outside the process's cgroup namespace is named through
		// "..": joined to the mount, it would name a file outside it.
		if len(fields) != 3 || !strings.HasPrefix(fields[2], "/") || slices.Contains(strings.Split(fields[2], "/"), "..") {
			continue
		}
		switch {
		case fields[0] == "0" && fields[1] == "":
			v2 = fields[2]
		case strings.Contains(","+fields[1]+",", ",memory,"):
			v1 = fields[2]
		}
	}
	return v2, v1
}

// readLimit reads a cgroup memory limit: bytes, or "max" (v2) or a value of
// 2^62 or more (v1) for none, which is 0.
func readLimit(p string) (int64, error) {
	data, err := smallfile.Read(p, 64)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0, nil
	}
	limit, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: not a limit in bytes", p)
	case limit <= 0:
		return 0, fmt.Errorf("%s: %d is not a limit", p, limit)
	case limit >= unlimited:
		return 0, nil
	}
	return limit, nil
}
