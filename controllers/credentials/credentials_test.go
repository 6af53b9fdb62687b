package credentials_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	talosclient "github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/clustersecrets"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// The reconciler is called directly, on requests created without any webhook:
// the controller's own checks are what is proven here. It runs as a user with
// exactly the rights of its +kubebuilder:rbac markers.
var (
	env         *harness.Env
	eng         *engine.Engine
	ctrlClient  client.Client
	decisionLog = &syncBuffer{}
)

const controllerUser = "ichor-test:credentials-controller"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var err error
	env, err = harness.Start(ctx, harness.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the control plane:", err)
		return 1
	}
	defer env.Stop()
	if err := setup(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "set up:", err)
		return 1
	}
	defer eng.Stop(ctx)
	fmt.Fprintf(os.Stderr, "control plane ready in %s\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, env.TailLogs(30))
	}
	return code
}

func setup(ctx context.Context) error {
	var err error
	if eng, err = engine.New(ctx, engine.Options{DecisionLog: decisionLog, Log: os.Stderr, ID: "credentials-test"}); err != nil {
		return err
	}
	rules, err := webhooktest.MarkerRules("controllers/credentials")
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: controllerUser}, Rules: rules}
	if err := env.Client.Create(ctx, role); err != nil {
		return err
	}
	if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllerUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: controllerUser}},
	}); err != nil {
		return err
	}
	if err := waitAllowed(ctx, controllerUser, authorizationv1.ResourceAttributes{Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "delete"}); err != nil {
		return err
	}
	cfg, err := env.UserConfig(controllerUser)
	if err != nil {
		return err
	}
	ctrlClient, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	return err
}

func waitAllowed(ctx context.Context, user string, attrs authorizationv1.ResourceAttributes) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
		if err := env.Client.Create(ctx, sar); err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	})
}

type fixture struct {
	t   *testing.T
	ctx context.Context
	ns  string
	r   *credentials.Reconciler
	// now is the reconciler's clock: real time plus skew.
	skew time.Duration
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := strings.Trim(strings.ToLower(regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-")), "-")
	if len(ns) > 60 {
		ns = strings.Trim(ns[:60], "-")
	}
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	f := &fixture{t: t, ctx: ctx, ns: ns}
	f.r = &credentials.Reconciler{Client: ctrlClient, APIReader: ctrlClient, Engine: eng, Now: func() time.Time { return time.Now().Add(f.skew) }}
	f.cluster("demo", env.SecretsBundleSecret(ns, "talos-secrets"))
	return f
}

func (f *fixture) cluster(name string, secret *corev1.Secret) {
	f.t.Helper()
	if secret != nil {
		require.NoError(f.t, env.Client.Create(f.ctx, secret))
	}
	ref := "talos-secrets"
	if secret != nil {
		ref = secret.Name
	}
	require.NoError(f.t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: ref}},
	}))
}

// ask creates a request (as the admin: no webhook runs here) and has the
// reconciler answer it.
func (f *fixture) ask(cluster string, purpose ichorv1alpha1.CredentialPurpose, ttl string) (*ichorv1alpha1.TalosCredentialRequest, ed25519.PrivateKey) {
	f.t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(f.t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(f.t, err)
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, GenerateName: cluster + "-" + string(purpose) + "-"},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{
			ClusterName: cluster,
			Purpose:     purpose,
			PublicKey:   string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})),
		},
	}
	if ttl != "" {
		d, err := time.ParseDuration(ttl)
		require.NoError(f.t, err)
		tcr.Spec.TTL = &metav1.Duration{Duration: d}
	}
	require.NoError(f.t, env.Client.Create(f.ctx, tcr))
	res, err := f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)})
	require.NoError(f.t, err)
	assert.Equal(f.t, credentials.DefaultRetention, res.RequeueAfter)
	require.NoError(f.t, env.Client.Get(f.ctx, client.ObjectKeyFromObject(tcr), tcr))
	return tcr, key
}

func ready(t *testing.T, tcr *ichorv1alpha1.TalosCredentialRequest) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady)
	require.NotNil(t, c, "no Ready condition: %+v", tcr.Status)
	return c
}

func parseCert(t *testing.T, pemText string) *x509.Certificate {
	t.Helper()
	block, rest := pem.Decode([]byte(pemText))
	require.NotNil(t, block)
	assert.Empty(t, bytes.TrimSpace(rest))
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return cert
}

func pool(t *testing.T, pemText string) (*x509.CertPool, []*x509.Certificate) {
	t.Helper()
	p := x509.NewCertPool()
	var certs []*x509.Certificate
	rest := []byte(pemText)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		p.AddCert(c)
		certs = append(certs, c)
	}
	return p, certs
}

func verify(cert *x509.Certificate, roots *x509.CertPool) error {
	_, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err
}

func TestReaderCertificateIsExactlyOSReaderAndVerifiesAgainstTheTrustBundle(t *testing.T) {
	f := newFixture(t)
	tcr, key := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "")

	c := ready(t, tcr)
	assert.Equal(t, metav1.ConditionTrue, c.Status)
	assert.Equal(t, ichorv1alpha1.ReasonIssued, c.Reason)
	assert.Contains(t, c.Message, "IchorCredentialIssuable: an os:reader talosconfig with lifetime 1h0m0s may be signed")

	cert := parseCert(t, tcr.Status.Certificate)
	assert.Equal(t, []string{"os:reader"}, cert.Subject.Organization)
	assert.True(t, key.Public().(ed25519.PublicKey).Equal(cert.PublicKey))
	assert.Equal(t, time.Hour, cert.NotAfter.Sub(cert.NotBefore))
	assert.WithinDuration(t, time.Now().Add(time.Hour), cert.NotAfter, time.Minute)
	require.NotNil(t, tcr.Status.ExpiresAt)
	assert.True(t, tcr.Status.ExpiresAt.Time.Equal(cert.NotAfter))
	assert.Equal(t, tcr.Generation, tcr.Status.ObservedGeneration)

	roots, trust := pool(t, tcr.Status.TrustBundle)
	require.Len(t, trust, 1)
	osCA, _ := env.OSCA()
	assert.Equal(t, strings.TrimSpace(string(osCA)), strings.TrimSpace(tcr.Status.TrustBundle))
	require.NoError(t, verify(cert, roots))

	// Talos reads the role from O= with its own parser: the role set is
	// exactly os:reader.
	node, err := env.StartTalosNode(f.ctx, harness.NodeOptions{Name: "reader-node"})
	require.NoError(t, err)
	t.Cleanup(node.Stop)
	tlsCert := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key}
	assertTalosReader(t, node.Server, roots, tlsCert)
}

func TestLifetimeCapsInTheController(t *testing.T) {
	f := newFixture(t)

	tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "12h")
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason)
	cert := parseCert(t, tcr.Status.Certificate)
	assert.Equal(t, 12*time.Hour, cert.NotAfter.Sub(cert.NotBefore))

	for _, ttl := range []string{"12h0m1s", "13h"} {
		tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, ttl)
		c := ready(t, tcr)
		assert.Equal(t, metav1.ConditionFalse, c.Status, ttl)
		assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason, ttl)
		assert.Contains(t, c.Message, "LifetimeTooLong: the lifetime "+(mustDuration(t, ttl)).String()+" is above the cap of 12h0m0s", ttl)
		assert.Empty(t, tcr.Status.Certificate, ttl)
		assert.Empty(t, tcr.Status.TrustBundle, ttl)
		assert.Nil(t, tcr.Status.ExpiresAt, ttl)

		// The refusal was decided by the issuance rule and logged.
		m := regexp.MustCompile(`\(decision ([0-9a-f-]+)\)`).FindStringSubmatch(c.Message)
		require.NotNil(t, m, c.Message)
		entry := decisionLog.find(t, m[1])
		assert.Equal(t, engine.PathCredentialIssuance, entry.Path)
		assert.False(t, entry.Result.Allowed)
	}
}

func TestAdminKubeconfigWorksUntilItsBindingIsDeleted(t *testing.T) {
	f := newFixture(t)
	// The binding is installed with Ichor (the chart); the controller never creates it.
	binding := adminBinding()
	_ = env.Client.Delete(f.ctx, binding.DeepCopy())
	require.NoError(t, env.Client.Create(f.ctx, binding))

	tcr, key := f.ask("demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
	cert := parseCert(t, tcr.Status.Certificate)
	assert.Equal(t, []string{credentials.AdminGroup}, cert.Subject.Organization)
	assert.Equal(t, "ichor-credential:kubeconfig-admin", cert.Subject.CommonName)
	roots, _ := pool(t, tcr.Status.TrustBundle)
	require.NoError(t, verify(cert, roots))
	k8sCA, _ := env.KubernetesCA()
	assert.Equal(t, strings.TrimSpace(string(k8sCA)), strings.TrimSpace(tcr.Status.TrustBundle))

	cs := certClient(t, tcr.Status.Certificate, key)
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(f.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, "ichor-credential:kubeconfig-admin", review.Status.UserInfo.Username)
	assert.Contains(t, review.Status.UserInfo.Groups, credentials.AdminGroup)
	assert.NotContains(t, review.Status.UserInfo.Groups, "system:masters")
	require.Eventually(t, func() bool {
		_, err := cs.CoreV1().Namespaces().List(f.ctx, metav1.ListOptions{})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the admin kubeconfig cannot list namespaces")

	// Revocation: one delete.
	require.NoError(t, env.Client.Delete(f.ctx, binding.DeepCopy()))
	require.Eventually(t, func() bool {
		_, err := cs.CoreV1().Namespaces().List(f.ctx, metav1.ListOptions{})
		return apierrors.IsForbidden(err)
	}, 30*time.Second, 100*time.Millisecond, "the admin kubeconfig still works after its binding was deleted")

	// A new request is refused, not answered by recreating the binding, which
	// would restore the revoked kubeconfigs (a leaked one included).
	again, _ := f.ask("demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	require.Equal(t, ichorv1alpha1.ReasonFailed, ready(t, again).Reason, ready(t, again).Message)
	assert.Contains(t, ready(t, again).Message, "admin kubeconfigs are revoked")
	assert.Empty(t, again.Status.Certificate)
	err = env.Client.Get(f.ctx, types.NamespacedName{Name: credentials.AdminBinding}, &rbacv1.ClusterRoleBinding{})
	assert.True(t, apierrors.IsNotFound(err), "the controller recreated the binding: %v", err)
	_, err = cs.CoreV1().Namespaces().List(f.ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the revoked kubeconfig works again: %v", err)
}

// adminBinding is the binding the chart installs.
func adminBinding() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: credentials.AdminBinding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: credentials.AdminClusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: credentials.AdminGroup}},
	}
}

func TestBreakGlassIsSystemMastersAndBindsNothing(t *testing.T) {
	f := newFixture(t)
	var before rbacv1.ClusterRoleBindingList
	require.NoError(t, env.Client.List(f.ctx, &before))

	tcr, key := f.ask("demo", ichorv1alpha1.PurposeKubeconfigSuperAdmin, "")
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason)
	cert := parseCert(t, tcr.Status.Certificate)
	assert.Equal(t, []string{"system:masters"}, cert.Subject.Organization)
	assert.Equal(t, 15*time.Minute, cert.NotAfter.Sub(cert.NotBefore))

	var after rbacv1.ClusterRoleBindingList
	require.NoError(t, env.Client.List(f.ctx, &after))
	assert.Equal(t, names(before.Items), names(after.Items), "issuing the break-glass kubeconfig changed the bindings")

	review, err := certClient(t, tcr.Status.Certificate, key).AuthenticationV1().SelfSubjectReviews().Create(f.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Contains(t, review.Status.UserInfo.Groups, "system:masters")
}

func TestRotationIssuesFromTheNewCAWithBothTrusted(t *testing.T) {
	f := newFixture(t)
	// The rotation state: a new OS CA current, the harness's bundle previous.
	newCA, err := talosapi.NewCA()
	require.NoError(t, err)
	current, err := clustersecrets.Parse(env.SecretsBundleYAML)
	require.NoError(t, err)
	current.Certs.OS = newCA.PEMEncoded()
	data, err := clustersecrets.Marshal(current)
	require.NoError(t, err)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "rotating-secrets"},
		Data: map[string][]byte{
			ichorv1alpha1.DefaultSecretsBundleKey: data,
			clustersecrets.PreviousKey:            env.SecretsBundleYAML,
		},
	}
	f.cluster("rotating", secret)

	tcr, key := f.ask("rotating", ichorv1alpha1.PurposeTalosconfigReader, "")
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
	cert := parseCert(t, tcr.Status.Certificate)

	roots, trust := pool(t, tcr.Status.TrustBundle)
	require.Len(t, trust, 2)
	oldCA, _ := env.OSCA()
	assert.Equal(t, parseCert(t, string(newCA.CertPEM)).Raw, trust[0].Raw, "the current CA comes first")
	assert.Equal(t, parseCert(t, string(oldCA)).Raw, trust[1].Raw)
	require.NoError(t, verify(cert, roots))
	require.NoError(t, verify(cert, newCA.Pool()), "signed by the new CA")
	require.Error(t, verify(cert, env.TalosCA().Pool()), "not signed by the old CA")

	// A node already on the new CA accepts it; the trust bundle verifies a
	// node on either CA.
	node, err := talosapi.Start(f.ctx, talosapi.Options{CA: newCA, Nodename: "rotated-node", Hostname: "rotated-node"})
	require.NoError(t, err)
	t.Cleanup(node.Stop)
	assertTalosReader(t, node, roots, tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key})
}

func TestAnsweredRequestIsDeletedAfterTwoMinutes(t *testing.T) {
	f := newFixture(t)
	tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "13h")
	answered := ready(t, tcr).LastTransitionTime.Time
	key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)}

	f.skew = time.Until(answered.Add(credentials.DefaultRetention - 10*time.Second))
	res, err := f.r.Reconcile(f.ctx, key)
	require.NoError(t, err)
	assert.InDelta(t, (10 * time.Second).Seconds(), res.RequeueAfter.Seconds(), 1)
	require.NoError(t, env.Client.Get(f.ctx, key.NamespacedName, tcr), "deleted before its two minutes")

	f.skew = time.Until(answered.Add(credentials.DefaultRetention + time.Second))
	res, err = f.r.Reconcile(f.ctx, key)
	require.NoError(t, err)
	assert.Zero(t, res.RequeueAfter)
	assert.True(t, apierrors.IsNotFound(env.Client.Get(f.ctx, key.NamespacedName, tcr)), "not deleted after two minutes")
	assert.Equal(t, 2*time.Minute, credentials.DefaultRetention)
}

func TestMissingClusterOrSecretsFail(t *testing.T) {
	f := newFixture(t)
	f.cluster("no-secrets", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "empty"}})

	for cluster, want := range map[string]string{
		"absent":     `TalosCluster ` + f.ns + `/absent`,
		"no-secrets": `Secret "empty" has no key "secrets.yaml"`,
	} {
		tcr, _ := f.ask(cluster, ichorv1alpha1.PurposeTalosconfigReader, "")
		c := ready(t, tcr)
		assert.Equal(t, metav1.ConditionFalse, c.Status, cluster)
		assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason, cluster)
		assert.Contains(t, c.Message, want, cluster)
		assert.Empty(t, tcr.Status.Certificate, cluster)
	}
}

// assertTalosReader reads the node with the certificate through the real
// Talos client (Version, a COSI read) and is refused Reboot.
func assertTalosReader(t *testing.T, node *talosapi.Server, roots *x509.CertPool, cert tls.Certificate) {
	t.Helper()
	c := talosClient(t, node.Endpoint(), roots, cert)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := c.Version(ctx)
	require.NoError(t, err)
	err = c.Reboot(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PermissionDenied")
	assert.Zero(t, node.Reboots())
	seen := node.ClientCertificates()
	require.NotEmpty(t, seen)
	assert.Equal(t, []string{"os:reader"}, seen[0].Subject.Organization)
}

func certClient(t *testing.T, certPEM string, key crypto.PrivateKey) kubernetes.Interface {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.CertData = []byte(certPEM)
	cfg.KeyData = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return cs
}

func names(items []rbacv1.ClusterRoleBinding) []string {
	out := make([]string, 0, len(items))
	for _, b := range items {
		out = append(out, b.Name)
	}
	slices.Sort(out)
	return out
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}

func talosClient(t *testing.T, endpoint string, roots *x509.CertPool, cert tls.Certificate) *talosclient.Client {
	t.Helper()
	c, err := talosclient.New(t.Context(), talosclient.WithEndpoints(endpoint), talosclient.WithTLSConfig(&tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// syncBuffer is the decision log the engine writes to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

type logEntry struct {
	DecisionID string                    `json:"decision_id"`
	Path       string                    `json:"path"`
	Result     engine.CredentialIssuance `json:"result"`
}

func (b *syncBuffer) find(t *testing.T, id string) logEntry {
	t.Helper()
	var found *logEntry
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
		sc.Buffer(make([]byte, 0, 1<<20), 1<<24)
		for sc.Scan() {
			var e logEntry
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.DecisionID == id {
				found = &e
				return true
			}
		}
		return false
	}, 5*time.Second, 50*time.Millisecond, "decision %s is not in the log", id)
	return *found
}
