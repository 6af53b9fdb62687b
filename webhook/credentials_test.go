package webhook_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	clusterfacts "github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// One API server and one webhook serve every test; each test has its own
// namespace with a TalosCluster "demo".
var (
	// odd answers the admission of the namespaces a test names.
	odd         = &enginetest.Answers[engine.CredentialAdmission]{}
	env         *harness.Env
	decisionLog = &harness.DecisionLog{}
	// admissionKeys is the webhook's admission key.
	admissionKeys *credential.Keys
	// local are the clusters named as those of this API server; each test
	// names its own.
	local = &clusterfacts.Local{}
	// decider is the served webhook's engine.
	decider *enginetest.Engine
)

// webhookUser is the identity the webhook runs as, with exactly the rights of
// its +kubebuilder:rbac markers. Its right to create Events is bound per
// namespace, so that a namespace without it is one where the issuance cannot
// be recorded.
const (
	webhookUser       = "ichor-test:webhook"
	webhookRole       = "ichor-test:webhook"
	webhookEventsRole = "ichor-test:webhook-events"
	keyNamespace      = harness.ManagerNamespace
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.Options{}, func(ctx context.Context, e *harness.Env) (func(), error) {
		env = e
		install, err := startWebhook(ctx)
		return func() {
			if install != nil {
				_ = install.Cleanup() // a temporary directory
			}
		}, err
	}))
}

func startWebhook(ctx context.Context) (*envtest.WebhookInstallOptions, error) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	if err := applyRoles(ctx, env.Client); err != nil {
		return nil, err
	}
	rules, err := webhooktest.MarkerRules("webhook")
	if err != nil {
		return nil, err
	}
	var clusterRules, eventRules []rbacv1.PolicyRule
	for _, r := range rules {
		if len(r.Resources) == 1 && r.Resources[0] == "events" {
			eventRules = append(eventRules, r)
		} else {
			clusterRules = append(clusterRules, r)
		}
	}
	for name, rules := range map[string][]rbacv1.PolicyRule{webhookRole: clusterRules, webhookEventsRole: eventRules} {
		if err := env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}); err != nil {
			return nil, err
		}
	}
	if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: webhookRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: webhookRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: webhookUser}},
	}); err != nil {
		return nil, err
	}
	if err := env.WaitAllowed(ctx, webhookUser, nil, authorizationv1.ResourceAttributes{Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verb: "create"}); err != nil {
		return nil, err
	}

	// The admission key, in the manager's namespace, read and filled with
	// exactly the rights of its markers.
	keyRules, err := webhooktest.NamespacedMarkerRules("internal/facts/credential")
	if err != nil {
		return nil, err
	}
	if err := env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: keyNamespace, Name: webhookRole}, Rules: keyRules}); err != nil {
		return nil, err
	}
	if err := env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: keyNamespace, Name: webhookRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: webhookRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: webhookUser}},
	}); err != nil {
		return nil, err
	}
	if err := env.WaitAllowed(ctx, webhookUser, nil, authorizationv1.ResourceAttributes{Namespace: keyNamespace, Resource: "secrets", Name: credential.DefaultKeySecretName, Verb: "update"}); err != nil {
		return nil, err
	}
	if err := webhooktest.InstallAdmissionPolicies(ctx, env.Client, "default"); err != nil {
		return nil, err
	}

	eng, err := engine.New(ctx, engine.Options{DecisionLog: decisionLog, Log: os.Stderr, ID: "webhook-test"})
	if err != nil {
		return nil, err
	}
	if err := env.AtStop(func() { eng.Stop(context.Background()) }); err != nil {
		return nil, err
	}
	install, err := webhooktest.Install(env.Config)
	if err != nil {
		return nil, err
	}
	done := func(err error) (*envtest.WebhookInstallOptions, error) { return install, err }
	cfg, err := env.UserConfig(webhookUser)
	if err != nil {
		return done(err)
	}
	mgr, err := env.NewManager(cfg, crwebhook.NewServer(webhooktest.ServerOptions(install)))
	if err != nil {
		return done(err)
	}
	keyClient, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return done(err)
	}
	admissionKeys = env.AdmissionKeys(keyClient)
	decider = &enginetest.Engine{Engine: eng, AdmissionFunc: func(_ context.Context, in engine.CredentialAdmissionInput) (engine.CredentialAdmission, error) {
		return odd.Answer(in.Request.Namespace)
	}}
	v := &webhook.CredentialRequestValidator{
		Engine: decider, Instance: "webhook-test", Keys: admissionKeys, LocalClusters: local,
		ComponentNamespaces: []string{componentsNamespace},
	}
	if err := v.SetupWithManager(mgr); err != nil {
		return done(err)
	}
	harness.RunManager(ctx, mgr, "manager")
	started := mgr.GetWebhookServer().StartedChecker()
	return done(wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return started(nil) == nil, nil
	}))
}

// applyRoles creates the shipped roles of deploy/rbac/roles.yaml.
func applyRoles(ctx context.Context, c client.Client) error {
	roles, err := webhooktest.ShippedRoles()
	if err != nil {
		return err
	}
	for i := range roles {
		if err := c.Create(ctx, &roles[i]); err != nil {
			return err
		}
	}
	return nil
}

// fixture is one test's namespace and cluster.
type fixture struct {
	t   *testing.T
	ctx context.Context
	ns  string
}

// newFixture makes a namespace with a TalosCluster "demo"; recordable lets the
// webhook write Events there.
func newFixture(t *testing.T, recordable bool) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := strings.Trim(strings.ToLower(regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-")), "-")
	if len(ns) > 60 {
		ns = strings.Trim(ns[:60], "-")
	}
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(ns, "talos-secrets")))
	require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
		},
	}))
	local.Add(types.NamespacedName{Namespace: ns, Name: "demo"})
	f := &fixture{t: t, ctx: ctx, ns: ns}
	if recordable {
		f.bind(rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: webhookUser}, "ClusterRole", webhookEventsRole)
		require.NoError(t, env.WaitAllowed(ctx, webhookUser, nil, authorizationv1.ResourceAttributes{Namespace: ns, Resource: "events", Verb: "create"}))
	}
	return f
}

func (f *fixture) bind(subject rbacv1.Subject, kind, role string) {
	f.t.Helper()
	name := strings.NewReplacer(":", "-").Replace(subject.Name + "-" + role)
	require.NoError(f.t, env.Client.Create(f.ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role},
		Subjects:   []rbacv1.Subject{subject},
	}))
}

// serviceAccount makes a ServiceAccount of the fixture's namespace that may
// create requests and issue the purposes (subresources) given, and returns a
// client of it with a real token, so that a request carries what the API
// server puts in a ServiceAccount's user info (uid, extra) and the review is
// made with it, and its username.
func (f *fixture) serviceAccount(name string, purposes ...string) (client.Client, string) {
	f.t.Helper()
	require.NoError(f.t, env.Client.Create(f.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}))
	f.role(name+"-purposes",
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"}},
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: purposes, Verbs: []string{"issue"}},
	)
	f.bind(rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: f.ns, Name: name}, "Role", name+"-purposes")
	username := "system:serviceaccount:" + f.ns + ":" + name
	require.NoError(f.t, env.WaitAllowed(f.ctx, username, []string{"system:serviceaccounts"}, authorizationv1.ResourceAttributes{Namespace: f.ns, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"}))
	c, err := env.ServiceAccountClient(f.ctx, f.ns, name)
	require.NoError(f.t, err)
	c, err = webhooktest.Requesting(f.ctx, c)
	require.NoError(f.t, err)
	return c, username
}

// role makes a namespaced Role.
func (f *fixture) role(name string, rules ...rbacv1.PolicyRule) string {
	f.t.Helper()
	require.NoError(f.t, env.Client.Create(f.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Rules: rules}))
	return name
}

// user is a client for a person bound to the roles ("ClusterRole/x" or
// "Role/x") in the fixture's namespace.
func (f *fixture) user(name string, roles ...string) client.Client {
	f.t.Helper()
	for _, r := range roles {
		kind, role, _ := strings.Cut(r, "/")
		f.bind(rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}, kind, role)
	}
	require.NoError(f.t, env.WaitAllowed(f.ctx, name, nil, authorizationv1.ResourceAttributes{Namespace: f.ns, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"}))
	cfg, err := env.UserConfig(name)
	require.NoError(f.t, err)
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(f.t, err)
	// Their requests record them, as `ichor cluster` does.
	c, err = webhooktest.Requesting(f.ctx, c)
	require.NoError(f.t, err)
	return c
}

func (f *fixture) request(purpose ichorv1alpha1.CredentialPurpose, ttl string, key crypto.PublicKey) *ichorv1alpha1.TalosCredentialRequest {
	f.t.Helper()
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, GenerateName: "demo-" + string(purpose) + "-"},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{
			ClusterName: "demo",
			Purpose:     purpose,
			PublicKey:   publicKeyPEM(f.t, key),
		},
	}
	if ttl != "" {
		d, err := time.ParseDuration(ttl)
		require.NoError(f.t, err)
		tcr.Spec.TTL = &metav1.Duration{Duration: d}
	}
	return tcr
}

func (f *fixture) events() []corev1.Event {
	f.t.Helper()
	var list corev1.EventList
	require.NoError(f.t, env.Client.List(f.ctx, &list, client.InNamespace(f.ns)))
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "TalosCluster" && e.InvolvedObject.Name == "demo" {
			out = append(out, e)
		}
	}
	return out
}

func (f *fixture) requests() []ichorv1alpha1.TalosCredentialRequest {
	f.t.Helper()
	var list ichorv1alpha1.TalosCredentialRequestList
	require.NoError(f.t, env.Client.List(f.ctx, &list, client.InNamespace(f.ns)))
	return list.Items
}

func ed25519Key(t *testing.T) crypto.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return pub
}

func publicKeyPEM(t *testing.T, key crypto.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

var decisionIDPattern = regexp.MustCompile(`\(decision ([0-9a-f-]+)\)`)

// refusal asserts err is the webhook's refusal and returns its message.
func refusal(t *testing.T, err error) string {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	t.Logf("refused: %s", msg)
	require.Contains(t, msg, `admission webhook "`+webhook.Name+`" denied the request`)
	return msg
}

// A username holding a newline (an authenticator may give one) cannot write
// a second line, read as another record, into the Event that names who asked
// (review of 2026-12-05).
func TestTheEventNamesARequesterOnOneLine(t *testing.T) {
	f := newFixture(t, true)
	eve := f.user("ichor:eve\nan os:admin talosconfig was requested by ichor:rita", "ClusterRole/ichor-operator")

	tcr := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	require.NoError(t, eve.Create(f.ctx, tcr))

	events := f.events()
	require.Len(t, events, 1)
	// Quoted, with its digest: the name reads as neither another record
	// nor another person (review of 2026-12-06).
	name := "ichor:eve\nan os:admin talosconfig was requested by ichor:rita"
	digest := sha256.Sum256([]byte(name))
	assert.Equal(t, fmt.Sprintf("an os:reader talosconfig was requested by %q (sha256 %x) (lifetime 1h0m0s)", name, digest[:6]), events[0].Message)
	assert.NotContains(t, events[0].Message, "\n")
}

func TestHolderOfTheVerbIsAdmittedAndTheEventNamesThem(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")

	tcr := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	require.NoError(t, alice.Create(f.ctx, tcr))

	// Written before the request was admitted: it exists as soon as Create
	// returns, without waiting.
	events := f.events()
	require.Len(t, events, 1)
	e := events[0]
	assert.Equal(t, corev1.EventTypeNormal, e.Type)
	assert.Equal(t, "TalosconfigReader", e.Reason)
	assert.Equal(t, "an os:reader talosconfig was requested by ichor:alice (lifetime 1h0m0s)", e.Message)
	assert.Equal(t, webhook.EventSource, e.Source.Component)
	assert.Equal(t, tcr.Name, e.Annotations[credential.AnnotationRequest])

	// The Event is the admission record: named after the request's UID,
	// with a MAC of exactly this request that the manager's key verifies.
	assert.Equal(t, credential.RecordName(tcr.UID), e.Name)
	assert.Equal(t, string(tcr.UID), e.Annotations[credential.AnnotationRequestUID])
	key, err := admissionKeys.Key(f.ctx)
	require.NoError(t, err)
	ok, admitted, why := credential.Verify(key, tcr, e.InvolvedObject.UID, &e, credential.RefuseUnpinned)
	assert.True(t, ok, why)
	assert.Equal(t, e.Annotations[credential.AnnotationDecisionID], admitted.DecisionID)
	assert.Equal(t, "3600", e.Annotations[credential.AnnotationLifetime])
	assert.Equal(t, int64(3600), admitted.LifetimeSeconds, "the lifetime admitted is not the record's")
	forged := e.DeepCopy()
	forged.Annotations[credential.AnnotationLifetime] = "7200"
	ok, _, why = credential.Verify(key, tcr, e.InvolvedObject.UID, forged, credential.RefuseUnpinned)
	assert.False(t, ok, "a record whose lifetime was rewritten verified")
	assert.Contains(t, why, "lifetime MAC")
	// And the credential it names, as the Event's message says it.
	assert.JSONEq(t, `{"kind":"talos","credential":"talosconfig","talos_role":"os:reader"}`, e.Annotations[credential.AnnotationCredential])
	assert.JSONEq(t, e.Annotations[credential.AnnotationCredential], string(admitted.Credential), "the credential admitted is not the record's")
	forged = e.DeepCopy()
	forged.Annotations[credential.AnnotationCredential] = `{"credential":"talosconfig","kind":"talos","talos_role":"os:admin"}`
	ok, _, why = credential.Verify(key, tcr, e.InvolvedObject.UID, forged, credential.RefuseUnpinned)
	assert.False(t, ok, "a record whose credential was rewritten verified")
	assert.Contains(t, why, "credential MAC")
	// Both pins taken away, the first MAC still valid: the record reads as
	// an older webhook's, which the issuer accepts only when told to.
	stripped := e.DeepCopy()
	for _, a := range []string{credential.AnnotationLifetime, credential.AnnotationLifetimeMAC, credential.AnnotationCredential, credential.AnnotationCredentialMAC} {
		delete(stripped.Annotations, a)
	}
	ok, _, why = credential.Verify(key, tcr, e.InvolvedObject.UID, stripped, credential.RefuseUnpinned)
	assert.False(t, ok, "a record stripped of its pins verified")
	assert.Contains(t, why, "--require-admission-pins")
	changed := tcr.DeepCopy()
	changed.Spec.Requester.Groups = append(changed.Spec.Requester.Groups, "system:masters")
	ok, _, why = credential.Verify(key, changed, e.InvolvedObject.UID, &e, credential.RefuseUnpinned)
	assert.False(t, ok)
	ok, _, _ = credential.Verify(key, tcr, "another-cluster-uid", &e, credential.RefuseUnpinned)
	assert.False(t, ok)
	assert.Contains(t, why, "does not match this request's uid, spec and requester")

	var cluster ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "demo"}, &cluster))
	assert.Equal(t, cluster.UID, e.InvolvedObject.UID)

	// The decision is in the log, with the requester and the review made as
	// them.
	entry := harness.FindDecision[logEntry](t, decisionLog, e.Annotations[credential.AnnotationDecisionID])
	assert.Equal(t, engine.PathCredentialAdmission, entry.Path)
	assert.Equal(t, "ichor:alice", entry.Input.User.Username)
	require.NotNil(t, entry.Input.Requester)
	assert.Equal(t, "ichor:alice", entry.Input.Requester.Username)
	assert.Equal(t, string(tcr.UID), entry.Input.Request.UID, "the webhook sees the UID the request is stored with")
	assert.Equal(t, "ichor:alice", entry.Input.Authorization.User)
	assert.Equal(t, "talosconfig-reader", entry.Input.Authorization.Subresource)
	assert.True(t, entry.Result.Allowed)
}

func TestWithoutTheVerbIsRefusedNamingItAndNoEventIsWritten(t *testing.T) {
	f := newFixture(t, true)
	// A viewer who may create requests (ichor-viewer alone may not even
	// create one; the API server refuses that before the webhook).
	f.role("create-requests", rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create"}})
	bob := f.user("ichor:bob", "ClusterRole/ichor-viewer", "Role/create-requests")

	err := bob.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)))
	msg := refusal(t, err)
	assert.Contains(t, msg, fmt.Sprintf(`NotAuthorized: user "ichor:bob" may not download talosclusters/talosconfig-reader "demo" in namespace %q`, f.ns))
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())

	// The refusal is logged, with the id the message gives.
	m := decisionIDPattern.FindStringSubmatch(msg)
	require.NotNil(t, m, msg)
	entry := harness.FindDecision[logEntry](t, decisionLog, m[1])
	assert.False(t, entry.Result.Allowed)
	assert.Equal(t, "ichor:bob", entry.Input.User.Username)
}

func TestOnlyTheCredentialsSubresourceIsNotEnough(t *testing.T) {
	f := newFixture(t, true)
	f.role("credentials-only",
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"}},
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"talosclusters/credentials"}, Verbs: []string{"download"}},
	)
	carol := f.user("ichor:carol", "Role/credentials-only")

	msg := refusal(t, carol.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))))
	assert.Contains(t, msg, `user "ichor:carol" may not download talosclusters/talosconfig-reader "demo"`)
	assert.Empty(t, f.events())
}

// componentsNamespace is the namespace the webhook of these tests names as
// Ichor's own ServiceAccounts' (--component-namespaces): that of
// TestAnotherComponentsServiceAccountIsRefused, as newFixture names it.
const componentsNamespace = "testanothercomponentsserviceaccountisrefused"

func TestAnotherComponentsServiceAccountIsRefused(t *testing.T) {
	f := newFixture(t, true)
	require.Equal(t, componentsNamespace, f.ns)
	// The UI backend's own identity: it may ask for its component purposes
	// (issue), never for a person's talosconfig.
	ui, username := f.serviceAccount("ichor-ui", "talosclusters/node-reader", "talosclusters/support-bundle")

	msg := refusal(t, ui.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))))
	assert.Contains(t, msg, fmt.Sprintf(`user %q may not download talosclusters/talosconfig-reader "demo"`, username))
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())

	// Its own purpose passes the same review, made as the same identity.
	require.NoError(t, ui.Create(f.ctx, f.request(ichorv1alpha1.PurposeNodeReader, "", ed25519Key(t))))
	events := f.events()
	require.Len(t, events, 1)
	assert.Equal(t, "NodeReader", events[0].Reason)
	assert.Contains(t, events[0].Message, "requested by "+username)
}

// A ServiceAccount of a namespace the manager does not name (made by that
// namespace's admin, bound issue, its token taken) is no component of
// Ichor's: refused Ichor's own purposes at admission, with nothing written
// (review 254 F4).
func TestAServiceAccountOfAnotherNamespaceIsRefusedIchorsOwnPurposes(t *testing.T) {
	f := newFixture(t, true)
	sa, username := f.serviceAccount("made-here", "talosclusters/node-reader")

	msg := refusal(t, sa.Create(f.ctx, f.request(ichorv1alpha1.PurposeNodeReader, "", ed25519Key(t))))
	assert.Contains(t, msg, fmt.Sprintf("PurposeNotForPeople: user %q may not be issued an os:reader identity to read one node: it is issued to a ServiceAccount of Ichor's only (of namespace %s)", username, componentsNamespace))
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())
}

// ADR 0124: Ichor's own purposes (an os:operator identity for one packet
// capture, an os:etcd:backup one for a snapshot) are its ServiceAccounts';
// nothing hands them to a person, even one granted their verb, issue, by a
// custom role (or a wildcard one: cluster-admin holds every verb). Before,
// only RBAC kept them from people.
func TestAPersonHoldingIssueIsRefusedIchorsOwnPurposes(t *testing.T) {
	f := newFixture(t, true)
	f.role("all-purposes",
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"}},
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"talosclusters/packet-capture", "talosclusters/etcd-snapshot"}, Verbs: []string{"issue"}},
	)
	alice := f.user("ichor:alice", "Role/all-purposes")
	for _, purpose := range []ichorv1alpha1.CredentialPurpose{ichorv1alpha1.PurposePacketCapture, ichorv1alpha1.PurposeEtcdSnapshot} {
		msg := refusal(t, alice.Create(f.ctx, f.request(purpose, "", ed25519Key(t))))
		assert.Contains(t, msg, "PurposeNotForPeople", purpose)
		assert.Contains(t, msg, `user "ichor:alice" may not be issued an os:`, purpose)
	}
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())
}

func TestLifetimeCapsAtAdmission(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")

	for _, tc := range []struct {
		ttl      string
		lifetime string
	}{
		{"", "1h0m0s"},
		{"12h", "12h0m0s"},
	} {
		before := len(f.events())
		require.NoError(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, tc.ttl, ed25519Key(t))), "ttl %q", tc.ttl)
		events := f.events()
		require.Len(t, events, before+1)
		assert.Contains(t, eventMessages(events), "an os:reader talosconfig was requested by ichor:alice (lifetime "+tc.lifetime+")")
	}

	before := len(f.events())
	msg := refusal(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "12h0m1s", ed25519Key(t))))
	assert.Contains(t, msg, `LifetimeTooLong: the lifetime 12h0m1s is above the cap of 12h0m0s for purpose "talosconfig-reader"; it is refused, not shortened`)
	assert.Len(t, f.events(), before)
	assert.Len(t, f.requests(), 2)
}

func TestDryRunWritesNoEvent(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")

	require.NoError(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)), client.DryRunAll))
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())

	// A dry run is judged like the real thing.
	msg := refusal(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "13h", ed25519Key(t)), client.DryRunAll))
	assert.Contains(t, msg, "LifetimeTooLong")
}

func TestAnEventThatCannotBeWrittenRefusesTheRequest(t *testing.T) {
	// The webhook may not create Events in this namespace.
	f := newFixture(t, false)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")

	err := alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)))
	msg := refusal(t, err)
	assert.Contains(t, msg, "refused because its issuance could not be recorded")
	assert.Contains(t, msg, fmt.Sprintf("TalosCluster %s/demo", f.ns))
	assert.Contains(t, msg, "forbidden")
	// A failure, not the rules' refusal: the exec plugin holds a 403 of the
	// webhook for a while, and must not hold this (review 259 F2).
	assert.True(t, apierrors.IsServiceUnavailable(err), "answered %v", err)
	assert.False(t, apierrors.IsForbidden(err))
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())
}

func TestBreakGlassIsAWarningAndNoShippedRoleHoldsIt(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-admin")
	msg := refusal(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeKubeconfigSuperAdmin, "", ed25519Key(t))))
	assert.Contains(t, msg, `user "ichor:alice" may not download talosclusters/kubeconfig-super-admin "demo"`)
	assert.Empty(t, f.events())

	f.role("break-glass",
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"create", "get"}},
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"talosclusters/kubeconfig-super-admin"}, ResourceNames: []string{"demo"}, Verbs: []string{"download"}},
	)
	dave := f.user("ichor:dave", "Role/break-glass")
	require.NoError(t, dave.Create(f.ctx, f.request(ichorv1alpha1.PurposeKubeconfigSuperAdmin, "", ed25519Key(t))))
	events := f.events()
	require.Len(t, events, 1)
	assert.Equal(t, corev1.EventTypeWarning, events[0].Type)
	assert.Equal(t, "KubeconfigSuperAdmin", events[0].Reason)
	assert.Equal(t, "a break-glass kubeconfig (CN=ichor-super-admin:u:ichor:dave, O=system:masters) was requested by ichor:dave (lifetime 15m0s)", events[0].Message)

	// The cap of the break-glass kubeconfig is an hour.
	msg = refusal(t, dave.Create(f.ctx, f.request(ichorv1alpha1.PurposeKubeconfigSuperAdmin, "1h0m1s", ed25519Key(t))))
	assert.Contains(t, msg, "LifetimeTooLong")
}

func TestPublicKeyFactsReachThePolicy(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")

	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	require.NoError(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ec.Public())))

	weak, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // the point: the policy refuses it
	require.NoError(t, err)
	msg := refusal(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", weak.Public())))
	assert.Contains(t, msg, `PublicKeyNotAllowed: public key "RSA 1024-bit" is not allowed`)

	// A 16,000-bit RSA key, which Go's TLS would not even use: only the
	// public half is needed to ask, so a random odd modulus stands for it.
	bytes16000 := make([]byte, 2000)
	_, err = rand.Read(bytes16000)
	require.NoError(t, err)
	bytes16000[0] |= 0x80
	bytes16000[len(bytes16000)-1] |= 1
	huge := &rsa.PublicKey{N: new(big.Int).SetBytes(bytes16000), E: 65537}
	msg = refusal(t, alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", huge)))
	assert.Contains(t, msg, `PublicKeyNotAllowed: public key "RSA 16000-bit" is not allowed`)

	garbage := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	garbage.Spec.PublicKey = "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n"
	msg = refusal(t, alice.Create(f.ctx, garbage))
	assert.Contains(t, msg, "PublicKeyInvalid: spec.publicKey does not parse as a PEM PUBLIC KEY block")
}

func TestMissingClusterIsRefused(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")
	tcr := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	tcr.Spec.ClusterName = "nope"
	msg := refusal(t, alice.Create(f.ctx, tcr))
	assert.Contains(t, msg, fmt.Sprintf(`ClusterNotFound: TalosCluster "nope" does not exist in namespace %q`, f.ns))
}

func eventMessages(events []corev1.Event) []string {
	out := make([]string, 0, len(events))
	for _, e := range events {
		out = append(out, e.Message)
	}
	return out
}

type logEntry struct {
	DecisionID string                          `json:"decision_id"`
	Path       string                          `json:"path"`
	Input      engine.CredentialAdmissionInput `json:"input"`
	Result     engine.CredentialAdmission      `json:"result"`
}

func TestARequesterWhoWritesSomeoneElsesIdentityIsRefusedByTheAPIServer(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")
	f.user("ichor:bob", "ClusterRole/ichor-admin")

	for name, forge := range map[string]func(*ichorv1alpha1.Requester){
		"username": func(r *ichorv1alpha1.Requester) { r.Username = "ichor:bob" },
		"groups":   func(r *ichorv1alpha1.Requester) { r.Groups = append(r.Groups, "ichor:admins") },
		"uid":      func(r *ichorv1alpha1.Requester) { r.UID = "bob-uid" },
		"extra":    func(r *ichorv1alpha1.Requester) { r.Extra = map[string][]string{"scopes": {"admin"}} },
		// The same sets, padded with copies of alice's own values: a
		// megabyte of them would be a megabyte in every decision's log
		// entry (review of 2026-12-05).
		"groups padded": func(r *ichorv1alpha1.Requester) { r.Groups = append(r.Groups, slices.Repeat(r.Groups, 100)...) },
		"extra padded": func(r *ichorv1alpha1.Requester) {
			for k, v := range r.Extra {
				r.Extra[k] = append(v, slices.Repeat(v, 100)...)
			}
		},
	} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			who, err := credential.WhoAmI(f.ctx, alice)
			require.NoError(t, err)
			require.NotEmpty(t, who.Groups)
			require.NotEmpty(t, who.Extra, "a certificate's user has its credential id in extra")
			forge(&who)
			tcr := f.request(ichorv1alpha1.PurposeCredentialsTalos, "", ed25519Key(t))
			tcr.Spec.Requester = who
			err = alice.Create(f.ctx, tcr)
			require.Error(t, err)
			t.Logf("refused: %v", err)
			assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy '"+webhooktest.RequesterPolicy+"'")
			assert.Contains(t, err.Error(), "spec.requester."+strings.Fields(name)[0]+" must be")
		})
	}
	assert.Empty(t, f.events(), "the webhook never saw the forged requests")
	assert.Empty(t, f.requests())
}

func TestARequestWithoutARequesterIsRefusedByTheAPIServer(t *testing.T) {
	f := newFixture(t, true)
	f.user("ichor:alice", "ClusterRole/ichor-operator")
	// An older client, which does not record who asks.
	cfg, err := env.UserConfig("ichor:alice")
	require.NoError(t, err)
	alice, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	err = alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)))
	require.Error(t, err)
	t.Logf("refused: %v", err)
	assert.Contains(t, err.Error(), "spec.requester.username")
	assert.Empty(t, f.requests())
}

func TestWithoutTheAdmissionPolicyTheWebhookStillRefusesAForgedRequester(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")

	// The policy's binding deleted by mistake: the API server no longer pins
	// the requester, the webhook does.
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKey{Name: webhooktest.RequesterPolicy}, &binding))
	require.NoError(t, env.Client.Delete(f.ctx, &binding))
	t.Cleanup(func() {
		restored := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: binding.Name}, Spec: binding.Spec}
		require.NoError(t, env.Client.Create(context.Background(), restored))
		require.NoError(t, webhooktest.WaitRequesterPolicy(context.Background(), env.Client, "default", true))
	})
	require.NoError(t, webhooktest.WaitRequesterPolicy(f.ctx, env.Client, "default", false))

	who, err := credential.WhoAmI(f.ctx, alice)
	require.NoError(t, err)
	who.Username = "ichor:bob"
	tcr := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	tcr.Spec.Requester = who
	msg := refusal(t, alice.Create(f.ctx, tcr))
	assert.Contains(t, msg, `RequesterMismatch: spec.requester ("ichor:bob") is not the user who made the request ("ichor:alice"): username differ`)
	assert.Empty(t, f.events())
	assert.Empty(t, f.requests())
}

func TestAKubeconfigForAClusterTheOperatorDidNotNameIsRefused(t *testing.T) {
	f := newFixture(t, true)
	require.NoError(t, env.Client.Create(f.ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "tenant"},
		Spec:       ichorv1alpha1.TalosClusterSpec{TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"}},
	}))
	bea := f.user("ichor:bea", "ClusterRole/ichor-admin")
	tcr := f.request(ichorv1alpha1.PurposeKubeconfigAdmin, "", ed25519Key(t))
	tcr.Spec.ClusterName = "tenant"
	msg := refusal(t, bea.Create(f.ctx, tcr))
	assert.Contains(t, msg, `ClusterNotLocal: TalosCluster "tenant" is not named as a cluster of the API server Ichor runs in`)
	// Its talosconfig is another matter: Talos credentials are for its own nodes.
	talos := f.request(ichorv1alpha1.PurposeCredentialsTalos, "", ed25519Key(t))
	talos.Spec.ClusterName = "tenant"
	require.NoError(t, bea.Create(f.ctx, talos))
}

// A bundle whose admission decision fails, admits without naming the Event
// that records the issuance, or admits a lifetime the record cannot hold,
// gets the request refused: nothing is stored, no Event is written, and the
// refusal says why.
func TestAnOddAdmissionAnswerIsARefusal(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")
	type oddCase struct {
		name   string
		answer func() (engine.CredentialAdmission, error)
		says   string
	}
	cases := []oddCase{
		{"failed", func() (engine.CredentialAdmission, error) {
			return engine.CredentialAdmission{}, errors.New("evaluate ichor/credentials/admission: builtin error")
		}, "builtin error"},
		{"no-event", func() (engine.CredentialAdmission, error) {
			return engine.CredentialAdmission{Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialAdmitted", Message: "yes"}}, DecisionID: "d-odd"}, nil
		}, "the policy names no Event to record its issuance"},
	}
	// A lifetime the record cannot hold (not a whole number of seconds, or
	// beyond what the issuer can sign for).
	for _, lifetime := range []float64{0, 1.5, -3600, math.NaN(), math.Inf(1), 1e19} {
		cases = append(cases, oddCase{fmt.Sprintf("lifetime %v", lifetime), func() (engine.CredentialAdmission, error) {
			return engine.CredentialAdmission{
				Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialAdmitted", Message: "yes"}}, DecisionID: "d-odd",
				LifetimeSeconds: lifetime, Credential: json.RawMessage(`{"credential":"talosconfig","kind":"talos","talos_role":"os:reader"}`),
				Event: &engine.CredentialEvent{Type: corev1.EventTypeNormal, Reason: "TalosconfigReader", Message: "odd"},
			}, nil
		}, "not a whole number from 1 to"})
	}
	// A credential the record cannot pin: not a JSON object, or larger than
	// a record holds.
	for name, pinned := range map[string]string{
		"credential an array": `["os:reader"]`, "credential null": `null`, "credential a string": `"os:reader"`,
		"credential too large": `{"kind":"talos","talos_role":"` + strings.Repeat("x", credential.MaxCredential) + `"}`,
	} {
		cases = append(cases, oddCase{name, func() (engine.CredentialAdmission, error) {
			return engine.CredentialAdmission{
				Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialAdmitted", Message: "yes"}}, DecisionID: "d-odd",
				LifetimeSeconds: 3600, Credential: json.RawMessage(pinned),
				Event: &engine.CredentialEvent{Type: corev1.EventTypeNormal, Reason: "TalosconfigReader", Message: "odd"},
			}, nil
		}, "the decision names a credential"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			odd.Set(f.ns, tc.answer)
			t.Cleanup(func() { odd.Set(f.ns, nil) })
			err := alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.says)
			assert.Empty(t, f.requests(), "nothing is stored")
			assert.Empty(t, f.events(), "no issuance is recorded")
		})
	}
}

// A bundle from before the pin names no credential. The issuer would
// refuse a record that pins none, so the webhook refuses the request at
// once, saying why; where unpinned records are accepted
// (--require-admission-pins=false, a rolling upgrade), the record pins none,
// as an older webhook's, and verifies only there.
func TestABundleWithoutThePinIsRefusedUnlessUnpinnedRecordsAreAccepted(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")
	odd.Set(f.ns, func() (engine.CredentialAdmission, error) {
		return engine.CredentialAdmission{
			Allowed: true, Reasons: engine.Reasons{{Code: "IchorCredentialAdmitted", Message: "yes"}}, DecisionID: "d-older",
			Purpose: string(ichorv1alpha1.PurposeTalosconfigReader), LifetimeSeconds: 3600,
			Event: &engine.CredentialEvent{Type: corev1.EventTypeNormal, Reason: "TalosconfigReader", Message: "an older bundle's"},
		}, nil
	})
	t.Cleanup(func() { odd.Set(f.ns, nil) })

	says := "the policy's admission decision names no credential to pin, and the manager requires admission pins (--require-admission-pins)"
	err := alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), says)
	assert.Empty(t, f.requests(), "nothing is stored")
	assert.Empty(t, f.events(), "no issuance is recorded")
	// A dry run says what the create would meet (review 34 L1).
	err = alice.Create(f.ctx, f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t)), client.DryRunAll)
	require.Error(t, err, "a dry run admitted what a create refuses")
	assert.Contains(t, err.Error(), says)

	v := &webhook.CredentialRequestValidator{
		Engine: decider, LocalClusters: local, Instance: "webhook-test", Keys: admissionKeys,
		Client: env.Client, Reader: env.Client, AcceptUnpinned: true,
	}
	req := f.dryRunBy(t, alice)
	req.DryRun = ptr.To(false)
	resp := v.Handle(f.ctx, req)
	require.NotNil(t, resp.Result)
	require.True(t, resp.Allowed, "refused: %s", resp.Result.Message)
	events := f.events()
	require.Len(t, events, 1)
	e := events[0]
	assert.NotContains(t, e.Annotations, credential.AnnotationCredential)
	assert.NotContains(t, e.Annotations, credential.AnnotationCredentialMAC)
	var tcr ichorv1alpha1.TalosCredentialRequest
	require.NoError(t, json.Unmarshal(req.Object.Raw, &tcr))
	key, err := admissionKeys.Key(f.ctx)
	require.NoError(t, err)
	ok, admitted, why := credential.Verify(key, &tcr, e.InvolvedObject.UID, &e, credential.AcceptUnpinned)
	assert.True(t, ok, why)
	assert.Nil(t, admitted.Credential)
	assert.Equal(t, int64(3600), admitted.LifetimeSeconds)
	ok, _, why = credential.Verify(key, &tcr, e.InvolvedObject.UID, &e, credential.RefuseUnpinned)
	assert.False(t, ok, "a record without the credential verified where pins are required")
	assert.Contains(t, why, "carries no ichor.dev/credential annotation nor its MAC")
}

// The SubjectAccessReview and the TalosCluster's read are made at once, so a
// request waits for the slower of the two round trips, not for both: here
// each waits for the other to have started, which neither order one after
// the other would do (each gives up after a while, with an error).
func TestTheReviewAndTheClusterReadAreMadeAtOnce(t *testing.T) {
	f := newFixture(t, true)
	review, read := make(chan struct{}), make(chan struct{})
	v := &webhook.CredentialRequestValidator{
		Engine: decider, LocalClusters: local, Instance: "webhook-test", Keys: admissionKeys,
		Client: reviewMeetsRead{Client: env.Client, review: review, read: read},
		Reader: readMeetsReview{Reader: env.Client, review: review, read: read},
	}
	resp := v.Handle(f.ctx, f.dryRunBy(t, f.user("ichor:alice", "ClusterRole/ichor-operator")))
	require.NotNil(t, resp.Result)
	assert.True(t, resp.Allowed, "refused: %s", resp.Result.Message)
}

// A panic in the part of the handling that runs beside the other is a
// failed request, as controller-runtime makes of a handler's own panic, and
// the manager goes on.
func TestAPanicBesideTheReviewIsAFailedRequest(t *testing.T) {
	f := newFixture(t, true)
	v := &webhook.CredentialRequestValidator{
		Engine: decider, LocalClusters: local, Instance: "webhook-test", Keys: admissionKeys,
		Client: env.Client, Reader: panickingReader{},
	}
	resp := v.Handle(f.ctx, f.dryRunBy(t, f.user("ichor:alice", "ClusterRole/ichor-operator")))
	require.NotNil(t, resp.Result)
	assert.False(t, resp.Allowed)
	assert.Equal(t, int32(http.StatusInternalServerError), resp.Result.Code)
	assert.Contains(t, resp.Result.Message, "panic: the reader broke")
}

// dryRunBy is the admission request of a dry-run create of a talosconfig
// reader's request by the user of c (no Event is written: the facts are what
// is looked at), as the API server sends it.
func (f *fixture) dryRunBy(t *testing.T, c client.Client) admission.Request {
	t.Helper()
	who, err := credential.WhoAmI(f.ctx, c)
	require.NoError(t, err)
	tcr := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	tcr.Name, tcr.UID, tcr.Spec.Requester = "demo-talosconfig-reader-x", "uid-x", who
	raw, err := json.Marshal(tcr)
	require.NoError(t, err)
	extra := map[string]authenticationv1.ExtraValue{}
	for k, vals := range who.Extra {
		extra[k] = vals
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "review-x", Operation: admissionv1.Create, Namespace: f.ns, DryRun: ptr.To(true),
		Kind:     metav1.GroupVersionKind{Group: "ichor.dev", Version: "v1alpha1", Kind: "TalosCredentialRequest"},
		Object:   runtime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: who.Username, UID: who.UID, Groups: who.Groups, Extra: extra},
	}}
}

// meet says that this side started, and waits a while for the other.
func meet(mine, theirs chan struct{}, what string) error {
	close(mine)
	select {
	case <-theirs:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s waited for the other in vain: one after the other", what)
	}
}

// readMeetsReview reads the TalosCluster once the review has started.
type readMeetsReview struct {
	client.Reader
	review, read chan struct{}
}

func (r readMeetsReview) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*ichorv1alpha1.TalosCluster); ok {
		if err := meet(r.read, r.review, "the TalosCluster's read"); err != nil {
			return err
		}
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// reviewMeetsRead makes the SubjectAccessReview once the read has started.
type reviewMeetsRead struct {
	client.Client
	review, read chan struct{}
}

func (c reviewMeetsRead) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*authorizationv1.SubjectAccessReview); ok {
		if err := meet(c.review, c.read, "the SubjectAccessReview"); err != nil {
			return err
		}
	}
	return c.Client.Create(ctx, obj, opts...)
}

type panickingReader struct{ client.Reader }

func (panickingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	panic("the reader broke")
}

// A review of a request the API server already stores is not the API
// server's: it reviews a create before it stores the request. Whoever can
// read a request the webhook never admitted (stored while the webhook
// configuration was missing; here, its record deleted) and reach the
// webhook's port posts a review of it, as its creator or as anyone: no record
// is written, so the issuer never signs it (review of 2026-12-06).
func TestAReviewOfARequestAlreadyStoredRecordsNothing(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")
	tcr := f.request(ichorv1alpha1.PurposeTalosconfigReader, "", ed25519Key(t))
	require.NoError(t, alice.Create(f.ctx, tcr))
	events := f.events()
	require.Len(t, events, 1)
	require.NoError(t, env.Client.Delete(f.ctx, &events[0]))

	v := directValidator()
	review := f.dryRunBy(t, alice)
	review.DryRun = nil
	raw, err := json.Marshal(tcr)
	require.NoError(t, err)
	review.Object.Raw = raw
	resp := v.Handle(f.ctx, review)
	require.NotNil(t, resp.Result)
	assert.False(t, resp.Allowed)
	assert.Contains(t, resp.Result.Message, fmt.Sprintf("the request %s/%s (UID %s) is stored already", f.ns, tcr.Name, tcr.UID))
	assert.Empty(t, f.events(), "a record was written for a review of a stored request")

	// The same review of a request not stored yet is the API server's
	// create: recorded.
	fresh := tcr.DeepCopy()
	fresh.Name, fresh.UID, fresh.ResourceVersion = tcr.Name+"-new", "uid-not-stored", ""
	raw, err = json.Marshal(fresh)
	require.NoError(t, err)
	review.Object.Raw = raw
	resp = v.Handle(f.ctx, review)
	require.NotNil(t, resp.Result)
	assert.True(t, resp.Allowed, resp.Result.Message)
	require.Len(t, f.events(), 1)
	assert.Equal(t, credential.RecordName("uid-not-stored"), f.events()[0].Name)
}

// A review whose user spec.requester could not hold (past the CRD's bounds)
// is refused before the access check, the policy and the log see it.
func TestAReviewOfAUserPastTheRequestersBoundsIsRefused(t *testing.T) {
	f := newFixture(t, true)
	alice := f.user("ichor:alice", "ClusterRole/ichor-operator")
	v := directValidator()
	review := f.dryRunBy(t, alice)
	resp := v.Handle(f.ctx, review)
	require.NotNil(t, resp.Result)
	require.True(t, resp.Allowed, "the control: %s", resp.Result.Message)
	// 1024 characters of two bytes each is within the CRD's maxLength,
	// which counts characters: not refused for its length.
	wide := f.dryRunBy(t, alice)
	wide.UserInfo.Username = strings.Repeat("é", 1024)
	resp = v.Handle(f.ctx, wide)
	require.NotNil(t, resp.Result)
	assert.NotContains(t, resp.Result.Message, "longer than")

	for name, c := range map[string]struct {
		change func(*authenticationv1.UserInfo)
		want   string
	}{
		"257 groups": {func(u *authenticationv1.UserInfo) {
			for i := len(u.Groups); i < 257; i++ {
				u.Groups = append(u.Groups, fmt.Sprintf("group-%d", i))
			}
		}, "the user is in 257 groups, more than the 256"},
		"65 extra attributes": {func(u *authenticationv1.UserInfo) {
			u.Extra = map[string]authenticationv1.ExtraValue{}
			for i := range 65 {
				u.Extra[fmt.Sprintf("key-%d", i)] = authenticationv1.ExtraValue{"v"}
			}
		}, "65 extra attributes"},
		"a name of a megabyte": {func(u *authenticationv1.UserInfo) { u.Username = strings.Repeat("a", 1<<20) }, "longer than 1024 characters"},
	} {
		t.Run(name, func(t *testing.T) {
			r := f.dryRunBy(t, alice)
			c.change(&r.UserInfo)
			resp := v.Handle(f.ctx, r)
			require.NotNil(t, resp.Result)
			assert.False(t, resp.Allowed)
			assert.Contains(t, resp.Result.Message, c.want)
		})
	}
}

// directValidator is the webhook as the tests' manager runs it, for a test
// that hands it reviews of its own rather than through the API server.
func directValidator() *webhook.CredentialRequestValidator {
	return &webhook.CredentialRequestValidator{
		Engine: decider, LocalClusters: local, Instance: "webhook-test", Keys: admissionKeys,
		Client: env.Client, Reader: env.Client,
	}
}
