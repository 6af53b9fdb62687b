package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// Peer is another approver program run against the same control plane and
// machines: `-peer "NAME BINARY [ARG...]"`. The project ships none of their
// code; docs/performance.md says how the peers measured were built.
type Peer struct {
	Name    string
	Command []string
}

// ParsePeer reads a -peer value: a name, the program, its arguments,
// separated by spaces.
func ParsePeer(s string) (Peer, error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return Peer{}, fmt.Errorf("-peer %q: want \"NAME BINARY [ARG...]\"", s)
	}
	if f[0] == "rubberstamp" || strings.HasPrefix(f[0], "ichor") || strings.ContainsAny(f[0], "/\\") {
		return Peer{}, fmt.Errorf("-peer %q: the name %q is the bench's own or a path", s, f[0])
	}
	bin, err := exec.LookPath(f[1])
	if err != nil {
		return Peer{}, fmt.Errorf("-peer %q: %w", s, err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return Peer{}, err
	}
	return Peer{Name: f[0], Command: append([]string{bin}, f[2:]...)}, nil
}

// startPeer runs the peer's program with KUBECONFIG set. Its CPU and memory
// are read from /proc, as the control plane's are.
func startPeer(v Variant, dir, name, kubeconfig string) (*Controller, error) {
	c := &Controller{Name: name, DecisionLogPath: filepath.Join(dir, name+".stdout.log"), LogPath: filepath.Join(dir, name+".log")}
	return c, c.start(exec.Command(v.Command[0], v.Command[1:]...), "KUBECONFIG="+kubeconfig) //nolint:gosec // G204: the operator's own -peer
}

// procStats are a process's CPU and resident set from /proc: what a peer,
// which has no stats endpoint, is measured by.
func procStats(pid int) (Stats, error) {
	cpu, err := ProcCPU(pid)
	if err != nil {
		return Stats{}, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Stats{}, err
	}
	st := Stats{CPU: cpu}
	for line := range strings.SplitSeq(string(status), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok || (key != "VmHWM" && key != "VmRSS") {
			continue
		}
		kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("/proc/%d/status %s: %w", pid, key, err)
		}
		if key == "VmHWM" {
			st.VmHWM = kib << 10
		} else {
			st.VmRSS = kib << 10
		}
	}
	return st, nil
}

// waitStarted waits until the peer has been up for a moment: a program that
// fails on its flags exits at once. The warm-up request then shows that it
// approves.
func (c *Controller) waitStarted(ctx context.Context) error {
	select {
	case err := <-c.done:
		c.done <- err
		return fmt.Errorf("%s exited: %v\n%s", c.Name, err, tail(c.LogPath, 20)) //nolint:errorlint // the exit status, nil on a clean exit, is for the reader
	case <-time.After(time.Second):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// APIRequests counts the API server's requests by "VERB resource" (with
// /subresource where there is one), from its apiserver_request_total.
type APIRequests map[string]float64

// ScrapeAPIRequests reads the API server's request counters.
func ScrapeAPIRequests(ctx context.Context, cs kubernetes.Interface) (APIRequests, error) {
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	family, ok := families["apiserver_request_total"]
	if !ok {
		return nil, errors.New("the API server's metrics have no apiserver_request_total")
	}
	out := APIRequests{}
	for _, m := range family.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		key := labels["verb"] + " " + labels["resource"]
		if s := labels["subresource"]; s != "" {
			key += "/" + s
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// Since is what was counted from before to r.
func (r APIRequests) Since(before APIRequests) APIRequests {
	out := APIRequests{}
	for k, v := range r {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Top is the n keys counted most, most first.
func (r APIRequests) Top(n int) []string {
	keys := slices.SortedFunc(maps.Keys(r), func(a, b string) int {
		if r[a] != r[b] {
			if r[a] > r[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys[:min(n, len(keys))]
}

// mostPer is the n keys counted most, each with its count divided by per.
func (r APIRequests) mostPer(n int, per float64) string {
	top := make([]string, 0, n)
	for _, k := range r.Top(n) {
		top = append(top, fmt.Sprintf("%s %.2f", k, r[k]/per))
	}
	return strings.Join(top, ", ")
}

// approvedOf is what a run's API requests are counted per: its approved
// requests, at least one.
func approvedOf(res Result) float64 {
	return float64(max(len(res.Outcome.Latencies), 1))
}

// Total is every request counted.
func (r APIRequests) Total() float64 {
	total := 0.0
	for _, v := range r {
		total += v
	}
	return total
}

// peerTable is the comparison with the peers, round by round, each figure
// beside the rubber stamp's of the same round.
func (r *Report) peerTable(w func(string, ...any)) {
	if len(r.Options.Peers) == 0 {
		return
	}
	w("### Beside other approvers, N = %d machines (rounds alternate the order)", r.Options.Machines)
	w("")
	w("Ratios are to the rubber stamp of the same round. API requests are the API server's (apiserver_request_total) from the first request to the last approval, per approved CSR, the four most counted by verb and resource.")
	w("")
	w("| round | approver | approved | approvals/s (÷ rubber stamp) | p99 create → approved (÷) | approver CPU per CSR | control plane CPU per CSR, net (÷) | peak RSS | API requests per CSR | most counted |")
	w("|---|---|---|---|---|---|---|---|---|---|")
	for _, res := range r.Runs {
		if res.Round == 0 || res.Variant.Replicas > 0 {
			continue
		}
		var rubber Result
		for _, o := range r.Runs {
			if o.Round == res.Round && o.Variant.Mode == "rubberstamp" {
				rubber = o
			}
		}
		perSecond := 0.0
		if rubber.Outcome.PerSecond() > 0 {
			perSecond = res.Outcome.PerSecond() / rubber.Outcome.PerSecond()
		}
		w("| %d | %s | %s | %.1f (%.2f) | %s (%.2f) | %s | %s (%.2f) | %s | %.2f | %s |", res.Round, describeVariant(res.Variant), approvedCell(res),
			res.Outcome.PerSecond(), perSecond,
			ms(res.Outcome.Quantile(0.99)), ratio(res.Outcome.Quantile(0.99), rubber.Outcome.Quantile(0.99)),
			ms(res.CPUPerRequest()),
			ms(perRequest(res.ControlPlaneNet(), res)), ratio(perRequest(res.ControlPlaneNet(), res), perRequest(rubber.ControlPlaneNet(), rubber)),
			mib(res.After.VmHWM), res.APIRequests.Total()/approvedOf(res), res.APIRequests.mostPer(4, approvedOf(res)))
	}
	w("")
}
