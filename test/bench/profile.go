package bench

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Category is a share of a profile (CPU time, or bytes in use), by what
// the code was doing.
type Category struct {
	Name string
	// Value is nanoseconds of CPU for a CPU profile, bytes for a heap one.
	Value float64
}

// Time is the category's CPU time.
func (c Category) Time() time.Duration { return time.Duration(c.Value) }

// ProfileSummary is where a profile went: by category (each sample counted
// once, in the first category whose rule matches a frame of its stack) and
// the top functions as `go tool pprof -top` prints them.
type ProfileSummary struct {
	Total      float64
	Categories []Category
	Top        string
}

// TotalTime is a CPU profile's total.
func (p ProfileSummary) TotalTime() time.Duration { return time.Duration(p.Total) }

type rule struct {
	name  string
	match func(frames []string) bool
}

// cpuCategories are matched in order against a sample's stack: a decision
// made inside a reconcile counts as the decision, a Talos read's TLS
// handshake as the handshake.
var cpuCategories = []rule{
	{"decision log (OPA logs plugin: mask rule, JSON encoding)", anyOf("open-policy-agent/opa/v1/plugins/logs", "sirupsen/logrus", "ichor-policy/engine.(*fileLogger")},
	{"policy evaluation (OPA, engine)", anyOf("open-policy-agent/opa", "ichor-policy/engine.")},
	{"input building (csrinput: PEM, signature check)", anyOf("ichor-policy/csrinput.")},
	{"Talos reads: TLS handshake (a new connection per read)", allOf(anyOf("crypto/tls.(*Conn).clientHandshake", "crypto/tls.(*Conn).handshakeContext", "crypto/tls.(*Conn).HandshakeContext"), anyOf("google.golang.org/grpc", "ichor-policy/talosnode."))},
	{"Talos reads: client construction (machinery client.New)", anyOf("talos/pkg/machinery/client.New")},
	{"Talos reads: gRPC calls and the rest of talosnode", anyOf("ichor-policy/talosnode.", "siderolabs/talos", "cosi-project/runtime", "google.golang.org/grpc")},
	{"secrets bundle Secret read and parsed per decision (clustersecrets)", anyOf("ichor-policy/clustersecrets.")},
	{"recording issued certificates on TalosMachines", anyOf("kubeletserving.(*pass).record")},
	{fullPassCategory, allOf(anyOf("CacheReader).List"), anyOf("kubeletserving.(*Reconciler).Reconcile", "kubeletserving.(*Reconciler).updateConditions"), noneOf("machineFor", "clustersFor"))},
	{"Events (recorder)", anyOf("client-go/tools/events", "client-go/tools/record")},
	{"informer cache (watch decoding, store, deep copies)", anyOf("client-go/tools/cache", "controller-runtime/pkg/cache", "client-go/tools/watch", "apimachinery/pkg/watch")},
	{"API calls (client-go REST, HTTP/2, JSON)", anyOf("k8s.io/client-go/rest", "golang.org/x/net/http2", "net/http.", "controller-runtime/pkg/client")},
	{"reconciler (other)", anyOf("ichor-policy/controllers/", "controller-runtime/pkg/internal/controller", "ichor-policy/test/bench.(*RubberStamp")},
	{"GC and runtime", anyOf("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "runtime.mcall", "runtime.morestack", "runtime.systemstack", "runtime.mstart")},
}

// heapCategories sort the bytes in use by where they were allocated.
var heapCategories = []rule{
	{"informer cache: CertificateSigningRequests", allOf(anyOf("client-go/tools/cache", "client-go/tools/watch", "apimachinery/pkg/watch", "controller-runtime/pkg/cache"), anyOf("certificates/v1."))},
	{"informer cache: other objects (TalosMachines, TalosClusters, ...), decoded from JSON", anyOf("client-go/tools/cache", "client-go/tools/watch", "apimachinery/pkg/watch", "controller-runtime/pkg/cache")},
	{"policy engine (compiled bundle, OPA)", anyOf("open-policy-agent/opa", "ichor-policy/engine.", "ichor-policy/bundles.")},
	{"Talos client (gRPC, TLS)", anyOf("google.golang.org/grpc", "siderolabs/talos", "ichor-policy/talosnode.")},
	{"Events recorder", anyOf("client-go/tools/events", "client-go/tools/record")},
	{"HTTP/2, TLS and JSON of the API connections", anyOf("golang.org/x/net/http2", "net/http.", "crypto/tls", "k8s.io/client-go/rest", "encoding/json")},
	{"scheme, REST mappings and other start-up state", anyOf("apimachinery/pkg/runtime.(*Scheme)", "client-go/restmapper", "controller-runtime/pkg/client/apiutil", "k8s.io/kube-openapi", "k8s.io/client-go/discovery")},
	{"the reconcilers", anyOf("ichor-policy/controllers/")},
}

func anyOf(patterns ...string) func([]string) bool {
	return func(frames []string) bool {
		for _, f := range frames {
			for _, p := range patterns {
				if strings.Contains(f, p) {
					return true
				}
			}
		}
		return false
	}
}

func noneOf(patterns ...string) func([]string) bool {
	m := anyOf(patterns...)
	return func(frames []string) bool { return !m(frames) }
}

func allOf(matchers ...func([]string) bool) func([]string) bool {
	return func(frames []string) bool {
		for _, m := range matchers {
			if !m(frames) {
				return false
			}
		}
		return true
	}
}

const (
	otherCategory    = "other"
	fullPassCategory = "full passes: every CSR and machine listed from the cache" //nolint:gosec // G101: a label, not a password
)

// SummarizeProfile reads a CPU profile with `go tool pprof`.
func SummarizeProfile(ctx context.Context, binary, profile string) (ProfileSummary, error) {
	return summarize(ctx, binary, profile, cpuCategories, parseCPU, nil)
}

// SummarizeHeap reads a heap profile's bytes in use with `go tool pprof`.
func SummarizeHeap(ctx context.Context, binary, profile string) (ProfileSummary, error) {
	return summarize(ctx, binary, profile, heapCategories, parseBytes, []string{"-sample_index=inuse_space"})
}

func summarize(ctx context.Context, binary, profile string, rules []rule, parse func(string) (float64, error), extra []string) (ProfileSummary, error) {
	var ps ProfileSummary
	pprof := func(args ...string) (string, error) {
		args = append(append(append([]string{"tool", "pprof"}, extra...), args...), binary, profile)
		out, err := exec.CommandContext(ctx, "go", args...).Output()
		if err != nil {
			return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
		return string(out), nil
	}
	traces, err := pprof("-traces")
	if err != nil {
		return ps, err
	}
	if ps.Total, ps.Categories, err = categorize(traces, rules, parse); err != nil {
		return ps, err
	}
	top, err := pprof("-top", "-nodecount=25")
	if err != nil {
		return ps, err
	}
	cum, err := pprof("-top", "-cum", "-nodecount=40")
	if err != nil {
		return ps, err
	}
	ps.Top = top + "\n$ go tool pprof -top -cum\n" + skipHeader(cum)
	return ps, nil
}

func parseCPU(s string) (float64, error) {
	d, err := time.ParseDuration(s)
	return float64(d), err
}

// parseBytes reads pprof's sizes: 512B, 1.50kB, 3MB, 1.2GB.
func parseBytes(s string) (float64, error) {
	if s == "0" {
		return 0, nil
	}
	for _, u := range []struct {
		suffix string
		factor float64
	}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			return v * u.factor, err
		}
	}
	return 0, fmt.Errorf("not a size: %q", s)
}

// skipHeader drops pprof's header lines (file, build id, type, time), which
// the first listing already shows.
func skipHeader(listing string) string {
	if i := strings.Index(listing, "Showing nodes"); i >= 0 {
		return listing[i:]
	}
	return listing
}

// categorize sums the samples of `go tool pprof -traces` output by
// category, largest first.
func categorize(traces string, rules []rule, parse func(string) (float64, error)) (float64, []Category, error) {
	sums := map[string]float64{}
	var total, value float64
	var frames []string
	flush := func() {
		if value > 0 {
			name := classify(rules, frames)
			sums[name] += value
			total += value
		}
		value, frames = 0, frames[:0]
	}
	sc := bufio.NewScanner(strings.NewReader(traces))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	inTraces := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----------+") {
			flush()
			inTraces = true
			continue
		}
		if !inTraces || strings.TrimSpace(line) == "" {
			continue
		}
		fields := strings.Fields(line)
		if strings.HasSuffix(fields[0], ":") {
			// A label of the sample ("bytes:  256kB" in a heap profile).
			continue
		}
		if !strings.HasPrefix(line, "           ") {
			// "     300ms   runtime.nanotime": the sample's value, then its
			// leaf frame.
			flush()
			v, err := parse(fields[0])
			if err != nil {
				return 0, nil, fmt.Errorf("pprof traces: %q: %w", line, err)
			}
			value = v
			if len(fields) > 1 {
				frames = append(frames, fields[1])
			}
			continue
		}
		frames = append(frames, fields[0])
	}
	flush()
	out := make([]Category, 0, len(sums))
	for name, v := range sums {
		out = append(out, Category{Name: name, Value: v})
	}
	slices.SortFunc(out, func(a, b Category) int {
		if a.Value != b.Value {
			if a.Value > b.Value {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return total, out, sc.Err()
}

func classify(rules []rule, frames []string) string {
	for _, c := range rules {
		if c.match(frames) {
			return c.name
		}
	}
	return otherCategory
}
