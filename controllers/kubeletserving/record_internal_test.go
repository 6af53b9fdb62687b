package kubeletserving

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sevents "k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// issued is a kubelet serving certificate for node, valid until notAfter,
// PEM-encoded as a signer puts it in status.certificate: signed by ca, for
// server auth, for key.
func issued(t *testing.T, ca tls.Certificate, key crypto.PublicKey, node string, notAfter time.Time) []byte {
	t.Helper()
	return issuedAs(t, ca, key, node, notAfter, x509.ExtKeyUsageServerAuth)
}

func issuedAs(t *testing.T, ca tls.Certificate, key crypto.PublicKey, node string, notAfter time.Time, usages ...x509.ExtKeyUsage) []byte {
	t.Helper()
	return signed(t, ca, key, servingTemplate(node, notAfter, usages...))
}

func servingTemplate(node string, notAfter time.Time, usages ...x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore:    notAfter.Add(-24 * time.Hour),
		NotAfter:     notAfter,
		ExtKeyUsage:  usages,
	}
}

// signed is tmpl for key, signed by ca, PEM-encoded.
func signed(t *testing.T, ca tls.Certificate, key crypto.PublicKey, tmpl *x509.Certificate) []byte {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, key, ca.PrivateKey)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// selfSignedCA is a CA of no cluster's.
func selfSignedCA(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// withClusterCA gives the fixture's cluster a secrets bundle, in the Secret
// its secretsRef names and the NodeReaders read, and returns the bundle's
// Kubernetes CA: the one its kubelet serving certificates are signed with.
func withClusterCA(t *testing.T, f *queueFixture) tls.Certificate {
	t.Helper()
	ctx := context.Background()
	bundle := newSecretsBundle(t)
	data, err := clustersecrets.Marshal(bundle)
	require.NoError(t, err)
	require.NoError(t, f.r.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "talos-secrets", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: f.cluster.Name}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: data},
	}))
	var c ichorv1alpha1.TalosCluster
	require.NoError(t, f.r.Client.Get(ctx, f.cluster, &c))
	c.Spec.SecretsRef.Name = "talos-secrets"
	require.NoError(t, f.r.Client.Update(ctx, &c))
	f.r.NodeReaders = &NodeReaders{Reader: f.r.Client}
	ca, err := tls.X509KeyPair(bundle.Certs.K8s.Crt, bundle.Certs.K8s.Key)
	require.NoError(t, err)
	return ca
}

// requestFor is a kubelet's serving request for node, and its key.
func requestFor(t *testing.T, node string) ([]byte, crypto.PublicKey) {
	t.Helper()
	key, err := csrgen.Key(csrgen.ECDSA)
	require.NoError(t, err)
	req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject(node), Key: key})
	require.NoError(t, err)
	return req, key.Public()
}

// Review 5 F5: the issued certificate is recorded on the machine as it was
// read. A replica whose view of the machine is old (it paused, or its cache
// lags) does not put an older certificate over the newer one recorded
// meanwhile: the write is refused, and the request looked at again soon.
func TestAnOldViewOfAMachineRecordsNoOlderCertificate(t *testing.T) {
	ctx := context.Background()
	f := newQueueFixture(t, clock.RealClock{})
	ca := withClusterCA(t, f)
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
	req, key := requestFor(t, "w1")
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-older"},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Request: req, Username: "system:node:w1", SignerName: certificatesv1.KubeletServingSignerName},
		Status: certificatesv1.CertificateSigningRequestStatus{
			Conditions:  []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}},
			Certificate: issued(t, ca, key, "w1", newer.Add(-time.Hour)),
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
	csr.Name, csr.Status.Certificate = "csr-newest", issued(t, ca, key, "w1", newer.Add(time.Hour))
	require.NoError(t, p.record(ctx, csr))
	require.NoError(t, inner.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	assert.Equal(t, "csr-newest", got.Status.KubeletServingCertificate.Request)
}

// Review 191 F2: what is recorded latches KubeletServingVerified, which
// renders the kube-apiserver's --kubelet-certificate-authority. An API server
// (a tenant's, or another cluster's that a kubeconfigRef names by mistake)
// that puts in status.certificate what the cluster's signer did not issue
// for the request has nothing recorded, and the machine says why.
func TestOnlyWhatTheClustersSignerIssuedForTheRequestIsRecorded(t *testing.T) {
	ctx := context.Background()
	f := newQueueFixture(t, clock.RealClock{})
	ca := withClusterCA(t, f)
	events := k8sevents.NewFakeRecorder(16)
	f.r.Recorder = events
	machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "w1"}}
	machine.Spec.ClusterName, machine.Spec.Hostname = f.cluster.Name, "w1"
	require.NoError(t, f.r.Client.Create(ctx, machine))
	req, key := requestFor(t, "w1")
	_, otherKey := requestFor(t, "w1")
	notAfter := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	csr := func(name string, cert []byte) *certificatesv1.CertificateSigningRequest {
		return &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
			Spec:       certificatesv1.CertificateSigningRequestSpec{Request: req, Username: "system:node:w1", SignerName: certificatesv1.KubeletServingSignerName},
			Status: certificatesv1.CertificateSigningRequestStatus{
				Conditions:  []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}},
				Certificate: cert,
			},
		}
	}
	p, ok, err := f.r.passFor(ctx, f.cluster)
	require.NoError(t, err)
	require.True(t, ok)

	foreign := issued(t, selfSignedCA(t), key, "w1", notAfter)
	long := "csr-" + strings.Repeat("x", maxRecordedRequestName)
	// A reason as long as a tenant's server makes it still fits a note.
	manyUsages := servingTemplate("w1", notAfter)
	for i := range 64 {
		manyUsages.UnknownExtKeyUsage = append(manyUsages.UnknownExtKeyUsage, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1, i + 1, 1234567, 7654321})
	}
	for _, c := range []struct {
		name, why string
		cert      []byte
		request   string // "csr-" + name when empty
	}{
		{"another-ca", "does not verify against the cluster's CA", foreign, ""},
		{"client-auth", "it is not for serving: server auth is not among", issuedAs(t, ca, key, "w1", notAfter, x509.ExtKeyUsageClientAuth), ""},
		{"no-usages", "it is not for serving: server auth is not among", issuedAs(t, ca, key, "w1", notAfter), ""},
		{"another-key", "its public key is not the request's", issued(t, ca, otherKey, "w1", notAfter), ""},
		{"another-node", `it is for node "w2"`, issued(t, ca, key, "w2", notAfter), ""},
		// Kubernetes does not bound a request's name (review 191 F3).
		{"long-name", "more than the 253 recorded", issued(t, ca, key, "w1", notAfter), long},
		{"many-usages", "it is not for serving: server auth is not among", signed(t, ca, key, manyUsages), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			request := c.request
			if request == "" {
				request = "csr-" + c.name
			}
			require.NoError(t, p.record(ctx, csr(request, c.cert)), "retrying changes nothing: no error to retry on")
			var got ichorv1alpha1.TalosMachine
			require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &got))
			assert.Nil(t, got.Status.KubeletServingCertificate, "recorded")
			select {
			case e := <-events.Events:
				assert.Contains(t, e, "Warning "+ReasonCertificateNotRecorded)
				assert.Contains(t, e, `"`+request[:min(len(request), 64)])
				assert.Contains(t, e, c.why)
				assert.LessOrEqual(t, len(strings.TrimPrefix(e, "Warning "+ReasonCertificateNotRecorded+" ")), engine.MaxEventNote, "more than an Event's note holds")
			default:
				t.Error("no Event says why the certificate is not recorded")
			}
			// Looked at again (each pass does), even at another version
			// (its server changes one with any label), it is not said
			// again (reviews 193 M4, 194).
			require.NoError(t, p.record(ctx, csr(request, c.cert)))
			relabelled := csr(request, c.cert)
			relabelled.ResourceVersion = "2"
			require.NoError(t, p.record(ctx, relabelled))
			assert.Empty(t, events.Events, "said again")
			// The cluster's condition says it while the machine waits.
			var live ichorv1alpha1.TalosMachine
			require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &live))
			why, ok := f.r.refusedRecords.of(f.cluster, &live)
			assert.True(t, ok)
			assert.Contains(t, why, c.why)
		})
	}
	// What forgets the condition's words (a watch started again, the
	// machine made again) is made up for at the next look, without a new
	// Event (review 196).
	f.r.refusedRecords.forget(f.cluster)
	require.NoError(t, p.record(ctx, csr("csr-another-ca", foreign)))
	var waiting ichorv1alpha1.TalosMachine
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &waiting))
	why, ok := f.r.refusedRecords.of(f.cluster, &waiting)
	assert.True(t, ok, "the condition no longer says why the machine waits")
	assert.Contains(t, why, "does not verify against the cluster's CA")
	assert.Empty(t, events.Events, "said again")

	require.NoError(t, p.record(ctx, csr("csr-good", issued(t, ca, key, "w1", notAfter))))
	var got ichorv1alpha1.TalosMachine
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	require.NotNil(t, got.Status.KubeletServingCertificate)
	assert.Equal(t, "csr-good", got.Status.KubeletServingCertificate.Request)
	assert.Empty(t, events.Events)
	_, ok = f.r.refusedRecords.of(f.cluster, &got)
	assert.False(t, ok, "a refusal still said of a machine that has its certificate")

	// Signed by a CA the bundle does not hold: refused. Once the bundle
	// holds it as the CA before a rotation's (clustersecrets.PreviousKey),
	// the same request is judged again, and recorded.
	previous := newSecretsBundle(t)
	previousCA, err := tls.X509KeyPair(previous.Certs.K8s.Crt, previous.Certs.K8s.Key)
	require.NoError(t, err)
	rotated := csr("csr-rotated", issued(t, previousCA, key, "w1", notAfter.Add(time.Hour)))
	require.NoError(t, p.record(ctx, rotated))
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	assert.Equal(t, "csr-good", got.Status.KubeletServingCertificate.Request)
	assert.Len(t, events.Events, 1)
	<-events.Events
	data, err := clustersecrets.Marshal(previous)
	require.NoError(t, err)
	var secret corev1.Secret
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Namespace: f.cluster.Namespace, Name: "talos-secrets"}, &secret))
	secret.Data[clustersecrets.PreviousKey] = data
	require.NoError(t, f.r.Client.Update(ctx, &secret))
	f.r.NodeReaders = &NodeReaders{Reader: f.r.Client} // past secretsFreshness
	require.NoError(t, p.record(ctx, rotated))
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	assert.Equal(t, "csr-rotated", got.Status.KubeletServingCertificate.Request, "a certificate of the previous CA is not recorded during a rotation")

	// Without the cluster's CA nothing is judged: the look fails, to be
	// tried again, and records nothing.
	require.NoError(t, f.r.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "talos-secrets"}}))
	f.r.NodeReaders = &NodeReaders{Reader: f.r.Client}
	err = p.record(ctx, csr("csr-later", issued(t, ca, key, "w1", notAfter.Add(2*time.Hour))))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "talos-secrets")
	require.NoError(t, f.r.Client.Get(ctx, client.ObjectKeyFromObject(machine), &got))
	assert.Equal(t, "csr-rotated", got.Status.KubeletServingCertificate.Request)
}

// Review 195 F3: a refusal is said of the machine it was about, not of one
// made again under its name, nor after its machine or its cluster's API
// server is forgotten.
func TestARefusalIsSaidOnlyOfItsMachine(t *testing.T) {
	var f refusals
	cluster := types.NamespacedName{Namespace: "ns", Name: "c"}
	m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w1", UID: "uid-1"}}
	f.set(cluster, m, "why")
	why, ok := f.of(cluster, m)
	assert.True(t, ok)
	assert.Equal(t, "why", why)
	_, ok = f.of(types.NamespacedName{Namespace: "ns", Name: "other"}, m)
	assert.False(t, ok, "said for another cluster")
	again := m.DeepCopy()
	again.UID = "uid-2"
	_, ok = f.of(cluster, again)
	assert.False(t, ok, "said of a machine made again under the name")
	f.clear(client.ObjectKeyFromObject(m))
	_, ok = f.of(cluster, m)
	assert.False(t, ok)
	f.set(cluster, m, "why")
	f.forget(cluster)
	_, ok = f.of(cluster, m)
	assert.False(t, ok)
}
