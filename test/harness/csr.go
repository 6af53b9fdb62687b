package harness

import (
	"context"
	"strconv"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// SubmitCSR creates the request as the user of cs (the API server records
// that user on it) and deletes it when the test ends. It returns its name.
func (e *Env) SubmitCSR(t testing.TB, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest) string {
	t.Helper()
	if _, err := cs.CertificatesV1().CertificateSigningRequests().Create(t.Context(), csr, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSR %s: %v", csr.Name, err)
	}
	t.Cleanup(func() {
		_ = e.Clientset.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
	})
	return csr.Name
}

// ChurnStatus writes a condition of a type no rule reads to the request's
// status, again and again for d, as whoever may write its status (on a
// tenant's API server, the tenant) can: a new message and a new version at
// each write. It returns how many writes it made.
func (e *Env) ChurnStatus(t testing.TB, name string, d time.Duration) int {
	t.Helper()
	writes := 0
	for start := time.Now(); time.Since(start) < d; writes++ {
		csr := e.GetCSR(t, name)
		csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: "Loop", Status: corev1.ConditionTrue,
			Reason: "Loop", Message: strconv.Itoa(writes), LastUpdateTime: metav1.Now()}}
		if _, err := e.Clientset.CertificatesV1().CertificateSigningRequests().UpdateStatus(t.Context(), csr, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("write the status of CSR %s: %v", name, err)
		}
	}
	return writes
}

// GetCSR reads the request as it is now.
func (e *Env) GetCSR(t testing.TB, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr, err := e.Clientset.CertificatesV1().CertificateSigningRequests().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CSR %s: %v", name, err)
	}
	return csr
}

// Verdict is the request's Approved or Denied condition, nil while it is
// undecided.
func Verdict(csr *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	for i, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}
