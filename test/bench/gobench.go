package bench

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// BenchLine is one result line of `go test -bench` (or of `opa test --bench
// --format gobench`): the benchmark's name without the -GOMAXPROCS suffix,
// its iterations and its metrics by unit (ns/op, B/op, p99-µs, ...).
type BenchLine struct {
	Name       string
	Iterations int64
	Metrics    map[string]float64
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// ParseBench reads the result lines of benchmark output; other lines are
// skipped.
func ParseBench(text string) []BenchLine {
	var out []BenchLine
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		b := BenchLine{Name: procsSuffix.ReplaceAllString(fields[0], ""), Iterations: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			b.Metrics[fields[i+1]] = v
		}
		out = append(out, b)
	}
	return out
}

// ParseBenchFile is ParseBench of a file.
func ParseBenchFile(path string) ([]BenchLine, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("benchmark output: %w", err)
	}
	return ParseBench(string(data)), nil
}

// PolicyGroup is the `opa test --bench` results of one package's tests.
type PolicyGroup struct {
	Package         string
	Tests           int
	MedianNs, MaxNs float64
	MedianAllocs    float64
}

// opaPackages are the name prefixes opa gives the tests of each package.
var opaPackages = []struct{ prefix, name string }{
	{"BenchmarkDataIchorKubeletServing", "ichor.kubelet_serving"},
	{"BenchmarkDataIchorKubeletClient", "ichor.kubelet_client"},
	{"BenchmarkDataIchorCredentials", "ichor.credentials"},
	{"BenchmarkDataIchorRbac", "ichor.rbac"},
	{"BenchmarkDataSystemLog", "system.log"},
}

// PolicyGroups groups the `opa test --bench` lines by package.
func PolicyGroups(lines []BenchLine) []PolicyGroup {
	var out []PolicyGroup
	for _, p := range opaPackages {
		var ns, allocs []float64
		for _, l := range lines {
			if strings.HasPrefix(l.Name, p.prefix) {
				ns = append(ns, l.Metrics["ns/op"])
				allocs = append(allocs, l.Metrics["allocs/op"])
			}
		}
		if len(ns) == 0 {
			continue
		}
		slices.Sort(ns)
		slices.Sort(allocs)
		out = append(out, PolicyGroup{Package: p.name, Tests: len(ns), MedianNs: ns[len(ns)/2], MaxNs: ns[len(ns)-1], MedianAllocs: allocs[len(allocs)/2]})
	}
	return out
}
