package webhookcerts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

const (
	namespace = "ichor-system"
	day       = 24 * time.Hour
)

var t0 = time.Date(2026, 11, 4, 12, 0, 0, 0, time.UTC)

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	return s
}

// objects are what the chart creates: the empty Secret and the webhook
// configuration without a CA bundle.
func objects() []client.Object {
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNoneOnDryRun
	path := "/validate-ichor-dev-v1alpha1-taloscredentialrequest"
	return []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: DefaultSecretName}, Type: corev1.SecretTypeOpaque},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: DefaultWebhookConfigurationName},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name:                    "vtaloscredentialrequest.ichor.dev",
				ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: DefaultServiceName, Path: &path}},
				FailurePolicy:           &fail,
				SideEffects:             &none,
				AdmissionReviewVersions: []string{"v1"},
			}},
		},
	}
}

func newClient(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) client.WithWatch {
	b := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func newRotator(t *testing.T, c client.Client, clk *clocktesting.FakePassiveClock, mutate ...func(*Options)) *Rotator {
	t.Helper()
	opts := Options{Namespace: namespace, CertDir: t.TempDir(), Clock: clk}
	for _, m := range mutate {
		m(&opts)
	}
	r, err := NewRotator(c, opts)
	require.NoError(t, err)
	return r
}

func getSecret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	require.NoError(t, c.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: DefaultSecretName}, &s))
	return &s
}

func caBundleOf(t *testing.T, c client.Client) []byte {
	t.Helper()
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, c.Get(context.Background(), types.NamespacedName{Name: DefaultWebhookConfigurationName}, &vwc))
	require.Len(t, vwc.Webhooks, 1)
	return vwc.Webhooks[0].ClientConfig.CABundle
}

// served is the certificate the webhook server would load from the cert dir,
// loaded the way certwatcher loads it.
func served(t *testing.T, r *Rotator) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(r.opts.CertDir, "tls.crt"), filepath.Join(r.opts.CertDir, "tls.key"))
	require.NoError(t, err, "the cert dir holds no usable pair")
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	return cert
}

// untilCARenewal walks the clock through the serving certificate's renewals,
// each replica syncing at each, to the CA's own renewal, where it stops
// without a sync: the first replica's CA is then due.
func untilCARenewal(t *testing.T, clk *clocktesting.FakePassiveClock, replicas ...*Rotator) {
	t.Helper()
	ca := replicas[0].current.ca
	for {
		now := replicas[0].current.nextRenewal()
		clk.SetTime(now)
		if !now.Before(renewalTime(ca)) {
			return
		}
		for _, r := range replicas {
			require.NoError(t, r.Sync(context.Background()))
		}
	}
}

// verify checks cert the way the API server does when it calls the webhook:
// against the configuration's CA bundle, for NAME.NAMESPACE.svc, at now.
func verify(cert *x509.Certificate, bundle []byte, now time.Time) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:       pool,
		DNSName:     DefaultServiceName + "." + namespace + ".svc",
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}

func certsIn(t *testing.T, p []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, p = pem.Decode(p)
		if block == nil {
			return out
		}
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
}

func TestSyncFillsTheEmptySecretWritesTheFilesAndSetsTheCABundle(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk)

	require.NoError(t, r.Sync(context.Background()))

	secret := getSecret(t, c)
	for _, k := range secretKeys {
		assert.NotEmpty(t, secret.Data[k], "Secret key %s", k)
	}
	assert.Equal(t, corev1.SecretTypeOpaque, secret.Type)

	cert := served(t, r)
	assert.Equal(t, secret.Data[KeyServingCert], mustRead(t, filepath.Join(r.opts.CertDir, "tls.crt")))
	assert.ElementsMatch(t, []string{
		"ichor-policy-webhook.ichor-system.svc", "ichor-policy-webhook", "ichor-policy-webhook.ichor-system",
		"ichor-policy-webhook.ichor-system.svc.cluster.local",
	}, cert.DNSNames)
	assert.Equal(t, "ichor-policy-webhook.ichor-system.svc", cert.Subject.CommonName)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, cert.ExtKeyUsage)
	assert.False(t, cert.IsCA)
	assert.Equal(t, t0.Add(90*day), cert.NotAfter)

	bundle := caBundleOf(t, c)
	assert.Equal(t, secret.Data[KeyCABundle], bundle)
	require.NoError(t, verify(cert, bundle, t0))
	cas := certsIn(t, bundle)
	require.Len(t, cas, 1)
	assert.True(t, cas[0].IsCA)
	assert.True(t, cas[0].MaxPathLenZero)
	assert.Equal(t, t0.Add(365*day), cas[0].NotAfter)

	info, err := os.Stat(filepath.Join(r.opts.CertDir, "tls.key"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the key is readable by the manager only")
	require.NoError(t, r.ReadyCheck(nil))
}

func TestAnotherReplicaAdoptsTheSameCertificate(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	first, second := newRotator(t, c, clk), newRotator(t, c, clk)

	require.NoError(t, first.Sync(context.Background()))
	before := getSecret(t, c)
	clk.SetTime(t0.Add(time.Hour))
	require.NoError(t, second.Sync(context.Background()))

	after := getSecret(t, c)
	assert.Equal(t, before.ResourceVersion, after.ResourceVersion, "the second replica wrote the Secret although it held valid certificates")
	assert.Equal(t, mustRead(t, filepath.Join(first.opts.CertDir, "tls.crt")), mustRead(t, filepath.Join(second.opts.CertDir, "tls.crt")))
	assert.Equal(t, mustRead(t, filepath.Join(first.opts.CertDir, "tls.key")), mustRead(t, filepath.Join(second.opts.CertDir, "tls.key")))
}

// TestReplicasRacingConvergeOnTheWinner has another replica write the Secret
// between this one's read and its update: the update conflicts, and this
// replica serves the winner's certificate rather than its own.
func TestReplicasRacingConvergeOnTheWinner(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	var other *Rotator
	raced := false
	funcs := &interceptor.Funcs{Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
		if _, ok := obj.(*corev1.Secret); ok && !raced {
			raced = true
			require.NoError(t, other.Sync(ctx))
		}
		return c.Update(ctx, obj, opts...)
	}}
	c := newClient(t, funcs, objects()...)
	other = newRotator(t, c, clk)
	r := newRotator(t, c, clk)

	require.NoError(t, r.Sync(context.Background()))

	assert.True(t, raced)
	assert.Equal(t, mustRead(t, filepath.Join(other.opts.CertDir, "tls.crt")), mustRead(t, filepath.Join(r.opts.CertDir, "tls.crt")))
	assert.Equal(t, getSecret(t, c).Data[KeyServingCert], mustRead(t, filepath.Join(r.opts.CertDir, "tls.crt")))
	require.NoError(t, verify(served(t, r), caBundleOf(t, c), t0))
}

func TestServingCertificateIsRenewedTwoThirdsIntoItsLife(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	first := served(t, r)
	firstCA := getSecret(t, c).Data[KeyCACert]
	bundle := caBundleOf(t, c)

	// 60 days less the backdate is two thirds of the 90 days it covers.
	renewal := first.NotBefore.Add((first.NotAfter.Sub(first.NotBefore)) / 3 * 2)
	assert.Equal(t, renewal, r.current.nextRenewal())
	clk.SetTime(renewal.Add(-time.Minute))
	require.NoError(t, r.Sync(context.Background()))
	assert.Equal(t, first.SerialNumber, served(t, r).SerialNumber, "renewed early")

	clk.SetTime(renewal)
	require.NoError(t, r.Sync(context.Background()))
	second := served(t, r)
	assert.NotEqual(t, first.SerialNumber, second.SerialNumber, "not renewed at two thirds")
	assert.Equal(t, firstCA, getSecret(t, c).Data[KeyCACert], "the CA changed with the serving certificate")
	assert.Equal(t, bundle, caBundleOf(t, c), "the CA bundle changed with the serving certificate")
	require.NoError(t, verify(second, caBundleOf(t, c), renewal))
}

// TestCARotationKeepsThePreviousCATrusted: when the CA is renewed, a replica
// that still serves a certificate of the previous CA stays trusted until that
// CA expires, and the previous CA leaves the bundle once it has.
func TestCARotationKeepsThePreviousCATrusted(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r, lagging := newRotator(t, c, clk), newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	require.NoError(t, lagging.Sync(context.Background()))
	oldCA := certsIn(t, getSecret(t, c).Data[KeyCACert])[0]
	oldCAKey, err := parseKey(getSecret(t, c).Data[KeyCAKey])
	require.NoError(t, err)

	// Walk time forward the way the Runnable does, renewing when due.
	for now := t0; now.Before(renewalTime(oldCA)); {
		now = r.current.nextRenewal()
		clk.SetTime(now)
		require.NoError(t, r.Sync(context.Background()))
	}
	rotated := clk.Now()
	secret := getSecret(t, c)
	newCA := certsIn(t, secret.Data[KeyCACert])[0]
	require.NotEqual(t, oldCA.SerialNumber, newCA.SerialNumber, "the CA was not renewed two thirds into its life")
	bundle := caBundleOf(t, c)
	cas := certsIn(t, bundle)
	require.Len(t, cas, 2)
	assert.Equal(t, newCA.Raw, cas[0].Raw, "the current CA comes first")
	assert.Equal(t, oldCA.Raw, cas[1].Raw)

	require.NoError(t, verify(served(t, r), bundle, rotated), "the new certificate is trusted")
	require.NoError(t, served(t, r).CheckSignatureFrom(newCA))
	// A replica that has not synced since the rotation still serves a
	// certificate of the previous CA, issued before the rotation: it is
	// trusted until that CA expires.
	prev, _, err := newServing(oldCA, oldCAKey, rotated.Add(-time.Hour), r.is)
	require.NoError(t, err)
	require.NoError(t, verify(prev, bundle, rotated), "a certificate of the previous CA is not trusted during the rotation")

	// Once the previous CA has expired it leaves the bundle.
	clk.SetTime(oldCA.NotAfter.Add(time.Minute))
	require.NoError(t, r.Sync(context.Background()))
	assert.Len(t, certsIn(t, caBundleOf(t, c)), 1)
	require.NoError(t, lagging.Sync(context.Background()))
	require.NoError(t, verify(served(t, lagging), caBundleOf(t, c), clk.Now()), "the lagging replica caught up")
}

func TestRenamedServiceGetsANewCertificate(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	require.NoError(t, newRotator(t, c, clk).Sync(context.Background()))
	caBefore := getSecret(t, c).Data[KeyCACert]

	r := newRotator(t, c, clk, func(o *Options) { o.ServiceName = "renamed"; o.ClusterDomain = "example.internal" })
	require.NoError(t, r.Sync(context.Background()))
	assert.Contains(t, served(t, r).DNSNames, "renamed.ichor-system.svc")
	assert.Contains(t, served(t, r).DNSNames, "renamed.ichor-system.svc.example.internal")
	assert.Equal(t, caBefore, getSecret(t, c).Data[KeyCACert], "a new name needs no new CA")
}

func TestUnreadableSecretContentIsReplaced(t *testing.T) {
	for name, data := range map[string]map[string][]byte{
		"garbage":            {KeyCACert: []byte("not a certificate"), KeyCAKey: []byte("nor a key"), KeyServingCert: []byte("x"), KeyServingKey: []byte("y")},
		"key of another CA":  swapCAKey(t),
		"serving of another": foreignServing(t),
	} {
		t.Run(name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(t0)
			objs := objects()
			objs[0].(*corev1.Secret).Data = data
			c := newClient(t, nil, objs...)
			r := newRotator(t, c, clk)
			require.NoError(t, r.Sync(context.Background()))
			require.NoError(t, verify(served(t, r), caBundleOf(t, c), t0))
		})
	}
}

func TestMissingSecretIsCreatedWhenAllowed(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()[1:]...)
	r := newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	assert.NotEmpty(t, getSecret(t, c).Data[KeyServingCert])
}

func TestMissingSecretThatCannotBeCreatedSaysWhatToDo(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	funcs := &interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		return apierrors.NewForbidden(corev1.Resource("secrets"), obj.GetName(), nil)
	}}
	c := newClient(t, funcs, objects()[1:]...)
	err := newRotator(t, c, clk).Sync(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "create it empty; the Helm chart does")
}

// A CA renewed while the webhook configuration's bundle cannot be set (an
// API error, a GitOps tool resetting it, a policy refusing the patch) is
// not served yet: the certificate in service, of the CA the API server
// trusts, stays until the bundle is set (review 168: every call to the
// replica failed meanwhile, the old certificate good for months).
func TestANewCANotYetTrustedIsNotServed(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	var refuse atomic.Bool
	c := newClient(t, &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if _, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok && refuse.Load() {
			return apierrors.NewForbidden(admissionregistrationv1.Resource("validatingwebhookconfigurations"), obj.GetName(), errors.New("refused by a policy"))
		}
		return c.Patch(ctx, obj, patch, opts...)
	}}, objects()...)
	r := newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	oldCA := certsIn(t, getSecret(t, c).Data[KeyCACert])[0]
	untilCARenewal(t, clk, r)
	refuse.Store(true)
	var bundleErr *CABundleError
	require.ErrorAs(t, r.Sync(context.Background()), &bundleErr)
	require.NotEqual(t, oldCA.Raw, certsIn(t, getSecret(t, c).Data[KeyCACert])[0].Raw, "the CA was not renewed")
	require.NoError(t, verify(served(t, r), caBundleOf(t, c), clk.Now()), "the replica serves a certificate the API server does not trust")

	refuse.Store(false)
	require.NoError(t, r.Sync(context.Background()))
	require.NoError(t, verify(served(t, r), caBundleOf(t, c), clk.Now()))
	require.NoError(t, served(t, r).CheckSignatureFrom(certsIn(t, getSecret(t, c).Data[KeyCACert])[0]), "the new CA's certificate is served once trusted")
}

// A renewal withheld for a CA bundle that cannot be set is tried again
// after the retry interval, not at once and without end: the renewal time
// stays past while the old certificate is served (review 170).
func TestAWithheldRenewalIsRetriedAfterTheInterval(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	var refuse atomic.Bool
	var patches, reads atomic.Int32
	c := newClient(t, &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if _, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok && refuse.Load() {
			patches.Add(1)
			return apierrors.NewForbidden(admissionregistrationv1.Resource("validatingwebhookconfigurations"), obj.GetName(), errors.New("refused by a policy"))
		}
		return c.Patch(ctx, obj, patch, opts...)
	}, Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*corev1.Secret); ok && refuse.Load() {
			reads.Add(1)
		}
		return c.Get(ctx, key, obj, opts...)
	}}, objects()...)
	r := newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	// The serving certificate renewed on time until the CA's renewal.
	oldCA := r.current.ca
	untilCARenewal(t, clk, r)
	refuse.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	require.Eventually(t, func() bool { return patches.Load() >= 1 }, 10*time.Second, 10*time.Millisecond, "the renewal was not tried")
	// Well within the retry interval: no second try.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		// One look reads the Secret twice (before the plan, and before
		// the bundle's patch).
		require.LessOrEqual(t, patches.Load(), int32(1), "the withheld renewal was tried again at once")
		require.LessOrEqual(t, reads.Load(), int32(2), "the withheld renewal was looked at again at once")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
	assert.True(t, r.current.ca.Equal(oldCA), "the renewed CA was served before it was trusted")
}

// The bundle's patch is made on the configuration's version as read: a
// replica's patch that another's lands before (here, between the lagging
// replica's second read of the Secret and its patch) conflicts, and the
// newer bundle stays (review 171: only the Secret's re-read was tested).
func TestABundlePatchIsMadeOnTheVersionRead(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	var between func()
	secretReads := 0
	c := newClient(t, &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		err := c.Get(ctx, key, obj, opts...)
		if _, ok := obj.(*corev1.Secret); ok && between != nil {
			// The lagging replica's second read, the one before its patch.
			if secretReads++; secretReads == 2 {
				run := between
				between = nil
				run()
			}
		}
		return err
	}}, objects()...)
	r, lagging := newRotator(t, c, clk), newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	require.NoError(t, lagging.Sync(context.Background()))
	// A person resets the bundle: both replicas will set it again.
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, c.Get(context.Background(), types.NamespacedName{Name: DefaultWebhookConfigurationName}, &vwc))
	want := vwc.Webhooks[0].ClientConfig.CABundle
	vwc.Webhooks[0].ClientConfig.CABundle = []byte("reset")
	require.NoError(t, c.Update(context.Background(), &vwc))
	between = func() {
		require.NoError(t, c.Get(context.Background(), types.NamespacedName{Name: DefaultWebhookConfigurationName}, &vwc))
		vwc.Webhooks[0].ClientConfig.CABundle = []byte("another writer's")
		require.NoError(t, c.Update(context.Background(), &vwc))
	}
	err := lagging.Sync(context.Background())
	var bundleErr *CABundleError
	require.ErrorAs(t, err, &bundleErr, "the patch did not conflict with the write made since the read")
	assert.True(t, apierrors.IsConflict(err), "%v", err)
	assert.Equal(t, []byte("another writer's"), caBundleOf(t, c), "the patch overwrote a write it had not seen")
	// The next check sets it on the version it reads.
	require.NoError(t, lagging.Sync(context.Background()))
	assert.Equal(t, want, caBundleOf(t, c))
}

// A replica whose Secret read predates another's CA renewal does not put
// the older CA bundle back over the newer one (review 168): here the other
// replica renews between this one's read of the Secret and its read of the
// webhook configuration.
func TestALaggingReplicaDoesNotPutTheOlderCABundleBack(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	var between func()
	c := newClient(t, &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok && between != nil {
			run := between
			between = nil
			run()
		}
		return c.Get(ctx, key, obj, opts...)
	}}, objects()...)
	r, lagging := newRotator(t, c, clk), newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	require.NoError(t, lagging.Sync(context.Background()))
	oldCA := certsIn(t, getSecret(t, c).Data[KeyCACert])[0]
	untilCARenewal(t, clk, r, lagging)
	// The other replica renews while the lagging one is between its reads.
	clk.SetTime(clk.Now().Add(-time.Minute)) // the lagging replica's look: the CA not due yet
	between = func() {
		clk.SetTime(clk.Now().Add(time.Minute))
		require.NoError(t, r.Sync(context.Background()))
		clk.SetTime(clk.Now().Add(-time.Minute))
	}
	err := lagging.Sync(context.Background())
	clk.SetTime(clk.Now().Add(time.Minute))
	newCA := certsIn(t, getSecret(t, c).Data[KeyCACert])[0]
	require.NotEqual(t, oldCA.Raw, newCA.Raw, "the CA was not renewed")
	var bundleErr *CABundleError
	require.ErrorAs(t, err, &bundleErr, "the lagging replica set the bundle it had read")
	cas := certsIn(t, caBundleOf(t, c))
	require.NotEmpty(t, cas)
	assert.Equal(t, newCA.Raw, cas[0].Raw, "the older CA bundle was put back over the renewed one")
	// Its next check takes the renewal up.
	require.NoError(t, lagging.Sync(context.Background()))
	require.NoError(t, verify(served(t, lagging), caBundleOf(t, c), clk.Now()))
}

// TestMissingWebhookConfigurationStillWritesTheFiles: the webhook server must
// be able to start before the configuration exists (Helm creates it last);
// the bundle is set by a later sync.
func TestMissingWebhookConfigurationStillWritesTheFiles(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()[0])
	r := newRotator(t, c, clk)
	err := r.Sync(context.Background())
	var bundleErr *CABundleError
	require.ErrorAs(t, err, &bundleErr)
	assert.True(t, apierrors.IsNotFound(err))
	served(t, r)

	require.NoError(t, c.Create(context.Background(), objects()[1]))
	require.NoError(t, r.Sync(context.Background()))
	require.NoError(t, verify(served(t, r), caBundleOf(t, c), t0))
}

// TestResetCABundleIsRestored: an upgrade or a person that clears the bundle
// (or leaves another one) gets it back at the next check.
func TestResetCABundleIsRestored(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	want := caBundleOf(t, c)

	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, c.Get(context.Background(), types.NamespacedName{Name: DefaultWebhookConfigurationName}, &vwc))
	vwc.Webhooks[0].ClientConfig.CABundle = []byte("stale")
	require.NoError(t, c.Update(context.Background(), &vwc))

	require.NoError(t, r.Sync(context.Background()))
	assert.Equal(t, want, caBundleOf(t, c))
}

func TestFilesAreRewrittenWhenTheyDiffer(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk)
	require.NoError(t, r.Sync(context.Background()))
	path := filepath.Join(r.opts.CertDir, "tls.crt")
	require.NoError(t, os.WriteFile(path, []byte("tampered"), 0o600))
	require.NoError(t, r.Sync(context.Background()))
	assert.Equal(t, getSecret(t, c).Data[KeyServingCert], mustRead(t, path))
	entries, err := os.ReadDir(r.opts.CertDir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"tls.crt", "tls.key"}, names, "temporary files left behind")
}

func TestStartRenewsWhenDue(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk, func(o *Options) { o.CheckInterval = 10 * time.Millisecond })
	require.NoError(t, r.Sync(context.Background()))
	first := served(t, r)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	clk.SetTime(t0.Add(61 * day))
	assert.Eventually(t, func() bool {
		pair, err := tls.LoadX509KeyPair(filepath.Join(r.opts.CertDir, "tls.crt"), filepath.Join(r.opts.CertDir, "tls.key"))
		if err != nil {
			return false
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		return err == nil && cert.SerialNumber.Cmp(first.SerialNumber) != 0
	}, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	assert.False(t, r.NeedLeaderElection())
}

func TestReadyCheck(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk)
	require.Error(t, r.ReadyCheck(nil), "ready before any certificate")
	require.NoError(t, r.Sync(context.Background()))
	require.NoError(t, r.ReadyCheck(nil))
	clk.SetTime(t0.Add(91 * day))
	err := r.ReadyCheck(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "expired")

	// A replica that starts while the bundle cannot be set (a renewal
	// withheld by the others, or a configuration not made yet) serves a
	// certificate the API server does not trust: not ready (review 171).
	fresh := newRotator(t, newClient(t, nil, objects()[0]), clocktesting.NewFakePassiveClock(t0))
	require.Error(t, fresh.Sync(context.Background()))
	err = fresh.ReadyCheck(nil)
	require.ErrorContains(t, err, "CA bundle could not be set")
}

func TestNewRotatorOptions(t *testing.T) {
	_, err := NewRotator(nil, Options{CertDir: "/x"})
	assert.ErrorContains(t, err, "namespace")
	_, err = NewRotator(nil, Options{Namespace: "ns"})
	assert.ErrorContains(t, err, "cert dir")
	_, err = NewRotator(nil, Options{Namespace: "ns", CertDir: "/x", CAValidity: day, ServingValidity: 2 * day})
	assert.ErrorContains(t, err, "longer than the CA's")

	r, err := NewRotator(nil, Options{Namespace: "ns", CertDir: "/x"})
	require.NoError(t, err)
	assert.Equal(t, DefaultSecretName, r.opts.SecretName)
	assert.Equal(t, DefaultWebhookConfigurationName, r.opts.WebhookConfigurationName)
	assert.Equal(t, "tls.crt", r.opts.CertName)
	assert.Equal(t, DefaultServingValidity, r.opts.ServingValidity)
}

// TestRBACMarkersNameTheDefaults keeps the markers, which the manager's roles
// are generated from, naming the objects this package writes by default.
func TestRBACMarkersNameTheDefaults(t *testing.T) {
	src := string(mustRead(t, "webhookcerts.go"))
	assert.Contains(t, src, `resources=secrets,resourceNames=`+DefaultSecretName+`,verbs=get;update`)
	assert.Contains(t, src, `resources=validatingwebhookconfigurations,resourceNames=`+DefaultWebhookConfigurationName+`,verbs=get;patch`)
	for _, line := range strings.Split(src, "\n") {
		if strings.HasPrefix(line, "// +kubebuilder:rbac:") {
			assert.NotContains(t, line, "create", "create cannot be limited by name: %s", line)
			assert.Contains(t, line, "resourceNames=", "every right of this package is limited by name: %s", line)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// swapCAKey is a Secret whose CA key belongs to another CA.
func swapCAKey(t *testing.T) map[string][]byte {
	t.Helper()
	a, _, err := plan(nil, t0, testIssuance())
	require.NoError(t, err)
	b, _, err := plan(nil, t0, testIssuance())
	require.NoError(t, err)
	out := a.data
	out[KeyCAKey] = b.data[KeyCAKey]
	return out
}

// foreignServing is a Secret whose serving certificate another CA signed.
func foreignServing(t *testing.T) map[string][]byte {
	t.Helper()
	a, _, err := plan(nil, t0, testIssuance())
	require.NoError(t, err)
	b, _, err := plan(nil, t0, testIssuance())
	require.NoError(t, err)
	out := a.data
	out[KeyServingCert], out[KeyServingKey] = b.data[KeyServingCert], b.data[KeyServingKey]
	return out
}

func testIssuance() issuance {
	return issuance{
		dnsNames:        []string{DefaultServiceName + "." + namespace + ".svc", DefaultServiceName, DefaultServiceName + "." + namespace, DefaultServiceName + "." + namespace + ".svc.cluster.local"},
		caValidity:      DefaultCAValidity,
		servingValidity: DefaultServingValidity,
	}
}

// TestExpiryMetricFollowsTheServedCertificates: the gauge holds the NotAfter
// of the serving certificate in the cert dir and of its CA, from the first
// Sync and again after a renewal.
func TestExpiryMetricFollowsTheServedCertificates(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	reg := prometheus.NewPedanticRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	c := newClient(t, nil, objects()...)
	r := newRotator(t, c, clk, func(o *Options) { o.Metrics = metrics })

	expiry := func() map[string]float64 {
		t.Helper()
		families, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, f := range families {
			if f.GetName() != "ichor_webhook_certificate_expiry_timestamp_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				require.Len(t, m.GetLabel(), 1)
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	assert.Empty(t, expiry(), "nothing before a certificate is loaded")

	require.NoError(t, r.Sync(context.Background()))
	ca := certsIn(t, caBundleOf(t, c))[0]
	assert.Equal(t, map[string]float64{
		"serving": float64(served(t, r).NotAfter.Unix()),
		"ca":      float64(ca.NotAfter.Unix()),
	}, expiry())
	assert.Equal(t, float64(t0.Add(90*day).Unix()), expiry()["serving"])

	// Renewed two thirds into its life: the gauge moves with the files.
	clk.SetTime(t0.Add(61 * day))
	require.NoError(t, r.Sync(context.Background()))
	renewed := served(t, r)
	require.True(t, renewed.NotAfter.After(t0.Add(90*day)), "the serving certificate was not renewed")
	assert.Equal(t, float64(renewed.NotAfter.Unix()), expiry()["serving"])

	// A nil Metrics records nothing and does not fail.
	require.NoError(t, newRotator(t, c, clk).Sync(context.Background()))
	_, err = NewMetrics(reg)
	assert.Error(t, err, "registering twice is refused")
}
