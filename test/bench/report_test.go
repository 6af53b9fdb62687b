package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBench(t *testing.T) {
	out := `goos: linux
BenchmarkKubeletServing/rego-2         	    3366	    365251 ns/op	      1194 p99-µs	   61346 B/op	    1165 allocs/op
BenchmarkKubeletServing/ratio-2        	1000000000	         0.5518 ns/op	         3.994 rego/go	       0 B/op	       0 allocs/op
BenchmarkDataSystemLogTestTestOtherInputsAreLeftAlone	   80653	     16859 ns/op	     13588 timer_rego_query_eval_ns/op	    5726 B/op	     116 allocs/op
PASS
`
	lines := ParseBench(out)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(lines), lines)
	}
	if lines[0].Name != "BenchmarkKubeletServing/rego" || lines[0].Metrics["p99-µs"] != 1194 || lines[0].Metrics["allocs/op"] != 1165 {
		t.Errorf("first line %+v", lines[0])
	}
	if lines[1].Metrics["rego/go"] != 3.994 {
		t.Errorf("ratio line %+v", lines[1])
	}
	if g := PolicyGroups(lines); len(g) != 1 || g[0].Package != "system.log" || g[0].MedianNs != 16859 {
		t.Errorf("policy groups %+v", g)
	}
}

func TestUpdateDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "performance.md")
	prose := "# Performance\n\nWritten by a person.\n\n" + docBegin + "\nold figures\n" + docEnd + "\n\nMore prose.\n"
	if err := os.WriteFile(path, []byte(prose), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := UpdateDoc(path, "new figures\n"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	if strings.Contains(got, "old figures") || !strings.Contains(got, "new figures") ||
		!strings.HasPrefix(got, "# Performance\n\nWritten by a person.") || !strings.HasSuffix(got, "More prose.\n") {
		t.Errorf("doc after update:\n%s", got)
	}
}

func TestGoalAtMost(t *testing.T) {
	if got := goalAtMost(150, 200, " µs"); got != "met" {
		t.Errorf("150 against 200: %q", got)
	}
	if got := goalAtMost(300, 200, " µs"); got != "**missed** by 100 µs (1.5x the goal)" {
		t.Errorf("300 against 200: %q", got)
	}
}

func TestPruneRuns(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ichor-bench-20260101-000000-1", "ichor-bench-20260102-000000-2", "ichor-bench-20260103-000000-3", "other"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	pruneRuns(dir, 2)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != "ichor-bench-20260102-000000-2 ichor-bench-20260103-000000-3 other" {
		t.Errorf("left %v", left)
	}
}
