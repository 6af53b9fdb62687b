package chart

import (
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/memlimit"
)

// TestTheChartsSoftMemoryLimitFitsItsContainer: the manager lowers a
// GOMEMLIMIT above its container's memory limit less the binary's pages,
// with a WARNING at every start (internal/memlimit); the chart's defaults,
// and testdata/values-all.yaml's, must not be (review 222 F5). Its control:
// the defaults' soft limit in a 256Mi container is lowered.
func TestTheChartsSoftMemoryLimitFitsItsContainer(t *testing.T) {
	for name, flags := range map[string][]string{
		"defaults":        nil,
		"values-all.yaml": {"-f", filepath.Join(chartDir(t), "testdata", "values-all.yaml")},
	} {
		t.Run(name, func(t *testing.T) {
			limit, soft := managerMemory(t, renderWith(t, flags))
			assert.LessOrEqual(t, soft, memlimit.Target(limit), "GOMEMLIMIT %d in a container of %d", soft, limit)
		})
	}
	limit, soft := managerMemory(t, render(t, "manager.resources.limits.memory=256Mi"))
	assert.Greater(t, soft, memlimit.Target(limit), "the check has teeth")
}

// managerMemory is the manager container's memory limit and GOMEMLIMIT, in
// bytes.
func managerMemory(t *testing.T, o objects) (limit, soft int64) {
	t.Helper()
	for _, c := range o.deployment(t).Spec.Template.Spec.Containers {
		if c.Name != "manager" {
			continue
		}
		mem, ok := c.Resources.Limits["memory"]
		require.True(t, ok, "the manager has a memory limit")
		for _, e := range c.Env {
			if e.Name == "GOMEMLIMIT" {
				return mem.Value(), goMemLimit(t, e.Value)
			}
		}
		t.Fatal("the manager has no GOMEMLIMIT")
	}
	t.Fatal("no container named manager")
	return 0, 0
}

// goMemLimit reads GOMEMLIMIT as the Go runtime does: bytes, or a number
// with one of the units B, KiB, MiB, GiB and TiB.
func goMemLimit(t *testing.T, s string) int64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`).FindStringSubmatch(s)
	require.NotNil(t, m, "GOMEMLIMIT %q", s)
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	shift := map[string]uint{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
	return n << shift
}
