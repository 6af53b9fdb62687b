package credentials_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// Review 2, F3: Go does not write whatever binding a decision names. A
// bundle (broken, or not the one the operator meant) whose decision for an
// admin kubeconfig names a binding other than the one Ichor makes for that
// requester gets nothing bound and nothing signed: the request fails, and a
// Warning Event says why. Before the check, the manager's rights (create on
// every binding, bind on cluster-admin) made each of these.
func TestADecisionsBindingOtherThanIchorsIsNeitherMadeNorSigned(t *testing.T) {
	f := newFixture(t)
	name := "ichor:gil"
	gil := f.user(name, "ichor-admin")
	identity := "ichor-admin:" + partOf(name)
	for what, tamper := range map[string]func(b *engine.AdminBindingDecision){
		"the group is system:authenticated": func(b *engine.AdminBindingDecision) { b.Group = "system:authenticated" },
		"the role is admin":                 func(b *engine.AdminBindingDecision) { b.ClusterRole = "admin" },
		"the name is another person's": func(b *engine.AdminBindingDecision) {
			b.Name, b.Group, b.Identity = "ichor-admin:u:mallory:aaaaaaaaaa", "ichor-admin:u:mallory:aaaaaaaaaa", "ichor-admin:u:mallory"
		},
		"the name is not an admin binding's": func(b *engine.AdminBindingDecision) { b.Name, b.Group = "gil-cluster-admin", "gil-cluster-admin" },
		"the nonce is not the one drawn": func(b *engine.AdminBindingDecision) {
			b.Name = identity + ":zzzzzzzzzz"
			b.Group = b.Name
		},
		"it reuses a binding not listed": func(b *engine.AdminBindingDecision) {
			b.Name, b.Group, b.Create = identity+":zzzzzzzzzz", identity+":zzzzzzzzzz", false
		},
	} {
		t.Run(strings.ReplaceAll(what, " ", "_"), func(t *testing.T) {
			var made string
			f.r.Engine = &enginetest.Engine{Engine: eng, IssuanceFunc: func(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
				d, err := eng.Issuance(ctx, in)
				if err != nil || d.AdminBinding == nil {
					return d, err
				}
				tamper(d.AdminBinding)
				// The certificate follows the binding, as a bundle that
				// means it would write it.
				d.Certificate.Groups = []string{d.AdminBinding.Group}
				made = d.AdminBinding.Name
				return d, nil
			}}
			t.Cleanup(func() { f.r.Engine = eng })
			tcr, _ := f.create(gil, "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
			tcr = f.answer(tcr)
			c := ready(t, tcr)
			assert.Equal(t, ichorv1alpha1.ReasonFailed, c.Reason, c.Message)
			assert.Contains(t, c.Message, "is not what Ichor makes for this request")
			assert.Empty(t, tcr.Status.Certificate)
			require.NotEmpty(t, made)
			err := env.Client.Get(f.ctx, client.ObjectKey{Name: made}, &rbacv1.ClusterRoleBinding{})
			if !apierrors.IsNotFound(err) {
				_ = env.Client.Delete(context.WithoutCancel(f.ctx), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: made}})
			}
			assert.True(t, apierrors.IsNotFound(err), "the decision's binding %s was made: %v", made, err)
			assert.Empty(t, adminBindingsOf(t, name), "a binding was made for the person")
			waitFor(t, "the Warning Event on the request", func() (bool, error) {
				var list eventsv1.EventList
				if err := env.Client.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
					return false, err
				}
				return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
					return e.Regarding.Name == tcr.Name && e.Reason == credentials.ReasonAdminBindingRefused &&
						strings.Contains(e.Note, "nothing bound or signed")
				}), nil
			})
		})
	}

	// The untampered decision, for the same person, binds and signs.
	got := f.adminKubeconfig(gil, name)
	require.NoError(t, credentials.AdminBindingShape(&got.binding))
}

// The shape check itself: what Ichor makes passes; each departure is named.
func TestAdminBindingShape(t *testing.T) {
	ours := func() *rbacv1.ClusterRoleBinding {
		name := "ichor-admin:u:ichor:ada:0123456789"
		return &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{credentials.LabelAdminBinding: "true"}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}},
		}
	}
	require.NoError(t, credentials.AdminBindingShape(ours()))
	hashed := ours()
	hashed.Name = "ichor-admin:h:0123456789abcdef0123456789abcdef0123:aaaaaaaaaa"
	hashed.Subjects[0].Name = hashed.Name
	require.NoError(t, credentials.AdminBindingShape(hashed))
	for want, change := range map[string]func(b *rbacv1.ClusterRoleBinding){
		"its name": func(b *rbacv1.ClusterRoleBinding) { b.Name = "cluster-admin"; b.Subjects[0].Name = b.Name },
		"is not ichor-admin:": func(b *rbacv1.ClusterRoleBinding) {
			b.Name = "ichor-admin:x:ada:0123456789"
			b.Subjects[0].Name = b.Name
		},
		"lacks the label":       func(b *rbacv1.ClusterRoleBinding) { b.Labels = nil },
		"not the ClusterRole":   func(b *rbacv1.ClusterRoleBinding) { b.RoleRef.Name = "view" },
		"not exactly the group": func(b *rbacv1.ClusterRoleBinding) { b.Subjects[0].Name = "system:authenticated" },
		"not exactly the group named": func(b *rbacv1.ClusterRoleBinding) {
			b.Subjects = append(b.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "mallory"})
		},
	} {
		b := ours()
		change(b)
		err := credentials.AdminBindingShape(b)
		require.Error(t, err, want)
		assert.Contains(t, err.Error(), want)
	}
}

// decoyBinding is a binding anyone with create on clusterrolebindings and the
// role's permissions can make: labelled as Ichor's, named as an admin's.
func decoyBinding(name, role string) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{credentials.LabelAdminBinding: "true", "ichor-test/decoy": "true"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}},
	}
}

// cacheHas waits until the issuer's cache holds the binding.
func cacheHas(t *testing.T, name string) {
	t.Helper()
	waitFor(t, "the cache holds "+name, func() (bool, error) {
		err := bindings.Get(t.Context(), client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{})
		return err == nil, client.IgnoreNotFound(err)
	})
}

// cacheForgets waits until the issuer's cache no longer holds the binding:
// a request decided before would reuse it, find it gone, and be decided
// again (an error, which the controller retries).
func cacheForgets(t *testing.T, name string) {
	t.Helper()
	waitFor(t, "the cache forgets "+name, func() (bool, error) {
		err := bindings.Get(t.Context(), client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// ignoredTotal is ichor_admin_bindings_ignored_total.
func ignoredTotal(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() == "ichor_admin_bindings_ignored_total" {
			return fam.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// Review 2, F5: whoever may create bindings may bind a role whose
// permissions they hold (view) without bind. A binding of a person's name to
// such a role used to refuse that person for good (AdminBindingAltered); it
// is not Ichor's, so it is ignored, counted and logged, and the person gets
// a binding of their own.
func TestABindingOfAPersonsNameToAnotherRoleBlocksNobody(t *testing.T) {
	f := newFixture(t)
	name := "ichor:hal"
	hal := f.user(name, "ichor-admin")
	decoy := decoyBinding("ichor-admin:"+partOf(name)+":aaaaaaaaaa", "view")
	require.NoError(t, env.Client.Create(f.ctx, decoy))
	t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(f.ctx), decoy) })
	cacheHas(t, decoy.Name)
	before := ignoredTotal(t)

	tcr, _ := f.create(hal, "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	tcr = f.answer(tcr)
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
	group := parseCert(t, tcr.Status.Certificate).Subject.Organization
	require.Len(t, group, 1)
	assert.NotEqual(t, decoy.Name, group[0], "the certificate's group is the decoy")
	var made rbacv1.ClusterRoleBinding
	require.NoError(t, env.Client.Get(f.ctx, client.ObjectKey{Name: group[0]}, &made))
	require.NoError(t, credentials.AdminBindingShape(&made))
	assert.Equal(t, before+1, ignoredTotal(t), "the decoy is counted")
}

// Review 2, F5: more than 1000 labelled bindings used to stop every
// TalosCredentialRequest of every purpose (the issuer listed them all, for
// every request). Now only an admin kubeconfig's request reads bindings, and
// only its requester's.
func TestManyLabelledBindingsBlockNoIssuance(t *testing.T) {
	f := newFixture(t)
	const n = credentials.MaxAdminBindings + 1
	t.Cleanup(func() {
		_ = env.Client.DeleteAllOf(context.WithoutCancel(f.ctx), &rbacv1.ClusterRoleBinding{}, client.MatchingLabels{"ichor-test/decoy": "true"})
	})
	for i := range n {
		require.NoError(t, env.Client.Create(f.ctx, decoyBinding(fmt.Sprintf("ichor-test-flood-%04d", i), "view")))
	}
	cacheHas(t, fmt.Sprintf("ichor-test-flood-%04d", n-1))

	reader, _ := f.ask("demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, reader).Reason, ready(t, reader).Message)
	f.adminKubeconfig(f.user("ichor:ivy", "ichor-admin"), "ichor:ivy")
}

// Review 2, F5: API requests per issuance, from the API server's audit log.
// An issuer with a user of its own (the controller's rights) answers one
// Talos credential request and one admin kubeconfig request; neither makes a
// request on clusterrolebindings but the admin kubeconfig's create, and the
// Talos one makes none at all (it used to list every labelled binding,
// uncached, for every purpose).
func TestAnIssuanceReadsNoBindingsFromTheAPIServer(t *testing.T) {
	f := newFixture(t)
	const user = "ichor-test:measured-issuer"
	rules, err := webhooktest.MarkerRules("controllers/credentials")
	require.NoError(t, err)
	keyRules, err := webhooktest.NamespacedMarkerRules("internal/facts/credential")
	require.NoError(t, err)
	require.NoError(t, grant(f.ctx, user, rules, keyRules))
	cfg, err := env.UserConfig(user)
	require.NoError(t, err)
	measured, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	f.r.Client, f.r.APIReader, f.r.Keys, f.r.Recorder = measured, measured, env.AdmissionKeys(measured), nil

	// Every request the issuer makes for one answer, up to a marker request
	// whose entry says the log holds them all.
	requests := func(tcr *ichorv1alpha1.TalosCredentialRequest) []string {
		t.Helper()
		seen := len(auditOf(t, user, ""))
		tcr = f.answer(tcr)
		require.Equal(t, ichorv1alpha1.ReasonIssued, ready(t, tcr).Reason, ready(t, tcr).Message)
		marker := "audit-marker-" + tcr.Name
		_ = measured.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: marker}, &eventsv1.Event{})
		var events []harness.AuditEvent
		waitFor(t, "the marker is in the audit log", func() (bool, error) {
			events = auditOf(t, user, "")
			return slices.ContainsFunc(events, func(e harness.AuditEvent) bool { return strings.Contains(e.RequestURI, marker) }), nil
		})
		var out []string
		for _, e := range events[seen:] {
			if !strings.Contains(e.RequestURI, marker) {
				out = append(out, e.Verb+" "+strings.SplitN(e.RequestURI, "?", 2)[0])
			}
		}
		return out
	}
	onBindings := func(reqs []string) []string {
		var out []string
		for _, r := range reqs {
			if strings.Contains(r, "/clusterrolebindings") {
				out = append(out, r)
			}
		}
		return out
	}

	// The first answer also pays the client's discovery and the admission
	// key's read, once per process.
	warm, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	requests(warm)
	talos, _ := f.create(f.admin(), "demo", ichorv1alpha1.PurposeTalosconfigReader, "")
	got := requests(talos)
	t.Logf("talosconfig-reader: %d API requests: %v", len(got), got)
	assert.Empty(t, onBindings(got), "a Talos credential reads admin bindings")

	admin, _ := f.create(f.user("ichor:jo", "ichor-admin"), "demo", ichorv1alpha1.PurposeKubeconfigAdmin, "")
	got = requests(admin)
	t.Logf("kubeconfig-admin (new binding): %d API requests: %v", len(got), got)
	assert.Equal(t, []string{"create /apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "patch /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/" + adminBindingsOf(t, "ichor:jo")[0].Name},
		onBindings(got), "an admin kubeconfig creates its binding and records the expiry, and lists nothing")
}

// auditOf are the audit log's entries of user, whose URI contains part.
func auditOf(t *testing.T, user, part string) []harness.AuditEvent {
	t.Helper()
	events, err := env.AuditEvents(func(e harness.AuditEvent) bool {
		return e.User.Username == user && strings.Contains(e.RequestURI, part)
	})
	require.NoError(t, err)
	return events
}
