package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/kube"
)

// adminBinding is an admin binding as the manager makes it.
func adminBinding(name, username, identity, expires string, made time.Time) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name:              name,
			UID:               "uid-" + "x",
			CreationTimestamp: metav1.NewTime(made),
			Labels:            map[string]string{credentials.LabelAdminBinding: "true", credentials.LabelManagedBy: credentials.ManagedBy},
			Annotations: map[string]string{
				credentials.AnnotationAdminUsername:     username,
				credentials.AnnotationAdminIdentity:     identity,
				credentials.AnnotationCertificateExpiry: expires,
			},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}},
	}
}

func fakeAdmins(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(cliScheme(t)).WithObjects(objs...).Build()
}

func testStreams() (streams, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return newStreams(strings.NewReader(""), &out, &errOut), &out, &errOut
}

func TestAdminsListShowsWhoWhenAndExpiryEscaped(t *testing.T) {
	made := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	hostile := "ichor:eve\x1b]52;c;aGk=\x07\ttab"
	altered := adminBinding("ichor-admin:u:ichor:zed:0000000000", "ichor:zed", "ichor-admin:u:ichor:zed", "", made)
	altered.Subjects = append(altered.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:mallory"})
	unlabelled := adminBinding("someone-elses", "ichor:nobody", "x", "", made)
	unlabelled.Labels = nil
	c := fakeAdmins(t,
		adminBinding("ichor-admin:u:ichor:bob:bbbbbbbbbb", "ichor:bob", "ichor-admin:u:ichor:bob", "2027-11-30T09:00:00Z", made),
		adminBinding("ichor-admin:u:ichor:ada:aaaaaaaaaa", "ichor:ada", "ichor-admin:u:ichor:ada", "2026-12-01T10:00:00Z", made.Add(time.Hour)),
		adminBinding("ichor-admin:h:0123:cccccccccc", hostile, "ichor-admin:h:0123", "", made),
		altered, unlabelled,
	)
	s, out, _ := testStreams()
	table := newTablePrintFlags(true)
	require.NoError(t, table.complete())
	require.NoError(t, listAdmins(t.Context(), c, s.out, table))
	s.flush()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, out.String())
	assert.Regexp(t, `^USER\s+IDENTITY\s+BINDING\s+MADE\s+LATEST CERTIFICATE EXPIRES\s+ROLE$`, lines[0])
	assert.Regexp(t, `^ichor:ada\s+ichor-admin:u:ichor:ada\s+ichor-admin:u:ichor:ada:aaaaaaaaaa\s+2026-11-30T10:00:00Z\s+2026-12-01T10:00:00Z\s+cluster-admin$`, lines[1])
	assert.Regexp(t, `^ichor:bob\s+.*2027-11-30T09:00:00Z\s+cluster-admin$`, lines[2])
	// The escape and the tab of a hostile username are shown, not acted on,
	// and do not move the columns.
	assert.NotContains(t, out.String(), "\x1b")
	assert.NotContains(t, out.String(), "\x07")
	assert.Contains(t, lines[3], `ichor:eve^[]52;c;aGk=\u0007\ttab`)
	assert.Regexp(t, `\s-\s+cluster-admin$`, lines[3], "no expiry recorded reads -")
	assert.Regexp(t, `^ichor:zed\s.*cluster-admin \(altered: revoke it\)$`, lines[4])
	// Whom is read from the binding's name: an annotation rewritten to
	// another person is quoted beside it, a hashed identity's user is a
	// claim, and a name that is no admin binding's names nobody.
	assert.Contains(t, lines[3], "(claimed)")
	s, out, _ = testStreams()
	forged := adminBinding("ichor-admin:u:ichor:mallory:mmmmmmmmmm", "ichor:ada", "ichor-admin:u:ichor:ada", "", made)
	require.NoError(t, listAdmins(t.Context(), fakeAdmins(t, forged), s.out, table))
	s.flush()
	assert.Regexp(t, `(?m)^ichor:mallory \(annotated "ichor:ada"\)\s+ichor-admin:u:ichor:mallory\s+ichor-admin:u:ichor:mallory:mmmmmmmmmm\s`, out.String())
	// A script reads the fields plain: the user, and the annotation apart.
	s, out, _ = testStreams()
	fields := newTablePrintFlags(true)
	fields.format = `jsonpath={range .items[*]}{.user}|{.annotatedUser}|{.identity}{"\n"}{end}`
	require.NoError(t, fields.complete())
	require.NoError(t, listAdmins(t.Context(), fakeAdmins(t, forged), s.out, fields))
	s.flush()
	assert.Equal(t, "ichor:mallory|ichor:ada|ichor-admin:u:ichor:mallory\n", out.String())
	assert.NotContains(t, out.String(), "someone-elses", "a binding without Ichor's label is not an admin's")

	// -o jsonpath sees the same rows as -o json, the altered one not intact.
	s, out, _ = testStreams()
	path := newTablePrintFlags(true)
	path.format = `jsonpath={range .items[*]}{.user}={.intact}{"\n"}{end}`
	require.NoError(t, path.complete())
	require.NoError(t, listAdmins(t.Context(), c, s.out, path))
	s.flush()
	assert.Contains(t, out.String(), "ichor:ada=true\n")
	assert.Contains(t, out.String(), "ichor:zed=false\n")
	assert.NotContains(t, out.String(), "\x1b", "the streams escape what a template prints")
}

// A binding's name is anyone's who may create one with Ichor's label: in
// every human output, -o name included, it is escaped and kept to its line.
func TestAdminsListEscapesABindingsNameInEveryFormat(t *testing.T) {
	made := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	c := fakeAdmins(t, adminBinding("ichor-admin:u:x\n\x1b[2Jforged\tcell", "ichor:x", "ichor-admin:u:x", "", made))
	for _, tc := range []struct {
		format string
		want   string
	}{
		{outputTable, "ichor:x (claimed)   (not an admin binding's name)   ichor-admin:u:x\\n^[[2Jforged\\tcell   2026-11-30T09:00:00Z   "},
		{outputWide, "   true\n"},
		{"name", "adminbinding.cli.ichor.dev/ichor-admin:u:x\\n^[[2Jforged\\tcell\n"},
	} {
		t.Run(tc.format, func(t *testing.T) {
			s, out, _ := testStreams()
			p := newTablePrintFlags(true)
			p.format = tc.format
			require.NoError(t, p.complete())
			require.NoError(t, listAdmins(t.Context(), c, s.out, p))
			s.flush()
			assert.NotContains(t, out.String(), "\x1b")
			assert.Contains(t, out.String(), tc.want)
			lines := 1
			if tc.format != "name" {
				lines = 2 // the header and the row
			}
			assert.Equal(t, lines, strings.Count(out.String(), "\n"), out.String())
		})
	}
}

func TestAdminsListWithNobody(t *testing.T) {
	s, out, _ := testStreams()
	table := newTablePrintFlags(true)
	require.NoError(t, table.complete())
	require.NoError(t, listAdmins(t.Context(), fakeAdmins(t), s.out, table))
	s.flush()
	assert.Equal(t, "No admin bindings: nobody holds an admin kubeconfig that works.\n", out.String())
}

func TestAdminsRevokeDeletesOnlyThatPersonsBindingsAndNamesTheRevoker(t *testing.T) {
	made := time.Now()
	c := fakeAdmins(t,
		adminBinding("ichor-admin:u:ichor:ada:aaaaaaaaaa", "ichor:ada", "ichor-admin:u:ichor:ada", "", made),
		// A race made two; both go.
		adminBinding("ichor-admin:u:ichor:ada:zzzzzzzzzz", "ichor:ada", "ichor-admin:u:ichor:ada", "", made),
		adminBinding("ichor-admin:u:ichor:bob:bbbbbbbbbb", "ichor:bob", "ichor-admin:u:ichor:bob", "", made),
		// Not Ichor's, though it says ichor:ada.
		func() client.Object {
			b := adminBinding("hand-made", "ichor:ada", "x", "", made)
			b.Labels = nil
			return b
		}(),
	)
	s, out, errOut := testStreams()
	require.NoError(t, revokeAdmin(t.Context(), c, adaRevocation, s))
	s.flush()
	assert.Empty(t, errOut.String())
	assert.Equal(t, 2, strings.Count(out.String(), "Revoked ichor:ada: deleted ClusterRoleBinding ichor-admin:u:ichor:ada:"), out.String())
	assert.Contains(t, out.String(), "Revoked ichor:ada: deleted 2 admin binding(s).")

	for name, gone := range map[string]bool{
		"ichor-admin:u:ichor:ada:aaaaaaaaaa": true, "ichor-admin:u:ichor:ada:zzzzzzzzzz": true,
		"ichor-admin:u:ichor:bob:bbbbbbbbbb": false, "hand-made": false,
	} {
		err := c.Get(t.Context(), client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{})
		assert.Equal(t, gone, apierrors.IsNotFound(err), "%s: %v", name, err)
	}
	var events eventsv1.EventList
	require.NoError(t, c.List(t.Context(), &events, client.InNamespace(metav1.NamespaceDefault)))
	require.Len(t, events.Items, 2)
	for _, e := range events.Items {
		assert.Equal(t, credentials.ReasonAdminRevoked, e.Reason)
		assert.Equal(t, "ClusterRoleBinding", e.Regarding.Kind)
		assert.Equal(t, `Revoked the admin binding of "ichor:ada" (ichor-admin:u:ichor:ada) by "ichor:rita", with ichor cluster admins revoke`, e.Note)
		assert.Equal(t, "ichor:rita", e.ReportingInstance)
	}

	// Nobody left to revoke: an error naming them, escaped.
	err := revokeAdmin(t.Context(), c, adaRevocation, s)
	require.ErrorIs(t, err, errNoAdminBinding)
	assert.Contains(t, err.Error(), `no admin binding of user "ichor:ada"`)
	err = revokeAdmin(t.Context(), c, revocation{user: "ichor:\x1b[2Jx", identity: "ichor-admin:h:00", revoker: "ichor:rita"}, s)
	assert.Contains(t, err.Error(), `"ichor:\x1b[2Jx"`)
}

var adaRevocation = revocation{user: "ichor:ada", identity: "ichor-admin:u:ichor:ada", revoker: "ichor:rita", wait: time.Second, poll: time.Millisecond}

// The identity is the policy's, as the manager's rule derives it.
func TestAdminsRevokeFindsTheIdentityAsTheRuleDoes(t *testing.T) {
	s, _, _ := testStreams()
	for user, want := range map[string]string{
		"ichor:ada": "ichor-admin:u:ichor:ada",
		"../":       "ichor-admin:h:" + hex.EncodeToString(func() []byte { h := sha256.Sum256([]byte("../")); return h[:] }())[:36],
	} {
		got, err := adminIdentityOf(t.Context(), user, s)
		require.NoError(t, err)
		assert.Equal(t, want, got, user)
	}
	_, err := adminIdentityOf(t.Context(), "", s)
	require.Error(t, err)
}

// Review 2, F6: revoke used to pick bindings by the annotation
// ichor.dev/admin-username, which whoever may patch a binding writes. A
// planted label and annotation made the admin's own revoke delete an
// unrelated binding, and a binding of theirs whose annotation says otherwise
// survived. Now a binding is theirs by its name (their identity, a colon and
// a nonce) and its role.
func TestAdminsRevokeSelectsByNameAndRoleNotByAnnotation(t *testing.T) {
	made := time.Now()
	planted := adminBinding("system:discovery", "ichor:ada", "ichor-admin:u:ichor:ada", "", made)
	planted.RoleRef.Name = "system:discovery"
	planted.Subjects = []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:authenticated"}}
	decoy := adminBinding("ichor-admin:u:ichor:ada:dddddddddd", "ichor:ada", "ichor-admin:u:ichor:ada", "", made)
	decoy.RoleRef.Name = "view"
	c := fakeAdmins(t,
		planted, decoy,
		// Theirs, though its annotation names someone else.
		adminBinding("ichor-admin:u:ichor:ada:cccccccccc", "ichor:bob", "ichor-admin:u:ichor:bob", "", made),
		// Another person's, whose username goes on after ada's.
		adminBinding("ichor-admin:u:ichor:ada:x:eeeeeeeeee", "ichor:ada:x", "ichor-admin:u:ichor:ada:x", "", made),
	)
	s, out, errOut := testStreams()
	require.NoError(t, revokeAdmin(t.Context(), c, adaRevocation, s))
	s.flush()
	assert.Contains(t, out.String(), "Revoked ichor:ada: deleted 1 admin binding(s).")
	// What it does not reach is said where it is done (review 161).
	assert.Contains(t, out.String(), "An os:admin talosconfig they were issued (purpose credentials-talos; see the decision log) is not revoked by this")
	assert.Contains(t, errOut.String(), "Left ClusterRoleBinding ichor-admin:u:ichor:ada:dddddddddd alone")
	for name, gone := range map[string]bool{
		"system:discovery": false, "ichor-admin:u:ichor:ada:dddddddddd": false,
		"ichor-admin:u:ichor:ada:cccccccccc": true, "ichor-admin:u:ichor:ada:x:eeeeeeeeee": false,
	} {
		err := c.Get(t.Context(), client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{})
		assert.Equal(t, gone, apierrors.IsNotFound(err), "%s: %v", name, err)
	}
}

// Review 2, F6: a revoke that raced the person's first issuance found
// nothing, and the binding appeared a moment later. Now revoke waits for
// their kubeconfig-admin requests in flight and deletes what they made.
func TestAdminsRevokeWaitsForTheirRequestsInFlight(t *testing.T) {
	made := time.Now()
	pending := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "ada-admin"},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{ClusterName: "demo", Purpose: ichorv1alpha1.PurposeKubeconfigAdmin,
			Requester: ichorv1alpha1.Requester{Username: "ichor:ada"}},
	}
	other := pending.DeepCopy()
	other.Name, other.Spec.Requester.Username = "bob-admin", "ichor:bob"
	var c client.Client
	answered := false
	c = fake.NewClientBuilder().WithScheme(cliScheme(t)).
		WithObjects(adminBinding("ichor-admin:u:ichor:ada:aaaaaaaaaa", "ichor:ada", "ichor-admin:u:ichor:ada", "", made), pending, other).
		WithStatusSubresource(&ichorv1alpha1.TalosCredentialRequest{}).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, w client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			// The manager answers ada's request while revoke waits: it
			// makes her a new binding first, then answers.
			if key.Name == pending.Name && !answered {
				answered = true
				if err := w.Create(ctx, adminBinding("ichor-admin:u:ichor:ada:nnnnnnnnnn", "ichor:ada", "ichor-admin:u:ichor:ada", "", made)); err != nil {
					return err
				}
				var tcr ichorv1alpha1.TalosCredentialRequest
				if err := w.Get(ctx, key, &tcr); err != nil {
					return err
				}
				meta.SetStatusCondition(&tcr.Status.Conditions, metav1.Condition{Type: ichorv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ichorv1alpha1.ReasonIssued})
				if err := w.Status().Update(ctx, &tcr); err != nil {
					return err
				}
			}
			return w.Get(ctx, key, obj, opts...)
		}}).Build()
	s, out, errOut := testStreams()
	require.NoError(t, revokeAdmin(t.Context(), c, adaRevocation, s))
	s.flush()
	assert.Empty(t, errOut.String())
	assert.Contains(t, out.String(), "Waiting up to 1s for 1 kubeconfig-admin request(s) of ichor:ada in flight to be answered.")
	assert.Contains(t, out.String(), "Revoked ichor:ada: deleted 2 admin binding(s).")
	var list rbacv1.ClusterRoleBindingList
	require.NoError(t, c.List(t.Context(), &list))
	assert.Empty(t, list.Items, "a binding made by the request in flight survived the revoke")

	// A request that is never answered: revoke says so, and what it did.
	stuck := pending.DeepCopy()
	stuck.Name, stuck.ResourceVersion = "ada-stuck", ""
	require.NoError(t, c.Create(t.Context(), stuck))
	require.NoError(t, c.Create(t.Context(), adminBinding("ichor-admin:u:ichor:ada:ssssssssss", "ichor:ada", "ichor-admin:u:ichor:ada", "", made)))
	s, out, _ = testStreams()
	err := revokeAdmin(t.Context(), c, revocation{user: "ichor:ada", identity: "ichor-admin:u:ichor:ada", revoker: "ichor:rita", wait: 20 * time.Millisecond, poll: time.Millisecond}, s)
	s.flush()
	require.ErrorIs(t, err, errRevocationUnfinished, "an offboarding script does not read success")
	assert.ErrorContains(t, err, "deleted 1 admin binding(s) of ichor:ada, but their requests in flight were not all answered within 20ms")
	assert.NotContains(t, out.String(), "admin binding(s). If they still hold", "no closing line of a revocation done")
	require.NoError(t, c.List(t.Context(), &list))
	assert.Empty(t, list.Items, "what could be deleted is")
}

// Review 62, F3: a revoke that cannot look for the person's requests in
// flight (a revoker without list on taloscredentialrequests) deletes what
// it finds and fails, saying why, rather than read as a revocation done.
func TestAdminsRevokeThatCannotLookForRequestsInFlightFails(t *testing.T) {
	made := time.Now()
	c := fake.NewClientBuilder().WithScheme(cliScheme(t)).
		WithObjects(adminBinding("ichor-admin:u:ichor:ada:aaaaaaaaaa", "ichor:ada", "ichor-admin:u:ichor:ada", "", made)).
		WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, w client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*ichorv1alpha1.TalosCredentialRequestList); ok {
				return apierrors.NewForbidden(ichorv1alpha1.GroupVersion.WithResource("taloscredentialrequests").GroupResource(), "", errors.New("rita may not list them"))
			}
			return w.List(ctx, list, opts...)
		}}).Build()
	s, out, _ := testStreams()
	err := revokeAdmin(t.Context(), c, adaRevocation, s)
	s.flush()
	require.ErrorIs(t, err, errRevocationUnfinished)
	assert.ErrorContains(t, err, "deleted 1 admin binding(s) of ichor:ada, but could not look for their kubeconfig-admin requests in flight")
	assert.ErrorContains(t, err, "the revoker needs list on taloscredentialrequests")
	assert.ErrorContains(t, err, "run revoke again")
	assert.NotContains(t, out.String(), "admin binding(s). If they still hold", "no closing line of a revocation done")
	var list rbacv1.ClusterRoleBindingList
	require.NoError(t, c.List(t.Context(), &list))
	assert.Empty(t, list.Items, "the binding found is deleted all the same")
}

func cliScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	return scheme
}

func TestRevokerInstanceIsBounded(t *testing.T) {
	assert.Equal(t, "unknown", revokerInstance(""))
	assert.Len(t, revokerInstance(strings.Repeat("r", 300)), 128)
	// A character across the 128th byte is left out whole, and bytes that
	// are no character are not sent as U+FFFD's three (review 197A F4).
	for _, revoker := range []string{strings.Repeat("r", 127) + "é", strings.Repeat("\xff", 128)} {
		got := revokerInstance(revoker)
		assert.LessOrEqual(t, len(got), 128, "%q", got)
		assert.True(t, utf8.ValidString(got), "%q", got)
		b, err := json.Marshal(got)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(b), 128+2, "as sent: %s", b)
	}
}

// Review 176: revoke ends by asking the API server whether the person, as a
// user alone, may still ask for an admin kubeconfig (which would make them a
// new binding, and a working kubeconfig): for every TalosCluster (a
// ClusterRole's grant, which covers one made later too), then for each one
// as the issuer asks (its namespace and name: a grant may name clusters;
// review 179), and says where; whatever else happened, as when nothing was
// left to delete (the second run the message asks for) or the bindings could
// not be listed (review 180).
func TestAdminsRevokeSaysWhereThePersonStillHoldsTheGrant(t *testing.T) {
	grant := engine.CredentialAuthorization{Verb: "download", Group: "ichor.dev", Resource: "talosclusters", Subresource: "kubeconfig-admin"}
	forbidden := apierrors.NewForbidden(authorizationv1.Resource("subjectaccessreviews"), "", errors.New("RBAC"))
	for name, tc := range map[string]struct {
		allowed     map[string]bool // by namespace/name; "/" for every cluster
		reviewErr   error
		noBinding   bool
		noClusters  bool
		listFails   bool
		wantErr     []string
		wantOut     string
		wantReviews int
	}{
		"nowhere": {wantOut: "ichor:ada, as a user alone, does not hold download on talosclusters/kubeconfig-admin for every TalosCluster, nor for any of the 3 there are (a grant through their groups other than system:authenticated cannot be seen from here).", wantReviews: 4},
		"everywhere": {allowed: map[string]bool{"/": true},
			wantErr: []string{"warning: ichor:ada still holds download on talosclusters/kubeconfig-admin for every TalosCluster: their next request gets a new binding"}, wantReviews: 1},
		"everywhere, no cluster yet": {allowed: map[string]bool{"/": true}, noClusters: true,
			wantErr: []string{"still holds download on talosclusters/kubeconfig-admin for every TalosCluster"}, wantReviews: 1},
		"no cluster, no grant": {noClusters: true, wantOut: "nor for any of the 0 there are", wantReviews: 1},
		"one cluster by name": {allowed: map[string]bool{"demo/second": true},
			wantErr: []string{"still holds download on talosclusters/kubeconfig-admin for TalosCluster demo/second: their next request"}, wantReviews: 4},
		"reviews not allowed": {reviewErr: forbidden, wantErr: []string{"warning: could not ask whether ichor:ada still holds download on talosclusters/kubeconfig-admin"}},
		"nothing left to delete": {noBinding: true, allowed: map[string]bool{"demo/demo": true},
			wantErr: []string{"still holds download on talosclusters/kubeconfig-admin for TalosCluster demo/demo"}, wantReviews: 4},
		"bindings not listed": {listFails: true, allowed: map[string]bool{"demo/demo": true},
			wantErr: []string{"still holds download on talosclusters/kubeconfig-admin for TalosCluster demo/demo"}, wantReviews: 4},
	} {
		t.Run(name, func(t *testing.T) {
			reviews := 0
			var objs []client.Object
			if !tc.noClusters {
				objs = append(objs,
					&ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo"}},
					&ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "second"}},
					&ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "other"}})
			}
			if !tc.noBinding {
				objs = append(objs, adminBinding("ichor-admin:u:ichor:ada:aaaaaaaaaa", "ichor:ada", "ichor-admin:u:ichor:ada", "", time.Now()))
			}
			c := fake.NewClientBuilder().WithScheme(cliScheme(t)).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					sar, ok := obj.(*authorizationv1.SubjectAccessReview)
					if !ok {
						return c.Create(ctx, obj, opts...)
					}
					if tc.reviewErr != nil {
						return tc.reviewErr
					}
					reviews++
					ra := sar.Spec.ResourceAttributes
					require.Equal(t, "ichor:ada", sar.Spec.User)
					require.Equal(t, []string{"system:authenticated"}, sar.Spec.Groups)
					require.Equal(t, grant, engine.CredentialAuthorization{Verb: ra.Verb, Group: ra.Group, Resource: ra.Resource, Subresource: ra.Subresource})
					sar.Status.Allowed = tc.allowed[ra.Namespace+"/"+ra.Name]
					return nil
				},
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if _, ok := list.(*rbacv1.ClusterRoleBindingList); ok && tc.listFails {
						return apierrors.NewForbidden(rbacv1.Resource("clusterrolebindings"), "", errors.New("RBAC"))
					}
					return c.List(ctx, list, opts...)
				},
			}).Build()
			s, out, errOut := testStreams()
			r := adaRevocation
			r.grant = grant
			err := revokeAdmin(t.Context(), c, r, s)
			switch {
			case tc.noBinding:
				require.ErrorIs(t, err, errNoAdminBinding)
			case tc.listFails:
				require.Error(t, err)
			default:
				require.NoError(t, err)
			}
			s.flush()
			for _, want := range tc.wantErr {
				assert.Contains(t, errOut.String(), want)
			}
			if len(tc.wantErr) == 0 {
				assert.Empty(t, errOut.String())
			}
			if tc.wantOut != "" {
				assert.Contains(t, out.String(), tc.wantOut)
			}
			assert.Equal(t, tc.wantReviews, reviews)
		})
	}
}
