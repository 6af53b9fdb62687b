package bench_test

import (
	"context"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/ichor-policy/test/bench"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// BenchmarkApprovalWrite is one approval as the approvers write it (the
// approval subresource's PUT of a request the API server holds) against a
// real kube-apiserver: the client's CPU per write (cpu-ns/op) and the API
// server's (apiserver-cpu-ns/op). "default" is the approvers' clientset as
// the manager builds it, no content type set, which client-go's typed
// clients send as protobuf; "json" is the same forced to JSON, for what the
// encoding costs. The requests are for a signer nothing signs for, so that
// no signing follows the approval.
func BenchmarkApprovalWrite(b *testing.B) {
	env := harness.StartForTest(b, harness.Options{})
	plane, err := bench.FindControlPlane()
	if err != nil || plane["kube-apiserver"] == 0 {
		b.Fatalf("the API server's process: %v (found %v)", err, plane)
	}
	request, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("bench"), DNSNames: []string{"bench"}})
	if err != nil {
		b.Fatal(err)
	}

	for _, encoding := range []struct{ name, contentType string }{
		{"default", ""},
		{"json", runtime.ContentTypeJSON},
	} {
		b.Run(encoding.name, func(b *testing.B) {
			cfg := rest.CopyConfig(env.Config)
			cfg.ContentType = encoding.contentType
			cfg.AcceptContentTypes = encoding.contentType
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				b.Fatal(err)
			}
			csrs := env.Clientset.CertificatesV1().CertificateSigningRequests()
			held := make([]*certificatesv1.CertificateSigningRequest, b.N)
			for i := range held {
				csr, err := csrs.Create(b.Context(), &certificatesv1.CertificateSigningRequest{
					ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-approval-" + encoding.name + "-", Labels: map[string]string{"bench": "approval-write"}},
					Spec: certificatesv1.CertificateSigningRequestSpec{
						Request: request, SignerName: "bench.ichor.dev/nobody",
						Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
					},
				}, metav1.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				held[i] = csr
			}
			b.Cleanup(func() {
				_ = csrs.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "bench=approval-write"})
			})
			apiserver := func() float64 { return float64(plane.CPU()["kube-apiserver"]) }

			b.ResetTimer()
			cpu, apiStart := startCPU(), apiserver()
			for _, csr := range held {
				now := metav1.Now()
				csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
					Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
					Reason: "Bench", Message: "approved by the benchmark", LastUpdateTime: now, LastTransitionTime: now,
				})
				if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(b.Context(), csr.Name, csr, metav1.UpdateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpu.report(b)
			b.ReportMetric((apiserver()-apiStart)/float64(b.N), "apiserver-cpu-ns/op")
		})
	}
}
