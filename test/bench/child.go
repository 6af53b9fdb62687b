package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Stats is what a controller process reports about itself.
type Stats struct {
	// HeapInusePeak is the highest runtime.MemStats.HeapInuse sampled (every
	// 100ms) since the process started; HeapInuse the last sample.
	HeapInusePeak uint64 `json:"heap_inuse_peak"`
	HeapInuse     uint64 `json:"heap_inuse"`
	// VmHWM and VmRSS are from /proc/self/status, in bytes: the peak and
	// current resident set.
	VmHWM uint64 `json:"vm_hwm"`
	VmRSS uint64 `json:"vm_rss"`
	// AtPeak is what the resident set was made of at the highest VmRSS
	// sampled (every 100ms), so that a peak can be taken apart.
	AtPeak Memory `json:"at_peak"`
	// CPU is the user and system time the process has used.
	CPU        time.Duration `json:"cpu"`
	Goroutines int           `json:"goroutines"`
	NumGC      uint32        `json:"num_gc"`
	// Metrics are the process's Prometheus metrics (controller-runtime's
	// registry), summed over their labels: NAME_count and NAME_sum of each
	// histogram (NAME:CONTROLLER for those with a controller label) and the
	// value of each counter (rest_client_requests_total:METHOD by method).
	Metrics map[string]float64 `json:"metrics"`
}

// Memory is what a Go process's resident set is made of at one moment, in
// bytes: the kernel's count of its pages, split by the runtime's own.
type Memory struct {
	// RSS is VmRSS; File is RssFile, the pages of the binary (and any file)
	// mapped in: code and read-only data, not the manager's work.
	RSS  uint64 `json:"rss"`
	File uint64 `json:"rss_file"`
	// HeapInUse is the heap's spans holding objects (runtime.MemStats
	// HeapInuse); HeapLive what the last collection found reachable in it
	// (/gc/heap/live:bytes); the difference is garbage the collector's
	// target (GOGC) lets accumulate until the next one.
	HeapInUse uint64 `json:"heap_inuse"`
	HeapLive  uint64 `json:"heap_live"`
	// HeapFree is heap freed but not yet given back to the kernel
	// (HeapIdle - HeapReleased).
	HeapFree uint64 `json:"heap_free"`
	// Stacks are the goroutines' stacks (StackSys), Goroutines how many.
	Stacks     uint64 `json:"stacks"`
	Goroutines int    `json:"goroutines"`
	// Runtime is the runtime's own bookkeeping: spans, caches, the GC's
	// metadata, profiling buckets and the rest (MSpanSys, MCacheSys, GCSys,
	// BuckHashSys, OtherSys).
	Runtime uint64 `json:"runtime"`
}

// Other is the resident memory the parts above do not explain: anonymous
// pages outside Go's accounts, and the rounding of sampling two sources
// one after the other (so it may be below zero).
func (m Memory) Other() float64 {
	return float64(m.RSS) - float64(m.File+m.HeapInUse+m.HeapFree+m.Stacks+m.Runtime)
}

// Delta is after's metric minus before's.
func Delta(before, after Stats, key string) float64 {
	return after.Metrics[key] - before.Metrics[key]
}

// EnableClientMetrics turns on client-go's request latency and rate-limiter
// wait histograms, which controller-runtime registers but leaves off.
func EnableClientMetrics() {
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRequestLatency, ctrlmetrics.MetricRateLimiterLatency)
}

func metricSums() map[string]float64 {
	out := map[string]float64{}
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return out
	}
	for _, mf := range families {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" || (name == "rest_client_requests_total" && l.GetName() == "method") {
					key += ":" + l.GetValue()
				}
			}
			if h := m.GetHistogram(); h != nil {
				out[key+"_count"] += float64(h.GetSampleCount())
				out[key+"_sum"] += h.GetSampleSum()
			} else if c := m.GetCounter(); c != nil {
				out[key] += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				out[key] += g.GetValue()
			}
		}
	}
	return out
}

// StatsServer serves a controller process's Stats and controls its CPU
// profile, for the driver: GET /stats, POST /profile/start?file=PATH, POST
// /profile/stop, POST /profile/heap?file=PATH. The controllers of this repository do not serve pprof, so
// the benchmark process brings its own.
type StatsServer struct {
	mu      sync.Mutex
	peak    uint64
	last    uint64
	numGC   uint32
	atPeak  Memory
	profile *os.File
}

// StatsListener is the socket a driver handed over as descriptor fd
// (StartController's -stats-fd), or, when fd is 0, a new one listening on
// addr.
func StatsListener(fd int, addr string) (net.Listener, error) {
	if fd == 0 {
		return net.Listen("tcp", addr)
	}
	f := os.NewFile(uintptr(fd), "stats")
	if f == nil {
		return nil, fmt.Errorf("descriptor %d is not valid", fd)
	}
	defer f.Close() // the listener holds its own duplicate
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("descriptor %d: %w", fd, err)
	}
	return l, nil
}

// ServeStats serves the stats endpoint on l and samples the heap until ctx
// ends.
func ServeStats(ctx context.Context, l net.Listener) *StatsServer {
	s := &StatsServer{}
	s.sample()
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", s.stats)
	mux.HandleFunc("POST /profile/start", s.startProfile)
	mux.HandleFunc("POST /profile/stop", s.stopProfile)
	mux.HandleFunc("POST /profile/heap", s.heapProfile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return s
}

func (s *StatsServer) sample() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, _ := ProcStatus(os.Getpid()) // none on a system without /proc: no AtPeak
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = ms.HeapInuse
	s.peak = max(s.peak, ms.HeapInuse)
	s.numGC = ms.NumGC
	if rss := status["VmRSS"]; rss > s.atPeak.RSS {
		s.atPeak = Memory{
			RSS: rss, File: status["RssFile"],
			HeapInUse: ms.HeapInuse, HeapLive: heapLive(), HeapFree: ms.HeapIdle - ms.HeapReleased,
			Stacks: ms.StackSys, Goroutines: runtime.NumGoroutine(),
			Runtime: ms.MSpanSys + ms.MCacheSys + ms.GCSys + ms.BuckHashSys + ms.OtherSys,
		}
	}
}

// heapLive is the heap the last collection found reachable.
func heapLive() uint64 {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

func (s *StatsServer) stats(w http.ResponseWriter, _ *http.Request) {
	s.sample()
	st := Stats{Goroutines: runtime.NumGoroutine(), Metrics: metricSums()}
	s.mu.Lock()
	st.HeapInusePeak, st.HeapInuse, st.NumGC, st.AtPeak = s.peak, s.last, s.numGC, s.atPeak
	s.mu.Unlock()
	if status, err := ProcStatus(os.Getpid()); err == nil {
		st.VmHWM, st.VmRSS = status["VmHWM"], status["VmRSS"]
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		st.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

func (s *StatsServer) startProfile(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.profile != nil {
		http.Error(w, "a profile is running", http.StatusConflict)
		return
	}
	// The bench driver's own control endpoint, on loopback, names the file.
	f, err := os.Create(r.URL.Query().Get("file")) //nolint:gosec // G703: see above
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.profile = f
}

func (s *StatsServer) stopProfile(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.profile == nil {
		http.Error(w, "no profile is running", http.StatusConflict)
		return
	}
	pprof.StopCPUProfile()
	err := s.profile.Close()
	s.profile = nil
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// heapProfile writes the heap profile, after a collection so that the
// bytes in use are current.
func (s *StatsServer) heapProfile(w http.ResponseWriter, r *http.Request) {
	// The bench driver's own control endpoint, on loopback, names the file.
	f, err := os.Create(r.URL.Query().Get("file")) //nolint:gosec // G703: see above
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// ProcStatus reads the kB fields of /proc/PID/status, in bytes.
func ProcStatus(pid int) (map[string]uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(value)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		out[key] = n * 1024
	}
	return out, sc.Err()
}

// ProcCPU is the user and system time of process pid (and of its reaped
// children, which the processes measured here do not have), from
// /proc/PID/stat, at the kernel's clock-tick resolution (10ms).
func ProcCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces; the fields after it
	// are numbered from 3 (state).
	s := string(data)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 13 {
		return 0, errors.New("malformed stat")
	}
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	// USER_HZ on Linux; the ticks stay far below 2^63.
	const ticksPerSecond = 100
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil //nolint:gosec // G115: see above
}
