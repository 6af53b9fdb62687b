package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

// cgroups lays out a cgroup mount and a /proc/self/cgroup in a test's
// directory: files maps a path under the mount to its content.
func cgroups(t *testing.T, self string, files map[string]string) {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, "fs", name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o750))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "fs"), 0o750))
	list := filepath.Join(dir, "cgroup")
	require.NoError(t, os.WriteFile(list, []byte(self), 0o600))
	root, proc := cgroupRoot, procCgroup
	cgroupRoot, procCgroup = filepath.Join(dir, "fs"), list
	t.Cleanup(func() { cgroupRoot, procCgroup = root, proc })
}

// The layouts a manager meets: cgroup v2 with its own namespace (the path is
// /) or without (its path under the mount), v1 (this machine's: the whole
// hierarchy mounted, and a v2 line beside it with no memory.max), and v1
// with the container's cgroup mounted at the root while /proc/self/cgroup
// names the host's path.
func TestTheContainersMemoryLimitIsReadWhereverItsCgroupIs(t *testing.T) {
	for _, c := range []struct {
		name  string
		self  string
		files map[string]string
		want  int64
	}{
		{"v2, own namespace", "0::/\n", map[string]string{"memory.max": "536870912\n"}, 512 * mib},
		{"v2, no limit", "0::/\n", map[string]string{"memory.max": "max\n"}, 0},
		{"v2, the process's cgroup under the mount", "0::/kubepods/pod1/c1\n",
			map[string]string{"memory.max": "max\n", "kubepods/pod1/c1/memory.max": "268435456\n"}, 256 * mib},
		{"v1 beside an empty v2 line", "12:memory:/process_api/abc\n1:cpu:/\n0::/\n",
			map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/process_api/abc/memory.limit_in_bytes": "1073741824\n"}, 1024 * mib},
		{"v1, the host's path, the container's cgroup at the mount's root", "4:cpu,memory:/kubepods/pod1/c1\n",
			map[string]string{"memory/memory.limit_in_bytes": "536870912\n"}, 512 * mib},
		{"v1, no limit", "4:memory:/\n", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cgroups(t, c.self, c.files)
			got, err := ContainerLimit()
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

// What is not a limit is an error naming the file, and nothing is guessed:
// the manager then keeps GOMEMLIMIT as it was set.
func TestWhatIsNotAMemoryLimitIsAnError(t *testing.T) {
	for _, c := range []struct {
		name, self string
		files      map[string]string
		want       string
	}{
		{"no memory cgroup", "3:cpu:/\n", nil, "the process is in no memory cgroup"},
		{"no limit file", "0::/\n", nil, "memory.max"},
		{"not a number", "0::/\n", map[string]string{"memory.max": "512Mi\n"}, "memory.max: not a limit in bytes"},
		{"zero", "0::/\n", map[string]string{"memory.max": "0\n"}, "0 is not a limit"},
		{"larger than a limit file is", "0::/\n", map[string]string{"memory.max": string(make([]byte, 100))}, "larger than 64 bytes"},
		{"a relative path", "0::kubepods\n", map[string]string{"memory.max": "1\n"}, "the process is in no memory cgroup"},
		// Outside its namespace: "/sys/fs/cgroup/../x" is not a cgroup's file.
		{"a path out of the mount", "0::/../x\n", map[string]string{"../x/memory.max": "1\n"}, "the process is in no memory cgroup"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cgroups(t, c.self, c.files)
			got, err := ContainerLimit()
			require.ErrorContains(t, err, c.want)
			assert.Zero(t, got)
		})
	}
}

// A soft limit above the container's limit less Reserve is lowered to it (to
// half the limit for a container smaller than twice Reserve); one below it,
// none (GOMEMLIMIT unset) and a container without a limit are left alone.
func TestASoftLimitAboveTheContainersIsLowered(t *testing.T) {
	saved := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(saved) })

	for _, c := range []struct {
		name            string
		soft, container int64
		want            int64
	}{
		{"the chart's defaults", 420 * mib, 512 * mib, 420 * mib},
		{"the container's limit lowered, the soft limit left", 420 * mib, 256 * mib, 166 * mib},
		{"equal to the container's", 512 * mib, 512 * mib, 422 * mib},
		{"a small container", 420 * mib, 128 * mib, 64 * mib},
		{"no soft limit", math.MaxInt64, 256 * mib, math.MaxInt64},
		{"no container limit", 420 * mib, 0, 420 * mib},
	} {
		t.Run(c.name, func(t *testing.T) {
			debug.SetMemoryLimit(c.soft)
			fit := Apply(c.container)
			assert.Equal(t, c.want, debug.SetMemoryLimit(-1), "the runtime's soft limit")
			assert.Equal(t, Fit{Container: c.container, Before: c.soft, After: c.want}, fit)
			assert.Equal(t, c.want < c.soft, fit.Lowered())
		})
	}
}
