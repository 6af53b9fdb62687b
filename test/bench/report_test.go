package bench

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

func TestAThroughputJustShortOfTheGoalIsMissedByWhatItLacks(t *testing.T) {
	for ratio, want := range map[float64]string{
		0.80:   "met",
		0.85:   "met",
		0.7956: "**missed** by 0.4 points",
		0.5:    "**missed** by 30.0 points",
	} {
		if got := throughputVerdict(ratio); got != want {
			t.Errorf("%v of the rubber stamp: %q, want %q", ratio, got, want)
		}
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

// fakeRun is a run of n requests approved at perSecond, the last one's
// latency p99, the controller's CPU cpu per request.
func fakeRun(v Variant, n, k int, perSecond float64, p99, cpu time.Duration) Result {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	o := Outcome{N: n, First: start, LastApproved: start.Add(time.Duration(float64(n) / perSecond * float64(time.Second)))}
	for i := range n {
		o.Latencies = append(o.Latencies, p99*time.Duration(i)/time.Duration(n))
	}
	o.Latencies[n-1] = p99
	return Result{Variant: v, Machines: n, Clusters: k, Outcome: o, CPU: cpu * time.Duration(n)}
}

func TestSpreadReport(t *testing.T) {
	rubber := Variant{Name: "rubberstamp", Mode: "rubberstamp", Workers: 4}
	shipped := Variant{Name: "ichor-shipped", Mode: "cli", Ichor: true}
	const n = 100
	for _, tc := range []struct {
		name string
		// the shipped manager over ten clusters
		perSecond float64
		p99, cpu  time.Duration
		verdict   string
	}{
		{"holds", 190, 3200 * time.Millisecond, 2800 * time.Microsecond, "| holds |"},
		{"slower", 150, 3000 * time.Millisecond, 2700 * time.Microsecond, "| **does not hold**: throughput 0.75x |"},
		{"p99 and CPU", 200, 4 * time.Second, 4 * time.Millisecond, "| **does not hold**: p99 1.33x, CPU per CSR 1.48x |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &Report{
				Options: Options{Machines: n, Clusters: 10},
				Runs: []Result{
					fakeRun(rubber, n, 1, 400, time.Second, 400*time.Microsecond),
					fakeRun(shipped, n, 1, 200, 3*time.Second, 2700*time.Microsecond),
					fakeRun(rubber, n, 10, 400, time.Second, 400*time.Microsecond),
					fakeRun(shipped, n, 10, tc.perSecond, tc.p99, tc.cpu),
				},
				Profiles: map[string]ProfileSummary{
					"ichor-shipped-n100":     {Total: 270e6, Categories: []Category{{Name: "policy evaluation (OPA, engine)", Value: 100e6}}},
					"ichor-shipped-n100-k10": {Total: 300e6, Categories: []Category{{Name: "policy evaluation (OPA, engine)", Value: 100e6}, {Name: "Talos reads: TLS handshake (a new connection per read)", Value: 50e6}}},
				},
			}
			md := rep.Markdown()
			goal := lineWith(md, "| the same over 10 TalosClusters holds the same")
			if !strings.HasSuffix(goal, tc.verdict) || !strings.Contains(goal, "`ichor manager` as shipped | ") {
				t.Errorf("goal row %q, want it to end in %q", goal, tc.verdict)
			}
			if !strings.Contains(md, "### Spread: N = 100 machines over 10 TalosClusters beside one") {
				t.Errorf("no spread section:\n%s", md)
			}
			// One row per controller and cluster count, the share against the
			// rubber stamp of the same machines.
			if row := lineWith(md, "| `ichor manager` as shipped | 1 | 100/100 | 200.0 | 50% |"); row == "" {
				t.Errorf("no shipped row over one cluster:\n%s", md)
			}
			if row := lineWith(md, "| `ichor manager` as shipped | 10 | 100/100 |"); row == "" {
				t.Errorf("no shipped row over ten clusters:\n%s", md)
			}
			if row := lineWith(md, "| rubber stamp (4 workers) | 10 | 100/100 | 400.0 | 100% |"); row == "" {
				t.Errorf("no rubber stamp row over ten clusters:\n%s", md)
			}
			// The profiles side by side, per CSR; a category one lacks is 0.
			if row := lineWith(md, "| Talos reads: TLS handshake (a new connection per read) |"); row != "| Talos reads: TLS handshake (a new connection per read) | 0.00 ms | 0.50 ms |" {
				t.Errorf("profile row %q", row)
			}
			// The main table is the one cluster's only.
			if !strings.Contains(md, "| `ichor manager` as shipped | 100/100 | 500 ms |") {
				t.Errorf("main table lacks the one cluster's run:\n%s", md)
			}
		})
	}
}

// TestGrowthReportSaysTheDirectReads: the growth's goal row and table say,
// fleet by fleet, how many of the manager's requests read their node
// directly, so that a cost per CSR that grows past --talos-watch-max is seen
// as the bound's price.
func TestGrowthReportSaysTheDirectReads(t *testing.T) {
	rubber := Variant{Name: "rubberstamp", Mode: "rubberstamp", Workers: 4}
	ichor := Variant{Name: "ichor", Mode: "cli", ManagerArgs: []string{"--kube-api-qps", "-1"}, Ichor: true}
	withReads := func(res Result, reads float64) Result {
		res.After.Metrics = map[string]float64{identityReadMetric + "_count": reads}
		return res
	}
	rep := &Report{
		Options: Options{Machines: 100, Growth: []int{100, 500}},
		Runs: []Result{
			fakeRun(rubber, 100, 1, 400, time.Second, 400*time.Microsecond),
			withReads(fakeRun(ichor, 100, 1, 200, 2*time.Second, 2*time.Millisecond), 0),
			fakeRun(rubber, 500, 1, 400, time.Second, 400*time.Microsecond),
			withReads(fakeRun(ichor, 500, 1, 100, 6*time.Second, 3*time.Millisecond), 400),
		},
	}
	md := rep.Markdown()
	want := "| cost per CSR flat from 100 to 500 machines (wall time per CSR, `--kube-api-qps -1`) | 5.00 ms at 100, 10.0 ms at 500 (direct Talos reads per CSR 0.00, 0.80) | **grows**: at 500 machines 2.0x the cheapest |"
	if got := lineWith(md, "| cost per CSR flat"); got != want {
		t.Errorf("growth goal row\n%s\nwant\n%s", got, want)
	}
	if row := lineWith(md, "| 500 |"); !strings.HasPrefix(row, "| 500 | 2.50 ms | 10.0 ms | 25% | 3.00 ms | 0.80 |") {
		t.Errorf("growth table row %q, want the reads beside the CPU", row)
	}
}

// lineWith is the first line of text that starts with prefix, or "".
func lineWith(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

func TestRunName(t *testing.T) {
	if got := RunName("ichor", 1000, 1); got != "ichor-n1000" {
		t.Errorf("one cluster: %q", got)
	}
	if got := RunName("ichor", 1000, 10); got != "ichor-n1000-k10" {
		t.Errorf("ten clusters: %q", got)
	}
}

// Issue 24's goals: the logged decision, and the manager as shipped beside
// each peer and the rubber stamp of the same round, each part that missed
// named with its distance.
func TestPeerGoals(t *testing.T) {
	rubber := Variant{Name: "rubberstamp", Mode: "rubberstamp", Workers: 4}
	shipped := Variant{Name: "ichor-shipped", Mode: "cli", Ichor: true}
	peer := Variant{Name: "kca", Mode: "peer", Command: []string{"kca"}}
	const n = 100
	inRound := func(res Result, round int) Result { res.Round = round; return res }
	rep := &Report{
		Options: Options{Machines: n, Peers: []Peer{{Name: "kca", Command: []string{"kca"}}}},
		Decisions: []BenchLine{
			{Name: "BenchmarkKubeletServingParts/decide-logged", Metrics: map[string]float64{"ns/op": 90_000, "p99-µs": 450}},
		},
		Runs: []Result{
			// Round 1: the manager ahead of the peer on every count.
			inRound(fakeRun(rubber, n, 1, 400, time.Second, 400*time.Microsecond), 1),
			inRound(fakeRun(shipped, n, 1, 360, 2*time.Second, 1200*time.Microsecond), 1),
			inRound(fakeRun(peer, n, 1, 300, 3*time.Second, 1100*time.Microsecond), 1),
			// Round 2: behind it on every count.
			inRound(fakeRun(peer, n, 1, 300, 2*time.Second, time.Millisecond), 2),
			inRound(fakeRun(shipped, n, 1, 200, 3*time.Second, 4*time.Millisecond), 2),
			inRound(fakeRun(rubber, n, 1, 400, time.Second, 400*time.Microsecond), 2),
		},
	}
	// Round 3: the peer approved nothing, so nothing is compared with it.
	none := inRound(fakeRun(peer, n, 1, 300, 2*time.Second, time.Millisecond), 3)
	none.Outcome.Latencies = nil
	rep.Runs = append(rep.Runs, none,
		inRound(fakeRun(shipped, n, 1, 200, 3*time.Second, 4*time.Millisecond), 3),
		inRound(fakeRun(rubber, n, 1, 400, time.Second, 400*time.Microsecond), 3))
	md := rep.Markdown()
	for _, want := range []string{
		"| round 3, beside kca | not compared: approved 0/100 by kca, 100/100 as shipped | – |",
		"| kubelet-serving decision with the decision log written, mean ≤ 100 µs and p99 ≤ 300 µs | mean 90.0 µs, p99 450 µs | **missed**: p99 by 150 µs |",
		"| round 1, beside kca: throughput as shipped ≥ kca's and ≥ 80% of the rubber stamp | 0.90 of the rubber stamp, kca 0.75 | met |",
		"| round 1, beside kca: CPU per approved CSR ≤ 1.2x kca's and ≤ 1.50 ms | 1.20 ms, kca 1.10 ms (1.1x) | met |",
		"| round 1, beside kca: p99 create → approved ≤ kca's | 2000 ms, kca 3000 ms (0.67x) | met |",
		"| round 2, beside kca: throughput as shipped ≥ kca's and ≥ 80% of the rubber stamp | 0.50 of the rubber stamp, kca 0.75 | **missed**: beside kca by 0.25, beside the rubber stamp by 0.30 |",
		"| round 2, beside kca: CPU per approved CSR ≤ 1.2x kca's and ≤ 1.50 ms | 4.00 ms, kca 1.00 ms (4.0x) | **missed**: beside kca by 2.80x, absolute by 2.50 ms |",
		"| round 2, beside kca: p99 create → approved ≤ kca's | 3000 ms, kca 2000 ms (1.50x) | **missed**: beside kca by 0.50x |",
	} {
		if !strings.Contains(md, want+"\n") {
			t.Errorf("no goal row\n%s\nin:\n%s", want, md)
		}
	}
	if row := lineWith(md, "| round 3, beside kca: "); row != "" {
		t.Errorf("a goal judged against a peer that approved nothing: %s", row)
	}
}

func TestMemoryAtPeakAddsUp(t *testing.T) {
	m := Memory{RSS: 300 << 20, File: 70 << 20, HeapInUse: 150 << 20, HeapLive: 70 << 20, HeapFree: 10 << 20, Stacks: 60 << 20, Runtime: 8 << 20, Goroutines: 12000}
	if got := m.Other(); got != 2<<20 {
		t.Errorf("other %.0f, want 2 MiB", got)
	}
	line := memoryAtPeak("`ichor manager` as shipped", m)
	for _, want := range []string{"(300 MiB, 12000 goroutines)", "the binary's pages 70 MiB", "heap in use 150 MiB, of which 70 MiB live", "not yet returned 10 MiB", "stacks 60 MiB", "own 8 MiB", "other 2 MiB."} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
	// Two sources sampled one after the other may overshoot the kernel's count.
	m.RSS -= 4 << 20
	if line := memoryAtPeak("x", m); !strings.Contains(line, "other −2 MiB.") {
		t.Errorf("overshoot: %q", line)
	}
}

// The stats endpoint takes the resident set apart from the process itself.
func TestStatsServerTakesThePeakApart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := ServeStats(t.Context(), l)
	s.sample()
	s.mu.Lock()
	m := s.atPeak
	s.mu.Unlock()
	if m.RSS == 0 || m.File == 0 || m.HeapInUse == 0 || m.Stacks == 0 || m.Runtime == 0 || m.Goroutines == 0 {
		t.Fatalf("a part is missing: %+v", m)
	}
	// The runtime's accounts are of memory it reserved, most of it touched:
	// what they do not explain is small beside the whole.
	if other := m.Other(); other < -float64(m.RSS)/4 || other > float64(m.RSS)/4 {
		t.Errorf("the parts are %.0f bytes off the whole: %+v", other, m)
	}
}
