package credentials_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// identityPart is the part of a person's identity after its prefix, as
// policy/ichor/credentials/identity.rego documents it: the username when
// short and plain, else the hash.
func identityPart(t *testing.T, c client.Client) string {
	t.Helper()
	who, err := credential.WhoAmI(t.Context(), c)
	require.NoError(t, err)
	return partOf(who.Username)
}

func partOf(username string) string {
	plain := len(username) <= 36 && username != "" && strings.Trim(username, "._@:-") == username &&
		strings.IndexFunc(username, func(r rune) bool {
			return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("._@:-", r)
		}) < 0
	if plain {
		return "u:" + username
	}
	sum := sha256.Sum256([]byte(username))
	return "h:" + hex.EncodeToString(sum[:])[:36]
}

// adminBindingsOf are the admin bindings whose manager-written username is
// username.
func adminBindingsOf(t *testing.T, username string) []rbacv1.ClusterRoleBinding {
	t.Helper()
	var list rbacv1.ClusterRoleBindingList
	require.NoError(t, env.Client.List(t.Context(), &list, client.HasLabels{credentials.LabelAdminBinding}))
	var out []rbacv1.ClusterRoleBinding
	for _, b := range list.Items {
		if b.Annotations[credentials.AnnotationAdminUsername] == username {
			out = append(out, b)
		}
	}
	return out
}

// issuedAdmin is one person's admin kubeconfig, issued.
type issuedAdmin struct {
	tcr     *ichorv1alpha1.TalosCredentialRequest
	cs      kubernetes.Interface
	binding rbacv1.ClusterRoleBinding
}

func (f *fixture) adminKubeconfig(c client.Client, username string) issuedAdmin {
	f.t.Helper()
	tcr, key := f.create(c, "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	tcr = f.answer(tcr)
	require.Equal(f.t, ichorv1alpha1.ReasonIssued, ready(f.t, tcr).Reason, ready(f.t, tcr).Message)
	bindings := adminBindingsOf(f.t, username)
	require.Len(f.t, bindings, 1)
	return issuedAdmin{tcr: tcr, cs: certClient(f.t, tcr.Status.Certificate, key), binding: bindings[0]}
}

// listNamespaces is one request as the certificate's user.
func listNamespaces(ctx context.Context, cs kubernetes.Interface) error {
	_, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 1})
	return err
}

// waitFor polls cond until it holds or 30 s pass.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond()
	})
	require.NoError(t, err, "waiting until %s", what)
}

func TestTwoAdminsAreEachNamedAndRevokingOneLeavesTheOther(t *testing.T) {
	f := newFixture(t)
	adaName, bobName := "ichor:ada", "ichor:bob"
	ada := f.adminKubeconfig(f.user(adaName, "ichor-admin"), adaName)
	bob := f.adminKubeconfig(f.user(bobName, "ichor-admin"), bobName)

	// Each certificate names its person, and its only group is its person's
	// own binding, which grants cluster-admin to that group alone.
	for _, p := range []struct {
		name string
		got  issuedAdmin
	}{{adaName, ada}, {bobName, bob}} {
		cert := parseCert(t, p.got.tcr.Status.Certificate)
		identity := "ichor-admin:u:" + p.name
		assert.Equal(t, identity, cert.Subject.CommonName)
		assert.Equal(t, []string{p.got.binding.Name}, cert.Subject.Organization)
		assert.True(t, strings.HasPrefix(p.got.binding.Name, identity+":"), p.got.binding.Name)
		assert.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}, p.got.binding.RoleRef)
		assert.Equal(t, []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: p.got.binding.Name}}, p.got.binding.Subjects)
		assert.Equal(t, identity, p.got.binding.Annotations[credentials.AnnotationAdminIdentity])
		assert.Equal(t, cert.NotAfter.UTC().Format(time.RFC3339), p.got.binding.Annotations[credentials.AnnotationCertificateExpiry])
		assert.Equal(t, credentials.ManagedBy, p.got.binding.Labels[credentials.LabelManagedBy])
		assert.Empty(t, p.got.binding.OwnerReferences, "the binding must outlive its request")

		// The API server sees the person: the authenticated user of a request.
		review, err := p.got.cs.AuthenticationV1().SelfSubjectReviews().Create(f.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Equal(t, identity, review.Status.UserInfo.Username)
		assert.Contains(t, review.Status.UserInfo.Groups, p.got.binding.Name)
		assert.NotContains(t, review.Status.UserInfo.Groups, "system:masters")
		waitFor(t, p.name+"'s admin kubeconfig works", func() (bool, error) { return listNamespaces(f.ctx, p.got.cs) == nil, nil })
	}
	assert.NotEqual(t, ada.binding.Name, bob.binding.Name)

	// Revoke Ada alone.
	require.NoError(t, credentials.RevokeBinding(f.ctx, env.Client, ada.binding.DeepCopy(), ""))
	waitFor(t, "Ada's next request is refused", func() (bool, error) {
		err := listNamespaces(f.ctx, ada.cs)
		if err == nil {
			return false, nil
		}
		if !apierrors.IsForbidden(err) {
			return false, err
		}
		// The authorizer names the person too.
		assert.Contains(t, err.Error(), `User "ichor-admin:u:ichor:ada" cannot list resource "namespaces"`)
		return true, nil
	})
	require.NoError(t, listNamespaces(f.ctx, bob.cs), "Bob's admin kubeconfig stopped working when Ada's was revoked")
	cacheForgets(t, ada.binding.Name)

	// Ada asks again: a new binding and a new group; her revoked certificate
	// (a leaked one, say) stays powerless.
	newAda := f.adminKubeconfig(f.clientOf(adaName), adaName)
	assert.NotEqual(t, ada.binding.Name, newAda.binding.Name)
	waitFor(t, "Ada's new admin kubeconfig works", func() (bool, error) { return listNamespaces(f.ctx, newAda.cs) == nil, nil })
	assert.True(t, apierrors.IsForbidden(listNamespaces(f.ctx, ada.cs)), "the revoked certificate came back with the new binding")
	require.NoError(t, listNamespaces(f.ctx, bob.cs))

	// The API server's audit log names each person as the user of their
	// requests: the allowed ones, and Ada's refused ones after revocation.
	for _, want := range []struct {
		user string
		code int
	}{{"ichor-admin:u:ichor:ada", 200}, {"ichor-admin:u:ichor:bob", 200}, {"ichor-admin:u:ichor:ada", 403}} {
		waitFor(t, fmt.Sprintf("the audit log has a list of namespaces by %s answered %d", want.user, want.code), func() (bool, error) {
			events, err := env.AuditEvents(func(e harness.AuditEvent) bool {
				return e.User.Username == want.user && e.Verb == "list" && strings.HasPrefix(e.RequestURI, "/api/v1/namespaces?") && e.ResponseStatus.Code == want.code
			})
			return len(events) > 0, err
		})
	}
}

// clientOf is a client of a user f.user already bound.
func (f *fixture) clientOf(name string) client.Client {
	f.t.Helper()
	cfg, err := env.UserConfig(name)
	require.NoError(f.t, err)
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(f.t, err)
	c, err = webhooktest.Requesting(f.ctx, c)
	require.NoError(f.t, err)
	return c
}

func publicKeyPEM(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func TestTheAdminBindingOutlivesItsRequestAndIsReused(t *testing.T) {
	f := newFixture(t)
	name := "ichor:dora"
	dora := f.user(name, "ichor-admin")
	first := f.adminKubeconfig(dora, name)

	// The request is deleted (as at the end of its retention); the binding stays.
	require.NoError(t, env.Client.Delete(f.ctx, first.tcr))
	waitFor(t, "the request is gone", func() (bool, error) {
		err := env.Client.Get(f.ctx, client.ObjectKeyFromObject(first.tcr), &ichorv1alpha1.TalosCredentialRequest{})
		return apierrors.IsNotFound(err), nil
	})
	require.Len(t, adminBindingsOf(t, name), 1)
	require.NoError(t, listNamespaces(f.ctx, first.cs))

	// A second kubeconfig of the same person reuses the binding: one group per
	// person, and the latest expiry recorded.
	f.skew = time.Hour
	second := f.adminKubeconfig(dora, name)
	assert.Equal(t, first.binding.Name, second.binding.Name)
	assert.Equal(t, []string{first.binding.Name}, parseCert(t, second.tcr.Status.Certificate).Subject.Organization)
	assert.Equal(t, second.tcr.Status.ExpiresAt.UTC().Format(time.RFC3339), second.binding.Annotations[credentials.AnnotationCertificateExpiry])
}

func TestHostileUsernamesAreHashedOrRefused(t *testing.T) {
	f := newFixture(t)
	// A Cyrillic "а" that reads as ichor:alice, and a name too long to stay
	// plain: both hashed, neither is ichor:alice's identity.
	for _, name := range []string{"ichor:\u0430lice", "ichor:" + strings.Repeat("x", 60)} {
		got := f.adminKubeconfig(f.user(name, "ichor-admin"), name)
		cert := parseCert(t, got.tcr.Status.Certificate)
		assert.Equal(t, "ichor-admin:"+partOf(name), cert.Subject.CommonName)
		assert.True(t, strings.HasPrefix(cert.Subject.CommonName, "ichor-admin:h:"), cert.Subject.CommonName)
		assert.Equal(t, name, got.binding.Annotations[credentials.AnnotationAdminUsername])
	}

	// A system: name is refused at admission, before anything is recorded.
	mallory := "system:masters-lookalike"
	c := f.user(mallory, "ichor-admin")
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, GenerateName: "demo-kubeconfig-admin-"},
		Spec:       ichorv1alpha1.TalosCredentialRequestSpec{ClusterName: "demo", Purpose: ichorv1alpha1.PurposeKubeconfigAdmin, PublicKey: publicKeyPEM(t)},
	}
	err := c.Create(f.ctx, tcr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `UsernameReserved: user "system:masters-lookalike" may not be issued a cluster-admin kubeconfig`)
	assert.Empty(t, adminBindingsOf(t, mallory))
}

func TestRevocationIsRecordedAndTheOperatorsRevocationRemovesEveryBinding(t *testing.T) {
	f := newFixture(t)
	eve := f.adminKubeconfig(f.user("ichor:eve", "ichor-admin"), "ichor:eve")
	fay := f.adminKubeconfig(f.user("ichor:fay", "ichor-admin"), "ichor:fay")

	cfg, err := env.UserConfig(controllerUser)
	require.NoError(t, err)
	mgr, err := env.NewManager(cfg, nil)
	require.NoError(t, err)
	watcher := &credentials.AdminBindings{Engine: eng, Recorder: recorder, AdminKubeconfigs: true}
	require.NoError(t, watcher.SetupWithManager(mgr))
	ctx, cancel := context.WithCancel(f.ctx)
	done := harness.RunManager(ctx, mgr, "admin bindings")
	t.Cleanup(func() { cancel(); <-done })
	// The watch has seen the bindings once each reconciled (the first list).
	waitFor(t, "the watch has seen the bindings", func() (bool, error) {
		return reconciled(t, "admin-bindings") >= 2, nil
	})

	// Eve is revoked by a person: the decision log's record and the Event name
	// her, and say where the revoker is recorded.
	require.NoError(t, credentials.RevokeBinding(f.ctx, env.Client, eve.binding.DeepCopy(), ""))
	want := `Revoked the admin binding of "ichor:eve" (ichor-admin:u:ichor:eve) by "` + credentials.RevokedByUnknown + `"`
	waitFor(t, "the revocation is in the decision log", func() (bool, error) {
		return strings.Contains(decisionLog.String(), jsonText(want)), nil
	})
	var entry struct {
		Path  string         `json:"path"`
		Input engine.Applied `json:"input"`
	}
	for line := range strings.SplitSeq(decisionLog.String(), "\n") {
		if strings.Contains(line, jsonText(want)) {
			require.NoError(t, json.Unmarshal([]byte(line), &entry))
		}
	}
	assert.Equal(t, engine.PathApplied, entry.Path)
	assert.Equal(t, eve.binding.Annotations[credentials.AnnotationDecisionID], entry.Input.DecisionID, "the record names the decision that made the binding")
	assert.Equal(t, "clusterrolebinding/"+eve.binding.Name, entry.Input.Object)
	assert.Equal(t, string(eve.binding.UID), entry.Input.UID)
	assert.Equal(t, engine.AppliedObserved, entry.Input.Outcome, "the watch saw the binding deleted")
	waitFor(t, "the revocation Event", func() (bool, error) {
		var list eventsv1.EventList
		if err := env.Client.List(f.ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == eve.binding.Name && e.Reason == credentials.ReasonAdminRevoked {
				assert.Contains(t, e.Note, want)
				return true, nil
			}
		}
		return false, nil
	})

	// The operator revokes admin kubeconfigs: a manager started with
	// --admin-kubeconfigs=false reconciles every admin binding it lists at
	// start and removes it, naming the operator.
	revoked := &credentials.AdminBindings{Client: ctrlClient, Engine: eng, AdminKubeconfigs: false}
	for _, b := range adminBindingsOf(t, "ichor:fay") {
		_, err := revoked.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
		require.NoError(t, err)
	}
	waitFor(t, "Fay's binding is removed", func() (bool, error) {
		return len(adminBindingsOf(t, "ichor:fay")) == 0, nil
	})
	waitFor(t, "Fay's admin kubeconfig is refused", func() (bool, error) {
		return apierrors.IsForbidden(listNamespaces(f.ctx, fay.cs)), nil
	})
	waitFor(t, "the operator's revocation is in the decision log", func() (bool, error) {
		return strings.Contains(decisionLog.String(), jsonText(`Revoked the admin binding of "ichor:fay" (ichor-admin:u:ichor:fay) by "`+credentials.RevokedByOperator+`"`)), nil
	})

	// Whoever may label a binding cannot have the manager delete one that is
	// not an admin's (hostile review F2): a binding labelled as Ichor's whose
	// name or role is not an admin binding's is left alone.
	for _, decoy := range []*rbacv1.ClusterRoleBinding{
		{ObjectMeta: metav1.ObjectMeta{Name: "decoy-basic-user", Labels: map[string]string{credentials.LabelAdminBinding: "true"}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:authenticated-decoy"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "ichor-admin:u:decoy:view", Labels: map[string]string{credentials.LabelAdminBinding: "true"}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "ichor-admin:u:decoy:view"}}},
	} {
		require.NoError(t, env.Client.Create(f.ctx, decoy))
		t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(f.ctx), decoy) })
		_, err := revoked.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(decoy)})
		require.NoError(t, err)
		// RemoveAdminBindings (at start) skips what Revocable refuses; it is
		// not called here, as it would remove the other tests' bindings.
		assert.False(t, credentials.Revocable(decoy), "%s is revocable", decoy.Name)
		require.NoError(t, env.Client.Get(f.ctx, client.ObjectKeyFromObject(decoy), &rbacv1.ClusterRoleBinding{}), "%s was deleted", decoy.Name)
	}
}

// The hostile review of 2026-12-05: the manager watches only the bindings
// labelled as Ichor's, and the API server tells such a watch of a binding
// whose label is taken off as of one deleted. Taking the label off an admin
// binding was recorded as its revocation, while the person kept
// cluster-admin. It is now no revocation, and a Warning says that the
// binding still grants cluster-admin and is no longer tracked; a binding
// deleted for real through the same watch is still recorded.
func TestALabelTakenOffAnAdminBindingIsNoRevocation(t *testing.T) {
	f := newFixture(t)
	ivy := f.adminKubeconfig(f.user("ichor:ivy", "ichor-admin"), "ichor:ivy")
	jon := f.adminKubeconfig(f.user("ichor:jon", "ichor-admin"), "ichor:jon")
	kim := f.adminKubeconfig(f.user("ichor:kim", "ichor-admin"), "ichor:kim")
	// Whoever may make bindings can label one to a harmless role and
	// claim it is Ivy's.
	decoy := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ichor-admin:u:decoy:viewer", Labels: map[string]string{credentials.LabelAdminBinding: "true"},
			Annotations: map[string]string{credentials.AnnotationAdminUsername: "ichor:ivy"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "ichor-admin:u:decoy:viewer"}},
	}
	require.NoError(t, env.Client.Create(f.ctx, decoy))
	t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(f.ctx), decoy) })

	cfg, err := env.UserConfig(controllerUser)
	require.NoError(t, err)
	// The manager's cache, as internal/manager sets it: only the labelled
	// bindings are watched.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Another test of this process runs the same controller.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&rbacv1.ClusterRoleBinding{}: {Label: labels.SelectorFromSet(labels.Set{credentials.LabelAdminBinding: "true"})},
		}},
	})
	require.NoError(t, err)
	watcher := &credentials.AdminBindings{Engine: eng, Recorder: recorder, AdminKubeconfigs: true}
	require.NoError(t, watcher.SetupWithManager(mgr))
	before := reconciled(t, "admin-bindings")
	ctx, cancel := context.WithCancel(f.ctx)
	done := harness.RunManager(ctx, mgr, "admin bindings")
	t.Cleanup(func() { cancel(); <-done })
	// The watch has told of the bindings (each reconciled once).
	waitFor(t, "the watch has seen the bindings", func() (bool, error) {
		return reconciled(t, "admin-bindings") >= before+4, nil
	})
	unlabel := func(b client.Object) {
		t.Helper()
		require.NoError(t, env.Client.Patch(f.ctx, b,
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+credentials.LabelAdminBinding+`":null}}}`))))
	}

	// Ivy's label is taken off: no revocation, and a Warning.
	unlabel(ivy.binding.DeepCopy())
	t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(f.ctx), ivy.binding.DeepCopy()) })
	eventOf := func(binding, reason string) (*eventsv1.Event, error) {
		var list eventsv1.EventList
		if err := env.Client.List(f.ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return nil, err
		}
		for i, e := range list.Items {
			if e.Regarding.Name == binding && e.Reason == reason {
				return &list.Items[i], nil
			}
		}
		return nil, nil
	}
	waitFor(t, "the Warning of the unlabelled binding", func() (bool, error) {
		e, err := eventOf(ivy.binding.Name, credentials.ReasonAdminBindingUntracked)
		if e != nil {
			assert.Equal(t, "Warning", e.Type)
			assert.Contains(t, e.Note, `"ichor-admin:u:ichor:ivy"`, "the person is not read from the binding's name")
			assert.Contains(t, e.Note, "still grants cluster-admin")
		}
		return e != nil, err
	})
	require.NoError(t, listNamespaces(f.ctx, ivy.cs), "Ivy's admin kubeconfig no longer works")

	// The decoy's label is taken off: nothing is said of Ivy.
	unlabel(decoy.DeepCopy())

	// Kim's binding is held by a finalizer, deleted, then unlabelled: no
	// watch would see it go, so it is recorded now.
	require.NoError(t, env.Client.Patch(f.ctx, kim.binding.DeepCopy(),
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":["ichor-test/hold"]}}`))))
	t.Cleanup(func() {
		_ = env.Client.Patch(context.WithoutCancel(f.ctx), kim.binding.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	})
	require.NoError(t, env.Client.Delete(f.ctx, kim.binding.DeepCopy()))
	unlabel(kim.binding.DeepCopy())
	waitFor(t, "Kim's revocation, held and unlabelled, is in the decision log", func() (bool, error) {
		return strings.Contains(decisionLog.String(), jsonText(`Revoked the admin binding of "ichor:kim"`)), nil
	})
	waitFor(t, "the Warning that Kim's held binding still grants", func() (bool, error) {
		e, err := eventOf(kim.binding.Name, credentials.ReasonAdminBindingUntracked)
		if e != nil {
			assert.Contains(t, e.Note, "finalizers hold it")
		}
		return e != nil, err
	})

	// Jon's binding is deleted: recorded, after the others, so that the
	// watch has told of them all by the time Jon's record is seen.
	require.NoError(t, credentials.RevokeBinding(f.ctx, env.Client, jon.binding.DeepCopy(), ""))
	waitFor(t, "Jon's revocation is in the decision log", func() (bool, error) {
		return strings.Contains(decisionLog.String(), jsonText(`Revoked the admin binding of "ichor:jon"`)), nil
	})
	assert.NotContains(t, decisionLog.String(), jsonText(`Revoked the admin binding of "ichor:ivy"`), "a label taken off was recorded as a revocation")
	e, err := eventOf(ivy.binding.Name, credentials.ReasonAdminRevoked)
	require.NoError(t, err)
	assert.Nil(t, e, "a label taken off was said as a revocation")
	e, err = eventOf(decoy.Name, credentials.ReasonAdminBindingUntracked)
	require.NoError(t, err)
	assert.Nil(t, e, "a decoy's label taken off was said as an admin's binding untracked")
}

// reconciled is how many reconciles the controller named name has made,
// from controller-runtime's metrics.
func reconciled(t *testing.T, name string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, fam := range families {
		if fam.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == name {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// jsonText is s as it reads inside a JSON string.
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return strings.Trim(string(b), `"`)
}

// Anyone who may patch bindings can add a finalizer to a person's binding, so
// that deleting it only marks it deleted while the RBAC authorizer still
// honours it. The operator's revocation takes such finalizers off: the
// binding goes, and the person's admin kubeconfig is refused (review of
// 2026-12-05; before, the manager logged it removed and it kept
// cluster-admin).
func TestTheOperatorsRevocationRemovesAHeldBinding(t *testing.T) {
	f := newFixture(t)
	name := "ichor:ivy"
	ivy := f.adminKubeconfig(f.user(name, "ichor-admin"), name)
	b := ivy.binding.DeepCopy()
	patch := client.MergeFrom(b.DeepCopy())
	b.Finalizers = []string{"review.example/hold"}
	require.NoError(t, env.Client.Patch(f.ctx, b, patch))

	revoked := &credentials.AdminBindings{Client: ctrlClient, Engine: eng, AdminKubeconfigs: false}
	waitFor(t, "Ivy's held binding is removed", func() (bool, error) {
		// As the watch would: each change of the binding is reconciled.
		if _, err := revoked.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(b)}); err != nil {
			return false, err
		}
		err := env.Client.Get(f.ctx, client.ObjectKeyFromObject(b), &rbacv1.ClusterRoleBinding{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	waitFor(t, "Ivy's admin kubeconfig is refused", func() (bool, error) {
		return apierrors.IsForbidden(listNamespaces(f.ctx, ivy.cs)), nil
	})
}

// TestAHeldAdminBindingIsNotReused: anyone who may patch bindings (no bind
// needed) can add a finalizer to a person's binding, so that revoking it
// only requests its deletion (review 3, F4). The issuer signs for no binding
// that has finalizers or is being deleted: the request fails, nothing signed.
func TestAHeldAdminBindingIsNotReused(t *testing.T) {
	f := newFixture(t)
	name := "ichor:hal"
	hal := f.user(name, "ichor-admin")
	first := f.adminKubeconfig(hal, name)
	b := first.binding.DeepCopy()
	patch := client.MergeFrom(b.DeepCopy())
	b.Finalizers = []string{"review3.example/hold"}
	require.NoError(t, env.Client.Patch(f.ctx, b, patch))
	t.Cleanup(func() { releaseHold(t, f, b) })

	for _, step := range []string{"held by a finalizer", "and its deletion requested"} {
		if step == "and its deletion requested" {
			require.NoError(t, env.Client.Delete(f.ctx, b))
		}
		tcr, _ := f.create(hal, "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
		tcr = f.answer(tcr)
		c := ready(t, tcr)
		assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason, step)
		assert.Contains(t, c.Message, "review3.example/hold", step)
		assert.Empty(t, tcr.Status.Certificate, step)
	}
}

// Review 161: the Warning that a binding was refused (here, held by a
// finalizer) was written before the Failed answer was stored; when that
// write failed and the hold was gone by the next look, the request was
// issued and carried a Warning saying nothing was bound or signed. It is
// now written once the answer is stored.
func TestABindingRefusalThatWasNotStoredLeavesNoWarning(t *testing.T) {
	f := newFixture(t)
	name := "ichor:una"
	una := f.user(name, "ichor-admin")
	first := f.adminKubeconfig(una, name)
	b := first.binding.DeepCopy()
	hold := client.MergeFrom(b.DeepCopy())
	b.Finalizers = []string{"review161.example/hold"}
	require.NoError(t, env.Client.Patch(f.ctx, b, hold))
	t.Cleanup(func() { releaseHold(t, f, b) })
	waitFor(t, "the cache shows the hold", func() (bool, error) {
		var cached rbacv1.ClusterRoleBinding
		err := ctrlClient.Get(f.ctx, client.ObjectKeyFromObject(b), &cached)
		return err == nil && len(cached.Finalizers) == 1, err
	})

	f.r.Client = &failFirstStatus{Client: f.r.Client}
	tcr, _ := f.create(una, "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	_, err := f.r.Reconcile(f.ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tcr)})
	require.ErrorContains(t, err, "the API server went away")
	releaseHold(t, f, b)
	waitFor(t, "the cache shows the hold gone", func() (bool, error) {
		var cached rbacv1.ClusterRoleBinding
		err := ctrlClient.Get(f.ctx, client.ObjectKeyFromObject(b), &cached)
		return err == nil && len(cached.Finalizers) == 0, err
	})
	got := f.answer(tcr)
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, got).Reason, ready(t, got).Message)

	// The recorder writes its Events in order: once a marker written after
	// is there, a Warning of the refused binding would be too.
	recorder.Eventf(got, nil, corev1.EventTypeNormal, "TestMarker", "Test", "after the answer")
	var list eventsv1.EventList
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(f.ns)))
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool { return e.Reason == "TestMarker" && e.Regarding.Name == got.Name })
	}, 10*time.Second, 50*time.Millisecond)
	for _, e := range list.Items {
		if e.Regarding.Name == got.Name {
			assert.NotEqual(t, credentials.ReasonAdminBindingRefused, e.Reason, "a Warning of a refusal never stored: %s", e.Note)
		}
	}
}

// releaseHold takes the finalizers off the binding b, if it is still there.
func releaseHold(t *testing.T, f *fixture, b *rbacv1.ClusterRoleBinding) {
	t.Helper()
	ctx := context.WithoutCancel(f.ctx)
	var now rbacv1.ClusterRoleBinding
	if env.Client.Get(ctx, client.ObjectKeyFromObject(b), &now) == nil {
		p := client.MergeFrom(now.DeepCopy())
		now.Finalizers = nil
		require.NoError(t, client.IgnoreNotFound(env.Client.Patch(ctx, &now, p)))
	}
}
