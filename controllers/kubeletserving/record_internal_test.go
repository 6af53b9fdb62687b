package kubeletserving

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// issued is a kubelet serving certificate for node, valid until notAfter,
// PEM-encoded as a signer puts it in status.certificate.
func issued(t *testing.T, node string, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore:    notAfter.Add(-24 * time.Hour),
		NotAfter:     notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// Review 5 F5: the issued certificate is recorded on the machine as it was
// read. A replica whose view of the machine is old (it paused, or its cache
// lags) does not put an older certificate over the newer one recorded
// meanwhile: the write is refused, and the request looked at again soon.
func TestAnOldViewOfAMachineRecordsNoOlderCertificate(t *testing.T) {
	ctx := context.Background()
	f := newQueueFixture(t, clock.RealClock{})
	machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "w1"}}
	machine.Spec.ClusterName, machine.Spec.Hostname = f.cluster.Name, "w1"
	require.NoError(t, f.r.Client.Create(ctx, machine))
	var stale ichorv1alpha1.TalosMachine
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &stale))

	// Meanwhile another replica recorded a newer certificate.
	newer := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	recorded := stale.DeepCopy()
	recorded.Status.KubeletServingCertificate = &ichorv1alpha1.KubeletServingCertificateStatus{
		Request: "csr-newer", IssuedAt: metav1.NewTime(newer.Add(-24 * time.Hour)), NotAfter: metav1.NewTime(newer),
	}
	require.NoError(t, f.r.Client.Status().Update(ctx, recorded))

	// This replica still sees the machine as it was.
	inner := f.r.Client.(client.WithWatch)
	f.r.Client = interceptor.NewClient(inner, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if ms, ok := list.(*ichorv1alpha1.TalosMachineList); ok {
				for i := range ms.Items {
					if ms.Items[i].Name == stale.Name {
						ms.Items[i] = *stale.DeepCopy()
					}
				}
			}
			return nil
		},
	})
	req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("w1")})
	require.NoError(t, err)
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-older"},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Request: req, Username: "system:node:w1", SignerName: certificatesv1.KubeletServingSignerName},
		Status: certificatesv1.CertificateSigningRequestStatus{
			Conditions:  []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}},
			Certificate: issued(t, "w1", newer.Add(-time.Hour)),
		},
	}
	p, ok, err := f.r.passFor(ctx, f.cluster)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, p.record(ctx, csr), "a write refused for an old view is no failure")
	assert.Equal(t, time.Second, p.wait, "the request is not looked at again soon")

	var got ichorv1alpha1.TalosMachine
	require.NoError(t, inner.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	require.NotNil(t, got.Status.KubeletServingCertificate)
	assert.Equal(t, "csr-newer", got.Status.KubeletServingCertificate.Request, "an older certificate was recorded over a newer one")

	// Seen as it is, the newer one stands; and a newer still is recorded.
	f.r.Client = inner
	p.wait = 0
	require.NoError(t, p.record(ctx, csr))
	require.NoError(t, inner.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	assert.Equal(t, "csr-newer", got.Status.KubeletServingCertificate.Request)
	csr.Name, csr.Status.Certificate = "csr-newest", issued(t, "w1", newer.Add(time.Hour))
	require.NoError(t, p.record(ctx, csr))
	require.NoError(t, inner.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	assert.Equal(t, "csr-newest", got.Status.KubeletServingCertificate.Request)
}
