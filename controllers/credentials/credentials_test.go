package credentials_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	talosclient "github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	clusterfacts "github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/policy"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
	"github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// The reconciler is called directly, as a user with exactly the rights of its
// +kubebuilder:rbac markers, on requests that the real admission webhook (and
// the ValidatingAdmissionPolicy that pins spec.requester) saw or, where a test
// says so, did not see. The webhook decides with a bundle whose
// talosconfig-reader cap is 24 hours, a policy that changed between admission
// and issuance: the issuer holds requests to its own, current caps.
var (
	env         *harness.Env
	eng         *engine.Engine
	ctrlClient  client.Client
	keys        *credential.Keys
	recorder    events.EventRecorder
	decisionLog = &harness.DecisionLog{}
	// local are the clusters named as those of this API server.
	local = &clusterfacts.Local{}
	// webhookConfig is the installed ValidatingWebhookConfiguration, to
	// remove and restore it.
	webhookConfig *admissionregistrationv1.ValidatingWebhookConfiguration
	// bindings is the controller's cache of the admins' bindings, as the
	// manager makes it: label-selected, indexed by identity.
	bindings cache.Cache
)

const (
	controllerUser = "ichor-test:credentials-controller"
	webhookUser    = "ichor-test:credentials-webhook"
	keyNamespace   = harness.ManagerNamespace
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Options{AuditLog: true}, func(ctx context.Context, e *harness.Env) (func(), error) {
		env = e
		install, err := setup(ctx)
		return func() {
			if eng != nil {
				eng.Stop(context.Background())
			}
			if install != nil {
				_ = install.Cleanup() // a temporary directory
			}
		}, err
	}))
}

func setup(ctx context.Context) (*envtest.WebhookInstallOptions, error) {
	var err error
	if eng, err = engine.New(ctx, engine.Options{DecisionLog: decisionLog, Log: os.Stderr, ID: "credentials-test"}); err != nil {
		return nil, err
	}
	// The controller and the webhook, each with the rights of its markers,
	// the admission key's Role included.
	keyRules, err := webhooktest.NamespacedMarkerRules("internal/facts/credential")
	if err != nil {
		return nil, err
	}
	for user, pkg := range map[string]string{controllerUser: "controllers/credentials", webhookUser: "webhook"} {
		rules, err := webhooktest.MarkerRules(pkg)
		if err != nil {
			return nil, err
		}
		if err := grant(ctx, user, rules, keyRules); err != nil {
			return nil, err
		}
	}
	cfg, err := env.UserConfig(controllerUser)
	if err != nil {
		return nil, err
	}
	if ctrlClient, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		return nil, err
	}
	keys = env.AdmissionKeys(ctrlClient)
	if err := startBindingCache(ctx, cfg); err != nil {
		return nil, err
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: clientset.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	recorder = broadcaster.NewRecorder(env.Scheme, "ichor-credentials")
	// A role that may only make requests, which the webhook refuses for
	// every purpose.
	if err := env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "ichor-test:requests-only"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"},
	}}}); err != nil {
		return nil, err
	}
	roles, err := webhooktest.ShippedRoles()
	if err != nil {
		return nil, err
	}
	for i := range roles {
		if err := env.Client.Create(ctx, &roles[i]); err != nil {
			return nil, err
		}
	}
	if err := webhooktest.InstallAdmissionPolicies(ctx, env.Client, "default"); err != nil {
		return nil, err
	}
	return startWebhook(ctx)
}

// startBindingCache starts the cache of the admins' bindings as the manager
// has it (internal/manager): only those labelled as Ichor's, read with the
// controller's rights.
func startBindingCache(ctx context.Context, cfg *rest.Config) error {
	var err error
	bindings, err = cache.New(cfg, cache.Options{Scheme: env.Scheme, ByObject: map[client.Object]cache.ByObject{
		&rbacv1.ClusterRoleBinding{}: {Label: labels.SelectorFromSet(labels.Set{credentials.LabelAdminBinding: "true"})},
	}})
	if err != nil {
		return err
	}
	if err := credentials.IndexAdminBindings(ctx, bindings); err != nil {
		return err
	}
	go func() { _ = bindings.Start(ctx) }()
	// Blocks until the informer has listed.
	_, err = bindings.GetInformer(ctx, &rbacv1.ClusterRoleBinding{})
	return err
}

// grant gives user the cluster rules and, in the key's namespace, the
// namespaced ones, and waits until they count.
func grant(ctx context.Context, user string, rules, namespaced []rbacv1.PolicyRule) error {
	name := strings.ReplaceAll(user, ":", "-")
	subjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}
	for _, obj := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: keyNamespace, Name: name}, Rules: namespaced},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: keyNamespace, Name: name}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}},
	} {
		if err := env.Client.Create(ctx, obj); err != nil {
			return err
		}
	}
	return env.WaitAllowed(ctx, user, nil, authorizationv1.ResourceAttributes{Namespace: keyNamespace, Resource: "secrets", Name: credential.DefaultKeySecretName, Verb: "update"})
}

// startWebhook serves the real webhook, as webhookUser, with a bundle whose
// talosconfig-reader cap is 24 hours, so that the controller's own check
// of the cap is what refuses 13 hours.
func startWebhook(ctx context.Context) (*envtest.WebhookInstallOptions, error) {
	lenient, err := lenientBundle()
	if err != nil {
		return nil, err
	}
	webhookEngine, err := engine.New(ctx, engine.Options{Bundle: lenient, DecisionLog: io.Discard, Log: os.Stderr, ID: "credentials-test-webhook"})
	if err != nil {
		return nil, err
	}
	if err := env.AtStop(func() { webhookEngine.Stop(context.Background()) }); err != nil {
		return nil, err
	}
	install, err := webhooktest.Install(env.Config)
	if err != nil {
		return nil, err
	}
	done := func(err error) (*envtest.WebhookInstallOptions, error) { return install, err }
	webhookConfig = &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: webhooktest.ConfigurationName}, webhookConfig); err != nil {
		return done(err)
	}
	cfg, err := env.UserConfig(webhookUser)
	if err != nil {
		return done(err)
	}
	mgr, err := env.NewManager(cfg, crwebhook.NewServer(webhooktest.ServerOptions(install)))
	if err != nil {
		return done(err)
	}
	webhookClient, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return done(err)
	}
	v := &webhook.CredentialRequestValidator{Engine: webhookEngine, Instance: "credentials-test", LocalClusters: local,
		Keys: env.AdmissionKeys(webhookClient)}
	if err := v.SetupWithManager(mgr); err != nil {
		return done(err)
	}
	harness.RunManager(ctx, mgr, "webhook manager")
	return done(webhooktest.WaitWebhook(ctx, env.Client, "default", true))
}

type fixture struct {
	t   *testing.T
	ctx context.Context
	ns  string
	r   *credentials.Reconciler
	// now is the reconciler's clock: real time plus skew.
	skew time.Duration
}

// skewedClock is real time plus the fixture's skew.
type skewedClock struct{ f *fixture }

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.f.skew) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := strings.Trim(strings.ToLower(regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-")), "-")
	if len(ns) > 60 {
		ns = strings.Trim(ns[:60], "-")
	}
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	f := &fixture{t: t, ctx: ctx, ns: ns}
	f.r = &credentials.Reconciler{
		Client: ctrlClient, APIReader: ctrlClient, Bindings: bindings, Engine: eng, Keys: keys, AdminKubeconfigs: true, Recorder: recorder, LocalClusters: local,
		Clock: skewedClock{f},
	}
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
	// Each test's clusters are this API server's, as the operator names them.
	local.Add(types.NamespacedName{Namespace: f.ns, Name: name})
	require.NoError(f.t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: ref}},
	}))
}

// ask creates a request as the admin, through the webhook, and has the
// reconciler answer it.
func (f *fixture) ask(cluster string, purpose ichorv1alpha1.CredentialPurpose, ttl string) (*ichorv1alpha1.TalosCredentialRequest, ed25519.PrivateKey) {
	f.t.Helper()
	tcr, key := f.create(f.admin(), cluster, purpose, ttl)
	return f.answer(tcr), key
}

// admin is the admin's client, recording them as the requester.
func (f *fixture) admin() client.Client {
	f.t.Helper()
	c, err := webhooktest.Requesting(f.ctx, env.Client)
	require.NoError(f.t, err)
	return c
}

// create creates a request as the user of c.
func (f *fixture) create(c client.Client, cluster string, purpose ichorv1alpha1.CredentialPurpose, ttl string) (*ichorv1alpha1.TalosCredentialRequest, ed25519.PrivateKey) {
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
		tcr.Spec.TTL = &metav1.Duration{Duration: mustDuration(f.t, ttl)}
	}
	require.NoError(f.t, c.Create(f.ctx, tcr))
	return tcr, key
}

// answer has the reconciler answer the request and returns it answered.
func (f *fixture) answer(tcr *ichorv1alpha1.TalosCredentialRequest) *ichorv1alpha1.TalosCredentialRequest {
	f.t.Helper()
	answered := meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady) != nil
	res, err := f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)})
	require.NoError(f.t, err)
	if !answered {
		// Kept for the retention from now.
		assert.Equal(f.t, credentials.DefaultRetention, res.RequeueAfter)
	}
	out := &ichorv1alpha1.TalosCredentialRequest{}
	require.NoError(f.t, env.Client.Get(f.ctx, client.ObjectKeyFromObject(tcr), out))
	return out
}

// user is a person bound to role in the fixture's namespace, whose client
// records them as the requester.
func (f *fixture) user(name, role string) client.Client {
	f.t.Helper()
	require.NoError(f.t, env.Client.Create(f.ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: strings.ReplaceAll(name, ":", "-")},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}))
	require.NoError(f.t, env.WaitAllowed(f.ctx, name, nil, authorizationv1.ResourceAttributes{Namespace: f.ns, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"}))
	cfg, err := env.UserConfig(name)
	require.NoError(f.t, err)
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(f.t, err)
	c, err = webhooktest.Requesting(f.ctx, c)
	require.NoError(f.t, err)
	return c
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

// A bundle whose reasons for an issuance are longer than a condition's
// message may be has the request answered Issued once, its message clipped:
// before, the status write was refused as invalid, and each retry signed a
// new certificate (review 197A F3).
func TestAnIssuanceWithLongReasonsIsAnsweredOnce(t *testing.T) {
	f := newFixture(t)
	decided := 0
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		decided++
		d, err := eng.Issuance(ctx, in)
		if err == nil && len(d.Reasons) > 0 {
			d.Reasons[0].Message += strings.Repeat("\x1b[31m long", 8<<10)
		}
		return d, err
	}}
	t.Cleanup(func() { f.r.Engine = eng })
	tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	c := ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonIssued, c.Reason)
	assert.LessOrEqual(t, len(c.Message), engine.MaxConditionMessage)
	assert.NotContains(t, c.Message, "\x1b", "escaped")
	assert.Contains(t, c.Message, "more bytes in the decision log")
	assert.Contains(t, c.Message, "(decision ")
	assert.NotEmpty(t, tcr.Status.Certificate)
	assert.Equal(t, 1, decided, "decided and signed more than once")
}

// An answer the API server stored and answered with a timeout (its etcd
// slow) is the answer: the request is not decided and signed again, and
// the credential delivered has its applied record. Before, the write's
// error retried the request, which was decided and signed a second time,
// and the first decision, the one delivered, was never recorded as applied
// (review 197A F2).
func TestAnAnswerStoredButAnsweredWithATimeoutIsRecordedOnce(t *testing.T) {
	f := newFixture(t)
	decided := 0
	f.r.Engine = countingIssuance(&decided)
	f.r.Client = storedThenTimedOut{ctrlClient}
	tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	c := ready(t, tcr)
	require.Equal(t, ichorv1alpha1.ReasonIssued, c.Reason)
	id := decisionIDOf(t, c.Message)
	waitFor(t, "the applied record of the answer stored", func() (bool, error) { return len(appliedRecords(id)) == 1, nil })
	assert.Equal(t, engine.AppliedObserved, appliedRecords(id)[0].Outcome, "seen stored, not said to be")
	assert.Equal(t, 1, decided, "decided (and signed) again")
}

// countingIssuance is the engine, counting in decided the issuance
// decisions it makes.
func countingIssuance(decided *int) *enginetest.Engine {
	return &enginetest.Engine{Engine: eng, IssuanceFunc: func(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		*decided++
		return eng.Issuance(ctx, in)
	}}
}

// appliedRecords are the applied records of decision id in the decision log.
func appliedRecords(id string) []engine.Applied {
	type record struct {
		Path  string         `json:"path"`
		Input engine.Applied `json:"input"`
	}
	var out []engine.Applied
	for _, e := range harness.Decisions(decisionLog, func(e record) bool {
		return e.Path == engine.PathApplied && e.Input.DecisionID == id
	}) {
		out = append(out, e.Input)
	}
	return out
}

// An answer whose write had an unknown outcome, and whose request could not
// be read back, is recorded as applied when the retry finds it stored, even
// where the manager's cache does not show it yet (the retry reads the API
// server then, rather than decide and sign again): the credential it
// delivered has its record, and a refusal its Warning Event. Before, the
// retry found the request answered and went on to its expiry, with no
// record and no Event (review 226 F3).
func TestAnUnreadAnswerIsRecordedOnceSeenStored(t *testing.T) {
	for name, ttl := range map[string]string{"issued": "", "refused": "13h"} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			decided := 0
			f.r.Engine = countingIssuance(&decided)
			f.r.Client = storedThenTimedOut{ctrlClient}
			f.r.APIReader = requestsUnreadable{ctrlClient}
			tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, ttl)
			key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)}
			_, err := f.r.Reconcile(f.ctx, key)
			require.ErrorContains(t, err, "write the answer")

			// The cache still shows the request as it was before the answer.
			f.r.Client, f.r.APIReader = lagging{Client: ctrlClient, before: tcr}, ctrlClient
			_, err = f.r.Reconcile(f.ctx, key)
			require.NoError(t, err)
			assert.Equal(t, 1, decided, "decided (and signed) again")
			require.NoError(t, env.Client.Get(f.ctx, key.NamespacedName, tcr))
			id := decisionIDOf(t, ready(t, tcr).Message)
			waitFor(t, "the applied record of the answer stored", func() (bool, error) { return len(appliedRecords(id)) == 1, nil })
			assert.Equal(t, engine.AppliedObserved, appliedRecords(id)[0].Outcome, "seen stored, not said to be")
			if ttl != "" {
				require.Equal(t, ichorv1alpha1.ReasonRefused, ready(t, tcr).Reason)
				assert.Len(t, refusedEvents(t, f.ns, 1), 1, "the refusal's Warning Event, once it is seen stored")
			}

			f.r.Client = ctrlClient
			_, err = f.r.Reconcile(f.ctx, key)
			require.NoError(t, err)
			assert.Len(t, appliedRecords(id), 1, "recorded once")
		})
	}
}

// lagging is a client whose cache has not caught up: it reads the request
// before as it was.
type lagging struct {
	client.Client
	before *ichorv1alpha1.TalosCredentialRequest
}

func (c lagging) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if tcr, ok := obj.(*ichorv1alpha1.TalosCredentialRequest); ok && key == client.ObjectKeyFromObject(c.before) {
		c.before.DeepCopyInto(tcr)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// An answer whose write timed out without being stored, and which the
// request read back shows no answer for yet, is not recorded as applied
// once another answer is stored in its place: only the answer the request
// names is.
func TestAnAnswerOfUnknownOutcomeNeverStoredIsNotRecorded(t *testing.T) {
	f := newFixture(t)
	var ids []string
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		d, err := eng.Issuance(ctx, in)
		ids = append(ids, d.DecisionID)
		return d, err
	}}
	f.r.Client = timedOutUnstored{ctrlClient}
	tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)}
	_, err := f.r.Reconcile(f.ctx, key)
	require.ErrorContains(t, err, "write the answer")

	f.r.Client = ctrlClient
	for range 2 {
		_, err = f.r.Reconcile(f.ctx, key)
		require.NoError(t, err)
	}
	require.Len(t, ids, 2, "decided again after the write that was not stored")
	require.NoError(t, env.Client.Get(f.ctx, key.NamespacedName, tcr))
	require.Equal(t, ids[1], decisionIDOf(t, ready(t, tcr).Message))
	waitFor(t, "the applied record of the answer stored", func() (bool, error) { return len(appliedRecords(ids[1])) == 1, nil })
	assert.Empty(t, appliedRecords(ids[0]), "the answer never stored is recorded as applied")
}

// An applied record the engine refuses (its file sink full) is made when
// the request is looked at again, soon: before, it was logged and
// forgotten, and the credential delivered had no record.
func TestARefusedAppliedRecordIsMadeAgain(t *testing.T) {
	f := newFixture(t)
	decided := 0
	refusing := &refusedOnce{Decider: countingIssuance(&decided)}
	f.r.Engine = refusing
	tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	before := tcr.DeepCopy()
	key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)}
	res, err := f.r.Reconcile(f.ctx, key)
	require.NoError(t, err)
	require.Equal(t, 1, refusing.refused)
	assert.Less(t, res.RequeueAfter, credentials.DefaultRetention, "looked at again before its expiry")
	require.NoError(t, env.Client.Get(f.ctx, key.NamespacedName, tcr))
	id := decisionIDOf(t, ready(t, tcr).Message)
	assert.Empty(t, appliedRecords(id))

	// The next look, 5 s on, may find a cache that does not show the
	// answer yet: the answer is read from the API server, not decided and
	// signed again.
	f.r.Client = lagging{Client: ctrlClient, before: before}
	_, err = f.r.Reconcile(f.ctx, key)
	require.NoError(t, err)
	f.r.Client = ctrlClient
	waitFor(t, "the applied record made again", func() (bool, error) { return len(appliedRecords(id)) == 1, nil })
	assert.Equal(t, engine.AppliedWritten, appliedRecords(id)[0].Outcome)
	assert.Equal(t, 1, decided, "decided (and signed) again")

	// One owed of a request deleted before it was made again is made all
	// the same: the credential was delivered.
	refusing.left = 1
	tcr, _ = f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	key = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)}
	_, err = f.r.Reconcile(f.ctx, key)
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(f.ctx, key.NamespacedName, tcr))
	id = decisionIDOf(t, ready(t, tcr).Message)
	require.NoError(t, env.Client.Delete(f.ctx, tcr))
	waitFor(t, "the request deleted", func() (bool, error) {
		err := env.Client.Get(f.ctx, key.NamespacedName, tcr)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	_, err = f.r.Reconcile(f.ctx, key)
	require.NoError(t, err)
	waitFor(t, "the applied record of a request gone", func() (bool, error) { return len(appliedRecords(id)) == 1, nil })
}

// refusedOnce is the engine with its applied records refused, once at
// first and as many times as left says after.
type refusedOnce struct {
	credentials.Decider
	refused, left int
}

func (e *refusedOnce) RecordApplied(ctx context.Context, a engine.Applied) error {
	if e.refused == 0 || e.left > 0 {
		if e.refused > 0 {
			e.left--
		}
		e.refused++
		return errors.New("the decision log's file is full")
	}
	return e.Decider.RecordApplied(ctx, a)
}

// requestsUnreadable is a reader that cannot read requests back, as when
// the API server stopped answering after a write.
type requestsUnreadable struct{ client.Reader }

func (r requestsUnreadable) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*ichorv1alpha1.TalosCredentialRequest); ok {
		return apierrors.NewServiceUnavailable("the API server is not reachable")
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// timedOutUnstored is a client whose status writes time out without being
// stored.
type timedOutUnstored struct{ client.Client }

func (c timedOutUnstored) Status() client.SubResourceWriter { return timedOutUnstoredStatus{} }

type timedOutUnstoredStatus struct{ client.SubResourceWriter }

func (timedOutUnstoredStatus) Update(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
	return apierrors.NewTimeoutError("request did not complete within the allowed duration", 1)
}

// storedThenTimedOut is a client whose status writes are stored, and then
// answered with a timeout, as an API server whose storage was slow answers.
type storedThenTimedOut struct{ client.Client }

func (c storedThenTimedOut) Status() client.SubResourceWriter {
	return storedThenTimedOutStatus{c.Client.Status()}
}

type storedThenTimedOutStatus struct{ client.SubResourceWriter }

func (w storedThenTimedOutStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := w.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	return apierrors.NewTimeoutError("request did not complete within the allowed duration", 1)
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
		entry := harness.FindDecision[logEntry](t, decisionLog, m[1])
		assert.Equal(t, engine.PathCredentialIssuance, entry.Path)
		assert.False(t, entry.Result.Allowed)
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
	// It names the person, as the admin kubeconfig does.
	assert.Equal(t, "ichor-super-admin:"+identityPart(t, f.admin()), cert.Subject.CommonName)

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
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "rotating-secrets", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "rotating"}},
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

// Whoever may write a TalosCluster, and is granted credentials for it alone,
// cannot have them signed by another cluster's CAs by pointing its
// secretsRef at that cluster's Secret: both SubjectAccessReviews name the
// cluster, and the admission record pins its UID, none of them its CAs
// (review of 2026-12-05). The Secret names the clusters that may use it;
// only whoever may write the Secret may add one.
func TestACredentialIsNotSignedWithAnotherClustersCAs(t *testing.T) {
	f := newFixture(t)
	claimed := func(name, cluster string, data []byte) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: cluster}},
			Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: data},
		}
	}
	f.cluster("mine", claimed("mine-secrets", "mine", env.SecretsBundleYAML))
	prodCA, err := talosapi.NewCA()
	require.NoError(t, err)
	prod, err := clustersecrets.Parse(env.SecretsBundleYAML)
	require.NoError(t, err)
	prod.Certs.OS = prodCA.PEMEncoded()
	data, err := clustersecrets.Marshal(prod)
	require.NoError(t, err)
	f.cluster("prod", claimed("prod-secrets", "prod", data))

	tcr, _ := f.ask("mine", ichorv1alpha1.PurposeTalosconfigReader, "")
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
	require.NoError(t, verify(parseCert(t, tcr.Status.Certificate), env.TalosCA().Pool()), "signed by its own cluster's CA")

	// Its cluster pointed at prod's Secret, as whoever may update
	// TalosClusters but not read Secrets could.
	point := func(ref string) {
		t.Helper()
		var mine ichorv1alpha1.TalosCluster
		require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "mine"}, &mine))
		patch := client.MergeFrom(mine.DeepCopy())
		mine.Spec.SecretsRef.Name = ref
		require.NoError(t, env.Client.Patch(f.ctx, &mine, patch))
	}
	point("prod-secrets")
	tcr, _ = f.ask("mine", ichorv1alpha1.PurposeTalosconfigReader, "")
	c := ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason, "the rule's refusal, not a failure after it")
	assert.Contains(t, c.Message, `SecretsNotClaimed: TalosCluster "mine" may not use the CAs of Secret "prod-secrets": the Secret does not name this TalosCluster: its annotation ichor.dev/talos-clusters names "prod", not "mine"`)
	assert.Empty(t, tcr.Status.Certificate, "nothing signed with prod's CA")
	assert.Empty(t, tcr.Status.TrustBundle)
	// The decision log says so, with the fact it was refused on.
	logged := harness.FindDecision[struct {
		Input struct {
			Secrets engine.SecretsFacts `json:"secrets"`
		} `json:"input"`
		Result engine.CredentialIssuance `json:"result"`
	}](t, decisionLog, decisionIDOf(t, c.Message))
	assert.False(t, logged.Result.Allowed)
	assert.Equal(t, []string{"SecretsNotClaimed"}, codesOf(logged.Result.Reasons))
	assert.Equal(t, engine.SecretsFacts{Secret: "prod-secrets", Read: true, ClaimError: logged.Input.Secrets.ClaimError}, logged.Input.Secrets, "read, not claimed, so not usable")
	assert.Contains(t, logged.Input.Secrets.ClaimError, `names "prod", not "mine"`)

	// A bundle that lets it through has nothing signed all the same: the
	// issuer checks the claim again where it reads the CAs.
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		in.Secrets.Claimed, in.Secrets.ClaimError, in.Secrets.Usable = true, "", true
		return eng.Issuance(ctx, in)
	}}
	tcr, _ = f.ask("mine", ichorv1alpha1.PurposeTalosconfigReader, "")
	f.r.Engine = eng
	c = ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason)
	assert.Contains(t, c.Message, `the decision allows a request whose cluster's secrets are unusable: the Secret does not name this TalosCluster`)
	assert.Empty(t, tcr.Status.Certificate, "nothing signed with prod's CA")

	// Prod's Secret, annotated by whoever owns it to name mine too, signs
	// for it: the claim, not the reference, decides.
	var secret corev1.Secret
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "prod-secrets"}, &secret))
	secret.Annotations[ichorv1alpha1.SecretsClaimAnnotation] = "prod, mine"
	require.NoError(t, env.Client.Update(f.ctx, &secret))
	tcr, _ = f.ask("mine", ichorv1alpha1.PurposeTalosconfigReader, "")
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
	require.NoError(t, verify(parseCert(t, tcr.Status.Certificate), prodCA.Pool()))

	// A Secret without the annotation signs for no cluster, unless the
	// manager allows it for an upgrade (--require-secrets-claim=false).
	delete(secret.Annotations, ichorv1alpha1.SecretsClaimAnnotation)
	require.NoError(t, env.Client.Update(f.ctx, &secret))
	tcr, _ = f.ask("mine", ichorv1alpha1.PurposeTalosconfigReader, "")
	c = ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, fmt.Sprintf("it has no annotation ichor.dev/talos-clusters, which names the TalosClusters that may use it (kubectl -n %s annotate secret prod-secrets ichor.dev/talos-clusters=mine;", f.ns))
	f.r.SecretsClaims = clustersecrets.ClaimIfAnnotated
	tcr, _ = f.ask("mine", ichorv1alpha1.PurposeTalosconfigReader, "")
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
}

// The issuer reads the cluster as the webhook did, uncached: a cache that
// has not yet seen a cluster made a moment ago does not have a request the
// webhook admitted refused for good (ClusterNotFound) when it is only late
// (review of 2026-12-05).
func TestACacheThatHasNotSeenTheClusterYetRefusesNothing(t *testing.T) {
	f := newFixture(t)
	f.r.Client = notYetCached{f.r.Client}

	tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "")

	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
}

// lenientBundle is the shipped policy with a talosconfig-reader cap of 24
// hours: in its table, and in the rule's bound of ADR 0124, which holds
// whatever a table says (the bound is the rule's text, so the copy's text
// is changed).
func lenientBundle() (*bundle.Bundle, error) {
	dir, err := os.MkdirTemp("", "ichor-lenient-policy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) //nolint:errcheck // a temporary copy, read into the bundle below
	if err := os.CopyFS(dir, policy.FS); err != nil {
		return nil, err
	}
	for file, change := range map[string][2]string{
		"ichor/credentials/data.json":   {`"max_lifetime_seconds": 43200,`, `"max_lifetime_seconds": 86400,`},
		"ichor/credentials/bounds.rego": {`_lifetime_bound(purpose) := 43200 if`, `_lifetime_bound(purpose) := 86400 if`},
	} {
		path := filepath.Join(dir, file)
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		out := strings.Replace(string(src), change[0], change[1], 1)
		if out == string(src) {
			return nil, fmt.Errorf("lenient bundle: %s holds no %s", file, change[0])
		}
		if err := os.WriteFile(path, []byte(out), 0o600); err != nil { //nolint:gosec // G703: a file of the temporary copy
			return nil, err
		}
	}
	return bundles.FromDir(dir)
}

// notYetCached is a cache that has seen no TalosCluster yet.
type notYetCached struct{ client.Client }

func (c notYetCached) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*ichorv1alpha1.TalosCluster); ok {
		return apierrors.NewNotFound(ichorv1alpha1.GroupVersion.WithResource("talosclusters").GroupResource(), key.Name)
	}
	return c.Client.Get(ctx, key, obj, opts...)
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

func TestClusterGoneSinceAdmissionOrSecretsThatCannotSignAreRefused(t *testing.T) {
	f := newFixture(t)
	f.cluster("gone", nil)
	tcr, _ := f.create(f.admin(), "gone", ichorv1alpha1.PurposeTalosconfigReader, "")
	require.NoError(t, env.Client.Delete(f.ctx, &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "gone"}}))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(ctrlClient.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "gone"}, &ichorv1alpha1.TalosCluster{}))
	}, 10*time.Second, 50*time.Millisecond)
	c := ready(t, f.answer(tcr))
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, fmt.Sprintf(`ClusterNotFound: TalosCluster "gone" does not exist in namespace %q`, f.ns))

	// A cluster whose secrets cannot sign is refused, saying why: nothing
	// could be signed for it, and no admin binding is made first.
	f.cluster("no-secrets", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "empty", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "no-secrets"}}})
	tcr, _ = f.ask("no-secrets", ichorv1alpha1.PurposeTalosconfigReader, "")
	c = ready(t, tcr)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, `SecretsUnusable: the secrets Secret "empty" of TalosCluster "no-secrets" cannot sign: `)
	assert.Contains(t, c.Message, `Secret "empty" has no key "secrets.yaml"`)
	assert.Empty(t, tcr.Status.Certificate)

	// A bundle whose YAML quotes terminal escapes, thousands of times, is
	// named escaped and clipped: the condition is written, and read safely.
	var hostile strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&hostile, "\"\\e]0;owned %d\\a\": 1\n", i)
	}
	f.cluster("hostile-secrets", &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "hostile", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "hostile-secrets"}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: []byte(hostile.String())},
	})
	tcr, _ = f.ask("hostile-secrets", ichorv1alpha1.PurposeTalosconfigReader, "")
	c = ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, "not a Talos secrets bundle")
	assert.NotContains(t, c.Message, "\x1b")
	assert.LessOrEqual(t, len(c.Message), engine.MaxConditionMessage)
	assert.Regexp(t, `\(decision [0-9a-f-]+\)$`, c.Message)

	// Nor is one whose Secret does not exist; the decision says what was
	// read.
	require.NoError(t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "absent-secrets"},
		Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "nowhere"}},
	}))
	local.Add(types.NamespacedName{Namespace: f.ns, Name: "absent-secrets"})
	tcr, _ = f.ask("absent-secrets", ichorv1alpha1.PurposeTalosconfigReader, "")
	c = ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, `SecretsUnusable: the secrets Secret "nowhere" of TalosCluster "absent-secrets" cannot sign: `)
	assert.Contains(t, c.Message, `get Secret "nowhere"`)
	assert.Contains(t, c.Message, "not found")
	assert.Empty(t, tcr.Status.Certificate)
	logged := harness.FindDecision[struct {
		Input struct {
			Secrets engine.SecretsFacts `json:"secrets"`
		} `json:"input"`
	}](t, decisionLog, decisionIDOf(t, c.Message))
	assert.Equal(t, "nowhere", logged.Input.Secrets.Secret)
	assert.False(t, logged.Input.Secrets.Read)
	assert.False(t, logged.Input.Secrets.Usable)
	assert.Contains(t, logged.Input.Secrets.Error, "not found")
}

func TestRequestsMadeWhileTheWebhookWasAbsentAreNeverIssued(t *testing.T) {
	f := newFixture(t)
	// Someone who may only create requests (the API server's RBAC lets them,
	// the webhook would refuse every purpose), while the webhook
	// configuration is gone: after `helm uninstall`, in an upgrade window,
	// or deleted by mistake.
	mallory := f.user("ichor:mallory", "ichor-test:requests-only")
	removeWebhook(t)

	var made []*ichorv1alpha1.TalosCredentialRequest
	for _, purpose := range ichorv1alpha1.CredentialPurposes() {
		tcr, _ := f.create(mallory, "demo", purpose, "")
		made = append(made, tcr)
	}
	// The webhook comes back before the issuer gets to them.
	restoreWebhook(t)

	for _, tcr := range made {
		got := f.answer(tcr)
		c := ready(t, got)
		assert.Equal(t, metav1.ConditionFalse, c.Status, tcr.Spec.Purpose)
		assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason, tcr.Spec.Purpose)
		assert.Contains(t, c.Message, "NotAdmitted: no admission of this request by Ichor's webhook is recorded", tcr.Spec.Purpose)
		assert.Empty(t, got.Status.Certificate, tcr.Spec.Purpose)

		entry := harness.FindDecision[logEntry](t, decisionLog, decisionIDOf(t, c.Message))
		assert.Equal(t, engine.PathCredentialIssuance, entry.Path)
		assert.False(t, entry.Input.Admission.Recorded)
		assert.Equal(t, "ichor:mallory", entry.Input.Requester.Username)
		assert.Contains(t, codesOf(entry.Result.Reasons), "NotAdmitted")

		// It stays refused: an answered request is never decided again.
		again := f.answer(got)
		assert.Equal(t, c.Message, ready(t, again).Message)
		assert.Empty(t, again.Status.Certificate)
	}
	assert.Len(t, refusedEvents(t, f.ns, len(made)), len(made), "each refusal is a Warning Event on the request")
	assert.Empty(t, adminBindingsOf(t, "ichor:mallory"), "a refused request made a binding")
}

func TestARequesterWhoLostTheGrantAfterAdmissionIsRefused(t *testing.T) {
	f := newFixture(t)
	alice := f.user("ichor:alice", "ichor-operator")
	tcr, _ := f.create(alice, "demo", ichorv1alpha1.PurposeTalosconfigReader, "")

	// Her role is removed between admission and issuance.
	require.NoError(t, env.Client.Delete(f.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ichor-alice"}}))
	require.NoError(t, wait.PollUntilContextTimeout(f.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "ichor:alice", ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: f.ns, Group: "ichor.dev", Resource: "talosclusters", Subresource: "talosconfig-reader", Name: "demo", Verb: "download"}}}
		err := env.Client.Create(ctx, sar)
		return err == nil && !sar.Status.Allowed, err
	}))

	got := f.answer(tcr)
	c := ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, `NotAuthorized: user "ichor:alice" may not download talosclusters/talosconfig-reader "demo"`)
	assert.Empty(t, got.Status.Certificate)
	entry := harness.FindDecision[logEntry](t, decisionLog, decisionIDOf(t, c.Message))
	assert.True(t, entry.Input.Admission.Verified, "it was admitted")
	require.NotNil(t, entry.Input.Authorization)
	assert.Equal(t, "ichor:alice", entry.Input.Authorization.User, "the review is made as the requester")
	assert.False(t, entry.Input.Authorization.Allowed)
}

// Ichor's own purposes go to a ServiceAccount of the namespaces the manager
// names (its own by default), checked again before signing: a namespace's
// admin may make a ServiceAccount, bind it issue and take its token, and
// was issued through it what no person is (review 254 F4). The webhook of
// this test names none, as a manager outside a pod would.
func TestAServiceAccountOutsideIchorsNamespacesIsNotIssuedIchorsOwnPurposes(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, env.Client.Create(f.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "made-here"}}))
	require.NoError(t, env.Client.Create(f.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "node-reader"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{"ichor.dev"}, Resources: []string{"talosclusters/node-reader"}, Verbs: []string{"issue"}},
	}}))
	require.NoError(t, env.Client.Create(f.ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "made-here"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "node-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.ns, Name: "made-here"}},
	}))
	username := "system:serviceaccount:" + f.ns + ":made-here"
	require.NoError(t, env.WaitAllowed(f.ctx, username, []string{"system:serviceaccounts"}, authorizationv1.ResourceAttributes{Namespace: f.ns, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"}))
	sa, err := env.ServiceAccountClient(f.ctx, f.ns, "made-here")
	require.NoError(t, err)
	sa, err = webhooktest.Requesting(f.ctx, sa)
	require.NoError(t, err)

	f.r.ComponentNamespaces = []string{"ichor-system"}
	tcr, _ := f.create(sa, "demo", ichorv1alpha1.PurposeNodeReader, "")
	got := f.answer(tcr)
	c := ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, fmt.Sprintf(`PurposeNotForPeople: user %q may not be issued an os:reader identity to read one node: it is issued to a ServiceAccount of Ichor's only (of namespace ichor-system)`, username))
	assert.Empty(t, got.Status.Certificate)

	// Its namespace named, the same ServiceAccount is issued it.
	f.r.ComponentNamespaces = []string{"ichor-system", f.ns}
	tcr, _ = f.create(sa, "demo", ichorv1alpha1.PurposeNodeReader, "")
	got = f.answer(tcr)
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, got).Reason, ready(t, got).Message)
	assert.NotEmpty(t, got.Status.Certificate)
}

func TestAForgedAdmissionRecordIsRefused(t *testing.T) {
	f := newFixture(t)
	// A genuine record to copy from.
	genuine, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	var record corev1.Event
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: credential.RecordName(genuine.UID)}, &record))

	mallory := f.user("ichor:mallory", "ichor-test:requests-only")
	removeWebhook(t)
	tcr, _ := f.create(mallory, "demo", ichorv1alpha1.PurposeCredentialsTalos, "")
	// Whoever may create Events writes a record for it, with another
	// record's MAC and decision.
	forged := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: credential.RecordName(tcr.UID), Annotations: map[string]string{
			credential.AnnotationDecisionID: record.Annotations[credential.AnnotationDecisionID],
			credential.AnnotationRequest:    tcr.Name,
			credential.AnnotationRequestUID: string(tcr.UID),
			credential.AnnotationMAC:        record.Annotations[credential.AnnotationMAC],
		}},
		InvolvedObject: record.InvolvedObject, Reason: "CredentialsTalos", Message: "forged", Type: corev1.EventTypeNormal,
	}
	require.NoError(t, env.Client.Create(f.ctx, forged))
	restoreWebhook(t)

	got := f.answer(tcr)
	c := ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, "NotAdmitted: the admission record of this request does not prove it: the MAC of the Event")
	assert.Empty(t, got.Status.Certificate)

	// The genuine one is still issued.
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, f.answer(genuine)).Reason)
}

// The credential a talosconfig-reader request is admitted for, and another.
const (
	readerCredential   = `{"credential":"talosconfig","kind":"talos","talos_role":"os:reader"}`
	operatorCredential = `{"credential":"talosconfig","kind":"talos","talos_role":"os:operator"}`
)

// recordedAdmission creates a talosconfig-reader request while the webhook
// is away and writes its admission record as the webhook would, with a
// valid MAC and valid pins of the lifetime and the credential given; a zero
// lifetime or an empty credential leaves that pin out, as an older webhook's
// record, or one whose pins were taken away.
func (f *fixture) recordedAdmission(lifetime int64, pinned string) *ichorv1alpha1.TalosCredentialRequest {
	t := f.t
	t.Helper()
	tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	var cluster ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "demo"}, &cluster))
	key, err := keys.Key(f.ctx)
	require.NoError(t, err)
	const decision = "4b0d7c52-8f7c-4f55-9d6c-0c3b2d9a1e77"
	mac, err := credential.MAC(key, tcr, f.ns, cluster.UID, decision)
	require.NoError(t, err)
	annotations := map[string]string{credential.AnnotationDecisionID: decision, credential.AnnotationMAC: mac}
	if lifetime != 0 {
		lifetimeMAC, err := credential.LifetimeMAC(key, tcr, f.ns, cluster.UID, decision, lifetime)
		require.NoError(t, err)
		annotations[credential.AnnotationLifetime] = strconv.FormatInt(lifetime, 10)
		annotations[credential.AnnotationLifetimeMAC] = lifetimeMAC
	}
	if pinned != "" {
		credentialMAC, err := credential.CredentialMAC(key, tcr, f.ns, cluster.UID, decision, pinned)
		require.NoError(t, err)
		annotations[credential.AnnotationCredential] = pinned
		annotations[credential.AnnotationCredentialMAC] = credentialMAC
	}
	require.NoError(t, env.Client.Create(f.ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: f.ns, Name: credential.RecordName(tcr.UID), Annotations: annotations},
		InvolvedObject: corev1.ObjectReference{Kind: "TalosCluster", Namespace: f.ns, Name: "demo", UID: cluster.UID},
		Reason:         "TalosconfigReader", Message: "admitted", Type: corev1.EventTypeNormal,
	}))
	return tcr
}

// What is signed is the lifetime admitted: a request that asked no ttl,
// admitted when the purpose's default was 30 minutes (a record with a valid
// MAC over that lifetime), is refused once the default the issuer finds is an
// hour; one admitted for the hour is issued for it.
func TestALifetimeOtherThanTheOneAdmittedIsRefused(t *testing.T) {
	f := newFixture(t)
	removeWebhook(t)
	shorter, same := f.recordedAdmission(1800, readerCredential), f.recordedAdmission(3600, readerCredential)
	restoreWebhook(t)

	c := ready(t, f.answer(shorter))
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, "LifetimeNotAdmitted: the credential would now live 1h0m0s, not the 1800 seconds admitted")
	got := f.answer(same)
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, got).Reason)
	cert := parseCert(t, got.Status.Certificate)
	assert.Equal(t, time.Hour, cert.NotAfter.Sub(cert.NotBefore))
}

// What is signed is the credential admitted: a request admitted when its
// purpose mapped to another Talos role (a record with a valid MAC over that
// credential) is refused once the purpose the issuer finds maps to
// os:reader; one admitted for os:reader is issued with it.
func TestACredentialOtherThanTheOneAdmittedIsRefused(t *testing.T) {
	f := newFixture(t)
	removeWebhook(t)
	other, same := f.recordedAdmission(3600, operatorCredential), f.recordedAdmission(3600, readerCredential)
	restoreWebhook(t)

	got := f.answer(other)
	c := ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, "CredentialNotAdmitted: the credential would now be an os:reader talosconfig, not an os:operator talosconfig as admitted")
	assert.Empty(t, got.Status.Certificate)
	got = f.answer(same)
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, got).Reason)
	assert.Equal(t, []string{"os:reader"}, parseCert(t, got.Status.Certificate).Subject.Organization)
}

// Whoever may edit Events can take the pins away from a record and leave
// its first MAC valid, so that it reads as an older webhook's: such a
// record, or one without the credential's pin, is refused, nothing signed,
// unless the manager accepts unpinned records
// (--require-admission-pins=false, for a rolling upgrade), which then
// issues as an older release did.
func TestARecordWithoutThePinsIsRefusedUnlessUnpinnedRecordsAreAccepted(t *testing.T) {
	f := newFixture(t)
	removeWebhook(t)
	stripped, noCredential, noLifetime := f.recordedAdmission(0, ""), f.recordedAdmission(3600, ""), f.recordedAdmission(0, readerCredential)
	older := f.recordedAdmission(0, "")
	restoreWebhook(t)

	for name, tcr := range map[string]*ichorv1alpha1.TalosCredentialRequest{
		"no pins": stripped, "no credential": noCredential, "no lifetime": noLifetime,
	} {
		got := f.answer(tcr)
		c := ready(t, got)
		assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason, name)
		assert.Contains(t, c.Message, "NotAdmitted: the admission record of this request does not prove it", name)
		assert.Contains(t, c.Message, "the manager requires them (--require-admission-pins)", name)
		assert.Empty(t, got.Status.Certificate, name)
	}

	f.r.AcceptUnpinned = true
	got := f.answer(older)
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, got).Reason, ready(t, got).Message)
	assert.Equal(t, []string{"os:reader"}, parseCert(t, got.Status.Certificate).Subject.Organization)
}

func TestAClusterRecreatedSinceAdmissionDoesNotInheritTheAdmission(t *testing.T) {
	f := newFixture(t)
	tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeCredentialsTalos, "")
	// Deleted and made again under the same name, with other CAs: the
	// request was admitted for the one that is gone.
	var before ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "demo"}, &before))
	require.NoError(t, env.Client.Delete(f.ctx, &before))
	f.cluster("demo", nil)
	require.Eventually(t, func() bool {
		var seen ichorv1alpha1.TalosCluster
		return ctrlClient.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "demo"}, &seen) == nil && seen.UID != before.UID
	}, 10*time.Second, 50*time.Millisecond)

	c := ready(t, f.answer(tcr))
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, "NotAdmitted: the admission record of this request does not prove it")
}

func TestAKubernetesCredentialOfAClusterThatJudgesAnotherAPIServerIsRefused(t *testing.T) {
	f := newFixture(t)
	tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeKubeconfigSuperAdmin, "")
	// Between admission and issuance the cluster is pointed at another API server.
	var cluster ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "demo"}, &cluster))
	cluster.Spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "remote-kubeconfig"}
	require.NoError(t, env.Client.Update(f.ctx, &cluster))
	require.Eventually(t, func() bool {
		var seen ichorv1alpha1.TalosCluster
		return ctrlClient.Get(f.ctx, types.NamespacedName{Namespace: f.ns, Name: "demo"}, &seen) == nil && seen.Spec.KubeconfigRef != nil
	}, 10*time.Second, 50*time.Millisecond)

	c := ready(t, f.answer(tcr))
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, `ClusterNotLocal: TalosCluster "demo" judges another API server (spec.kubeconfigRef)`)
}

func TestAdminKubeconfigsRevokedByTheOperatorAreRefusedAndBindNothing(t *testing.T) {
	f := newFixture(t)
	f.r.AdminKubeconfigs = false
	ada := f.user("ichor:ada-revoked-by-operator", "ichor-admin")

	tcr, _ := f.create(ada, "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	tcr = f.answer(tcr)
	c := ready(t, tcr)
	assert.Equal(t, ichorv1alpha1.ReasonRefused, c.Reason)
	assert.Contains(t, c.Message, "AdminKubeconfigsRevoked: the operator revoked admin kubeconfigs")
	assert.Empty(t, tcr.Status.Certificate)
	assert.Empty(t, adminBindingsOf(t, "ichor:ada-revoked-by-operator"), "a refused request made a binding")
	// Other purposes are not concerned.
	other, _ := f.ask("demo", ichorv1alpha1.PurposeKubeconfigSuperAdmin, "")
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, other).Reason)
}

// removeWebhook deletes the webhook configuration until the test ends, and
// waits until the API server no longer calls the webhook.
func removeWebhook(t *testing.T) {
	t.Helper()
	require.NoError(t, env.Client.Delete(t.Context(), webhookConfig.DeepCopy()))
	require.NoError(t, webhooktest.WaitWebhook(t.Context(), env.Client, "default", false))
	t.Cleanup(func() {
		var current admissionregistrationv1.ValidatingWebhookConfiguration
		if apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKeyFromObject(webhookConfig), &current)) {
			restoreWebhook(t)
		}
	})
}

// restoreWebhook installs the webhook configuration again and waits until
// the API server calls the webhook.
func restoreWebhook(t *testing.T) {
	t.Helper()
	again := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookConfig.Name},
		Webhooks:   webhookConfig.Webhooks,
	}
	require.NoError(t, env.Client.Create(context.Background(), again))
	require.NoError(t, webhooktest.WaitWebhook(context.Background(), env.Client, "default", true))
}

var decisionIDPattern = regexp.MustCompile(`\(decision ([0-9a-f-]+)\)`)

func decisionIDOf(t *testing.T, message string) string {
	t.Helper()
	m := decisionIDPattern.FindStringSubmatch(message)
	require.NotNil(t, m, message)
	return m[1]
}

func codesOf(reasons []engine.Reason) []string {
	out := make([]string, 0, len(reasons))
	for _, r := range reasons {
		out = append(out, r.Code)
	}
	return out
}

// refusedEvents are the Warning Events the issuer wrote on refused requests
// of the namespace.
func refusedEvents(t *testing.T, namespace string, want int) []eventsv1.Event {
	t.Helper()
	var out []eventsv1.Event
	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(namespace)))
		out = out[:0]
		for _, e := range list.Items {
			if e.Regarding.Kind == "TalosCredentialRequest" && e.Reason == ichorv1alpha1.ReasonRefused {
				out = append(out, e)
			}
		}
		return len(out) >= want
	}, 10*time.Second, 50*time.Millisecond)
	return out
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

type logEntry struct {
	DecisionID string                         `json:"decision_id"`
	Path       string                         `json:"path"`
	Input      engine.CredentialIssuanceInput `json:"input"`
	Result     engine.CredentialIssuance      `json:"result"`
}

// A bundle whose issuance decision allows without naming what to sign (the
// engine refuses such a decision) gets nothing signed: the request fails,
// saying why. A decision that could not be made answers nothing: the
// request is retried, and nothing is written on it.
func TestAnOddIssuanceAnswerSignsNothing(t *testing.T) {
	f := newFixture(t)
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(_ context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		switch in.Request.Purpose {
		case string(ichorv1alpha1.PurposeTalosconfigReader):
			return engine.CredentialIssuance{Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialIssuable", Message: "yes"}}, Purpose: in.Request.Purpose, DecisionID: "d-odd"}, nil
		default:
			return engine.CredentialIssuance{}, errors.New("evaluate ichor/credentials/issuance: builtin error")
		}
	}}

	tcr, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	c := ready(t, tcr)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason)
	assert.Contains(t, c.Message, "the decision allows but names no certificate or lifetime")
	assert.Empty(t, tcr.Status.Certificate)
	assert.Nil(t, tcr.Status.ExpiresAt)

	failing, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	_, err := f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(failing)})
	require.ErrorContains(t, err, "builtin error")
	got := &ichorv1alpha1.TalosCredentialRequest{}
	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKeyFromObject(failing), got))
	assert.Nil(t, meta.FindStatusCondition(got.Status.Conditions, ichorv1alpha1.ConditionReady), "no answer on a decision that was not made")
	assert.Empty(t, got.Status.Certificate)
}

// The same backstop for the credential the record pins (review of
// 2026-12-06): a bundle that allows os:admin for a reader's request, at the
// admitted lifetime, is refused by Go whatever the bundle, as a longer
// lifetime is.
func TestACredentialOtherThanTheOneAdmittedIsNotSignedWhateverTheBundle(t *testing.T) {
	f := newFixture(t)
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(_ context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		return engine.CredentialIssuance{
			Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialIssuable", Message: "a rule without its admission checks"}},
			Purpose: in.Request.Purpose, LifetimeSeconds: float64(in.Admission.LifetimeSeconds), DecisionID: "d-loose",
			Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindTalos, TalosRole: "os:admin"},
		}, nil
	}}

	escalated, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	got := f.answer(escalated)
	c := ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason)
	assert.Contains(t, c.Message, `the decision allows the Talos role "os:admin", not "os:reader" as admitted`)
	assert.Empty(t, got.Status.Certificate)
}

// A bundle whose issuance rule allows without its admission checks (a
// custom or broken rule) signs nothing Go cannot hold to the admission the
// issuer proved: a request made while the webhook was absent, or a lifetime
// longer than the one admitted, fails before anything is made or signed
// (the hostile review of 2026-12-05).
func TestAnIssuanceBeyondItsAdmissionIsNotSignedWhateverTheBundle(t *testing.T) {
	f := newFixture(t)
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(_ context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		lifetime := in.Admission.LifetimeSeconds + 3600
		return engine.CredentialIssuance{
			Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialIssuable", Message: "a rule without its admission checks"}},
			Purpose: in.Request.Purpose, LifetimeSeconds: float64(lifetime), DecisionID: "d-loose",
			Certificate: &engine.IssuedCertificate{Kind: engine.CertificateKindTalos, TalosRole: "os:admin"},
		}, nil
	}}

	removeWebhook(t)
	unadmitted, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	restoreWebhook(t)
	got := f.answer(unadmitted)
	c := ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason)
	assert.Contains(t, c.Message, "without a verified admission record")
	assert.Empty(t, got.Status.Certificate)

	longer, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	got = f.answer(longer)
	c = ready(t, got)
	assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason)
	assert.Contains(t, c.Message, "longer than the")
	assert.Empty(t, got.Status.Certificate)
	assert.Nil(t, got.Status.ExpiresAt)
}

// failFirstStatus answers the first status write with an error, as an API
// server that went away does; the later ones go through.
type failFirstStatus struct {
	client.Client
	failed bool
}

func (c *failFirstStatus) Status() client.SubResourceWriter {
	return &failFirstStatusWriter{SubResourceWriter: c.Client.Status(), c: c}
}

type failFirstStatusWriter struct {
	client.SubResourceWriter
	c *failFirstStatus
}

func (w *failFirstStatusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if !w.c.failed {
		w.c.failed = true
		return errors.New("the API server went away")
	}
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}

// The review of 2026-12-06: the Warning of a refusal was written before the
// refusal was stored; when the write failed, the request was decided again
// and issued, and carried the Warning of a refusal it never had. It is
// written once the answer is stored.
func TestARefusalThatWasNotStoredLeavesNoWarning(t *testing.T) {
	f := newFixture(t)
	calls := 0
	f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
		calls++
		if calls == 1 {
			// The review flapped, then answered yes.
			return engine.CredentialIssuance{Allowed: false, Reasons: engine.Reasons{{Code: "NotAuthorized", Message: "a review that flapped"}},
				Purpose: in.Request.Purpose, DecisionID: "d-flapped"}, nil
		}
		return eng.Issuance(ctx, in)
	}}
	f.r.Client = &failFirstStatus{Client: f.r.Client}
	tcr, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	_, err := f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)})
	require.ErrorContains(t, err, "the API server went away")
	got := f.answer(tcr)
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, got).Reason)

	// The recorder writes its Events in order: once a marker written after
	// is there, a Warning of the refusal would be too.
	recorder.Eventf(got, nil, corev1.EventTypeNormal, "TestMarker", "Test", "after the answer")
	var list eventsv1.EventList
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(f.ns)))
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool { return e.Reason == "TestMarker" })
	}, 10*time.Second, 50*time.Millisecond)
	for _, e := range list.Items {
		assert.NotEqual(t, ichorv1alpha1.ReasonRefused, e.Reason, "a Warning of a refusal never stored: %s", e.Note)
	}
}
