package bench_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/opavalue"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// The per-decision benchmarks of the entrypoints beside kubelet serving
// (engine/bench_test.go measures that one beside hand-written Go). Each
// measures what the controller or webhook pays per decision: the input
// building where there is one, the evaluation through the engine, and the
// decision log written (to io.Discard), and reports the p99.

func newEngine(b *testing.B) *engine.Engine {
	b.Helper()
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Stop(context.Background()) })
	return e
}

// kubeletClientCSR is a kubelet renewing its client certificate: ECDSA
// P-256, no SANs, client usages, requested as the node itself.
func kubeletClientCSR(b *testing.B) *certificatesv1.CertificateSigningRequest {
	b.Helper()
	pemBytes, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1")})
	if err != nil {
		b.Fatal(err)
	}
	obj := csrgen.ServingObject("csr-bench", "worker-1", pemBytes, certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth)
	obj.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	return obj
}

func review(subresource string, allowed bool) csrinput.AccessReview {
	return csrinput.AccessReview{
		Verb: "create", Group: certificatesv1.GroupName, Version: "*",
		Resource: "certificatesigningrequests", Subresource: subresource, Allowed: allowed,
	}
}

// BenchmarkKubeletClient is one kubelet-client decision, the input building
// (PEM parsing, signature check) included: a self renewal, approved as
// selfnodeclient.
func BenchmarkKubeletClient(b *testing.B) {
	e := newEngine(b)
	obj := kubeletClientCSR(b)
	ctx := context.Background()
	samples := make([]time.Duration, 0, 1024)
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		start := time.Now()
		in := csrinput.KubeletClient{
			CSR: csrinput.Build(obj),
			Authorization: csrinput.KubeletAuthorization{
				SelfNodeClient: review("selfnodeclient", true),
				NodeClient:     review("nodeclient", false),
			},
			Machine: &csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"},
		}
		d, err := e.KubeletClient(ctx, in)
		samples = append(samples, time.Since(start))
		if err != nil || d.Action != engine.ActionApprove {
			b.Fatalf("decision %+v, %v", d, err)
		}
	}
	reportP99(b, samples)
	cpu.report(b)
}

// BenchmarkCredentialAdmission is the engine's part of one
// TalosCredentialRequest admission: the requirements decision, the public
// key's facts, and the admission decision (the SubjectAccessReview and the
// Event are API calls, measured end to end by `make bench`). A person's
// talosconfig-reader request, allowed.
func BenchmarkCredentialAdmission(b *testing.B) {
	e := newEngine(b)
	ctx := context.Background()
	keyPEM := publicKeyPEM(b)
	samples := make([]time.Duration, 0, 1024)
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		start := time.Now()
		reqs, err := e.Requirements(ctx, "talosconfig-reader")
		if err != nil {
			b.Fatal(err)
		}
		facts, _ := engine.ParsePublicKey(keyPEM)
		in := enginetest.AllowedAdmission(facts, reqs.Authorization)
		// spec.requester as `ichor cluster` records it (a SelfSubjectReview):
		// the user the API server authenticates, field for field.
		user := in.User
		in.Requester = &user
		d, err := e.Admission(ctx, in)
		samples = append(samples, time.Since(start))
		if err != nil || !d.Allowed {
			b.Fatalf("decision %+v, %v", d, err)
		}
	}
	reportP99(b, samples)
	cpu.report(b)
}

// BenchmarkAdmissionStack is the admission decision, its decision log
// written, in a new goroutine each time, as the webhook's handler makes it
// (the server runs each request in a goroutine of its own; the
// requirements, asked in another, are taken here once): with the
// goroutine's stack as it starts, and grown first (engine.GrowStack, as the
// handler does). The difference is the runtime doubling and copying the
// stack under OPA's evaluator.
func BenchmarkAdmissionStack(b *testing.B) {
	e := loggedEngine(b)
	ctx := context.Background()
	reqs, err := e.Requirements(ctx, "talosconfig-reader")
	if err != nil {
		b.Fatal(err)
	}
	facts, _ := engine.ParsePublicKey(publicKeyPEM(b))
	in := enginetest.AllowedAdmission(facts, reqs.Authorization)
	for _, v := range []struct {
		name string
		grow bool
	}{{"stack-as-started", false}, {"stack-grown", true}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				done := make(chan error, 1)
				go func() {
					if v.grow {
						engine.GrowStack()
					}
					d, err := e.Admission(ctx, in)
					if err == nil && !d.Allowed {
						err = fmt.Errorf("refused: %s", d.Reasons.String())
					}
					done <- err
				}()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			cpu.report(b)
		})
	}
}

// publicKeyPEM is a new Ed25519 public key, PEM-encoded as spec.publicKey
// holds it.
func publicKeyPEM(b *testing.B) string {
	b.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		b.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// reportP99 reports the 99th percentile of the samples, as
// engine/bench_test.go does.
func reportP99(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// servingInput is what the kubelet-serving reconciler gathers for an honest
// node; the CSR is built once.
func servingInput(b *testing.B) (*certificatesv1.CertificateSigningRequest, csrinput.KubeletServing) {
	b.Helper()
	pemBytes, err := csrgen.PEM(csrgen.Request{
		Subject:  csrgen.NodeSubject("worker-1"),
		DNSNames: []string{"worker-1"},
		IPs:      []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("fd00::2")},
	})
	if err != nil {
		b.Fatal(err)
	}
	obj := csrgen.ServingObject("csr-bench", "worker-1", pemBytes)
	return obj, csrinput.KubeletServing{
		CSR:     csrinput.Build(obj),
		Machine: &csrinput.Machine{Name: "worker-1", Namespace: "default", Cluster: "demo"},
		Node:    &csrinput.Node{Readable: true, Nodename: "worker-1", Hostname: "worker-1", Addresses: []string{"10.5.0.2", "fd00::2"}},
	}
}

// BenchmarkKubeletServingParts takes the kubelet-serving decision of
// engine/bench_test.go apart, so a miss of its goal points at the part to
// fix: building the input (PEM parsing and the ECDSA signature check), the
// conversion of the input struct to OPA's value (as the engine does, and
// through its JSON, as it did before), the decision through the engine with
// the decision log off (as the engine benchmark runs it) and with the log
// written as the manager writes it (JSON lines, here to a discarding writer),
// and the decision log's mask, a part of the logged decision.
func BenchmarkKubeletServingParts(b *testing.B) {
	obj, in := servingInput(b)
	ctx := context.Background()
	run := func(b *testing.B, f func()) {
		samples := make([]time.Duration, 0, 1024)
		b.ReportAllocs()
		cpu := startCPU()
		for b.Loop() {
			start := time.Now()
			f()
			samples = append(samples, time.Since(start))
		}
		reportP99(b, samples)
		cpu.report(b)
	}
	b.Run("build-input", func(b *testing.B) {
		run(b, func() { _ = csrinput.Build(obj) })
	})
	b.Run("opa-input-conversion", func(b *testing.B) {
		// As the engine does it (opavalue.Of).
		run(b, func() {
			if _, err := opavalue.Of(in); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("opa-input-conversion-via-json", func(b *testing.B) {
		// As the engine did before opavalue, and as OPA reads a Go value:
		// the input as JSON, read into OPA's value.
		run(b, func() {
			data, err := json.Marshal(in)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ast.ValueFromReader(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		})
	})
	decide := func(e *engine.Engine) func() {
		return func() {
			d, err := e.KubeletServing(ctx, in)
			if err != nil || d.Action != engine.ActionApprove {
				b.Fatalf("decision %+v, %v", d, err)
			}
		}
	}
	b.Run("decide-log-off", func(b *testing.B) {
		run(b, decide(newEngine(b)))
	})
	b.Run("decide-logged", func(b *testing.B) {
		run(b, decide(loggedEngine(b)))
	})
	b.Run("mask", func(b *testing.B) {
		mask, entry := preparedMask(b, decide)
		run(b, func() {
			rs, err := mask.Eval(ctx, rego.EvalParsedInput(entry))
			if err != nil || len(rs) != 1 {
				b.Fatalf("mask: %v, %v", rs, err)
			}
			if ops, ok := rs[0].Expressions[0].Value.([]any); !ok || len(ops) != 0 {
				b.Fatalf("the mask cuts an honest approval's entry: %v", rs[0].Expressions[0].Value)
			}
		})
	})
}

// preparedMask is the decision log's mask query (policy/system/log) as OPA's
// decision-log plugin runs it on every entry: prepared once over the default
// bundle, its data in a store holding OPA's values as the engine's does, and
// the entry of one approval, as the engine logs it, for its input. It is
// apart from the decisions' figures because the manager's CPU profiles do not
// show it: pprof keeps 64 frames of a stack, and the mask runs below OPA's
// evaluator of the decision, which is deeper.
func preparedMask(b *testing.B, decide func(*engine.Engine) func()) (rego.PreparedEvalQuery, ast.Value) {
	b.Helper()
	var line bytes.Buffer
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: &line, Log: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	decide(e)()
	e.Stop(context.Background())
	entry, err := ast.ValueFromReader(&line)
	if err != nil {
		b.Fatalf("the approval's entry: %v", err)
	}
	bu, err := bundles.Default()
	if err != nil {
		b.Fatal(err)
	}
	data, err := ast.InterfaceToValue(bu.Data)
	if err != nil {
		b.Fatal(err)
	}
	opts := []func(*rego.Rego){rego.Query("data.system.log.mask"), rego.Store(inmem.NewFromASTObject(data.(ast.Object)))}
	for _, m := range bu.Modules {
		opts = append(opts, rego.ParsedModule(m.Parsed))
	}
	mask, err := rego.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return mask, entry
}

// loggedEngine is an engine whose decision log is written as the manager
// writes it (JSON lines), to a discarding writer.
func loggedEngine(b *testing.B) *engine.Engine {
	b.Helper()
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: discard{}, Log: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Stop(context.Background()) })
	return e
}

// discard is io.Discard under another name: the engine turns its console
// decision log off for io.Discard itself.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkRecordApplied is the record, written after every approval, that a
// decision was carried out (engine.RecordApplied): a plain entry, no rule
// evaluated, with the decision log written as the manager writes it (JSON
// lines, here to a discarding writer).
func BenchmarkRecordApplied(b *testing.B) {
	ctx := context.Background()
	e := loggedEngine(b)
	samples := make([]time.Duration, 0, 1024)
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		start := time.Now()
		if err := e.RecordApplied(ctx, engine.Applied{
			DecisionID: "4a8b3a0e-6c2f-4f3e-9d1c-2b7e5f0a9c11", Object: "csr/csr-bench", UID: "0b6f3c9e-5d1a-4f7b-8e2c-9a4d6b1f3e70",
			Action: engine.ActionApprove, Outcome: engine.AppliedWritten,
		}); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
	}
	reportP99(b, samples)
	cpu.report(b)
}

// BenchmarkApproval is the whole policy cost of one approved kubelet-serving
// request, as the reconciler pays it: the verdict (input conversion,
// evaluation, the mask, the entry written) and, once the approval is
// written on the request, the record that it was applied. The decision log
// is written as the manager writes it (JSON lines, to a discarding writer).
func BenchmarkApproval(b *testing.B) {
	_, in := servingInput(b)
	ctx := context.Background()
	e := loggedEngine(b)
	samples := make([]time.Duration, 0, 1024)
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		start := time.Now()
		d, err := e.KubeletServing(ctx, in)
		if err != nil || d.Action != engine.ActionApprove {
			b.Fatalf("decision %+v, %v", d, err)
		}
		if err := recordApproval(ctx, e, d); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
	}
	reportP99(b, samples)
	cpu.report(b)
}
