package engine_test

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// benchCSR is the request a kubelet sends: ECDSA P-256, its name and two IPs.
func benchCSR(b *testing.B) *certificatesv1.CertificateSigningRequest {
	b.Helper()
	pemBytes, err := csrgen.PEM(csrgen.Request{
		Subject:  csrgen.NodeSubject("worker-1"),
		DNSNames: []string{"worker-1"},
		IPs:      []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("fd00::2")},
	})
	if err != nil {
		b.Fatal(err)
	}
	return csrgen.ServingObject("csr-bench", "worker-1", pemBytes)
}

func benchInput(obj *certificatesv1.CertificateSigningRequest) csrinput.KubeletServing {
	return csrinput.KubeletServing{
		CSR:     csrinput.Build(obj),
		Machine: &csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"},
		Node:    &csrinput.Node{Readable: true, Nodename: "worker-1", Hostname: "worker-1", Addresses: []string{"10.5.0.2", "fd00::2"}},
	}
}

// BenchmarkKubeletServing measures one decision, the input building (PEM
// parsing and signature check) included, in Rego through the engine (the
// decision log written, to io.Discard) and in hand-written Go, in one run.
// It reports the p99 of the Rego decision and the ratio of the two means.
// Goals (docs/performance.md): p99 at most 200µs, at most 5x the Go version.
func BenchmarkKubeletServing(b *testing.B) {
	obj := benchCSR(b)
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Stop(context.Background()) })
	ctx := context.Background()

	// The mean of the last run of each, for the ratio below.
	var regoMean, goMean time.Duration
	rego := func(b *testing.B) {
		samples := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			d, err := e.KubeletServing(ctx, benchInput(obj))
			samples = append(samples, time.Since(start))
			if err != nil || d.Action != engine.ActionApprove {
				b.Fatalf("decision %+v, %v", d, err)
			}
		}
		regoMean = reportP99(b, samples)
	}
	hand := func(b *testing.B) {
		samples := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			in := benchInput(obj)
			d := goKubeletServing(&in)
			samples = append(samples, time.Since(start))
			if d.Action != engine.ActionApprove {
				b.Fatalf("decision %+v", d)
			}
		}
		goMean = reportP99(b, samples)
	}
	b.Run("rego", rego)
	b.Run("go", hand)
	b.Run("ratio", func(b *testing.B) {
		if goMean == 0 {
			b.Skip("run with the rego and go sub-benchmarks")
		}
		for b.Loop() {
		}
		b.ReportMetric(float64(regoMean)/float64(goMean), "rego/go")
	})
}

// reportP99 reports the 99th percentile of the samples and returns their mean.
func reportP99(b *testing.B, samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	var total time.Duration
	for _, s := range samples {
		total += s
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds())/1e3, "p99-µs")
	return total / time.Duration(len(samples))
}
