package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/accessreview"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// newAdminsCommand is `ichor cluster admins`: the admins' own
// ClusterRoleBindings (issue 23), listed and revoked one person at a time.
func newAdminsCommand(s streams, k genericclioptions.RESTClientGetter) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admins",
		Short: "List and revoke the people who hold an admin kubeconfig",
		Long: `Each person's admin kubeconfigs get their power from a ClusterRoleBinding of
their own (label ichor.dev/admin-binding), which Ichor makes when it first signs
one for them. These commands read and delete those bindings with your own
Kubernetes rights (list, and patch and delete, on clusterrolebindings).`,
	}
	cmd.AddCommand(newAdminsListCommand(s, k), newAdminsRevokeCommand(s, k))
	return cmd
}

func newAdminsListCommand(s streams, k genericclioptions.RESTClientGetter) *cobra.Command {
	output := newTablePrintFlags(true)
	cmd := &cobra.Command{
		Use:   "list [-o table|wide|json|yaml|name|jsonpath=TEMPLATE]",
		Short: "Show who holds an admin binding, when it was made and their latest certificate's expiry",
		Long: `Show who holds an admin binding, when it was made and their latest
certificate's expiry; -o wide adds whether the binding is intact.

-o json, yaml and jsonpath=TEMPLATE print a List (apiVersion v1) of
AdminBinding objects (cli.ichor.dev/v1alpha1), named by their
ClusterRoleBinding, with the fields user, identity, binding, made,
certificateExpires, role and intact; -o name prints
adminbinding.cli.ichor.dev/BINDING, one a line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := output.complete(); err != nil {
				return err
			}
			c, _, _, err := kube.Client(k)
			if err != nil {
				return err
			}
			return listAdmins(cmd.Context(), c, s.out, output)
		},
	}
	output.register(cmd)
	return cmd
}

// adminRow is one admin binding as list shows it, and as -o json writes it.
type adminRow struct {
	// User is whom the binding grants: the identity's own user for a plain
	// identity, else the username annotation's claim (UserClaimed).
	User string `json:"user"`
	// UserClaimed: User is only what the annotation says (a hashed
	// identity names nobody, or the name is no admin binding's).
	UserClaimed bool `json:"userClaimed,omitempty"`
	// Annotated is the username annotation where it says otherwise than
	// the binding's name.
	Annotated string `json:"annotatedUser,omitempty"`
	// Identity is read from the binding's name; empty when the name is
	// no admin binding's.
	Identity           string    `json:"identity"`
	Binding            string    `json:"binding"`
	Made               time.Time `json:"made"`
	CertificateExpires string    `json:"certificateExpires,omitempty"`
	Role               string    `json:"role"`
	// Intact is false for a binding someone changed, which the rule will
	// not reuse (AdminBindingAltered): revoke it.
	Intact bool `json:"intact"`
}

func newAdminsRevokeCommand(s streams, k genericclioptions.RESTClientGetter) *cobra.Command {
	inFlight := 30 * time.Second
	cmd := &cobra.Command{
		Use:   "revoke USER",
		Short: "Delete one person's admin binding: their admin kubeconfigs stop working at once",
		Long: `Delete the admin bindings of USER (the username as the API server knows it, as
'ichor cluster admins list' shows it). Every admin kubeconfig issued to them stops
working at their next request; everyone else's keeps working. A kubeconfig they
ask for later gets a new binding and a new group, so the revoked ones never come
back. To stop them asking again, take download on talosclusters/kubeconfig-admin
from them first: the command ends, whatever else it says, by asking the API
server whether USER (with system:authenticated, which every request carries)
still holds it for every TalosCluster, and else for each one (as the issuer
asks: the cluster's namespace and name), and warns where they do; a grant
through their other groups cannot be seen from here.

Their bindings are found as the manager makes them, never by an annotation
anyone who may patch a binding could write: labelled ichor.dev/admin-binding=true,
named after their identity (computed from USER by the policy built into this
command, as the manager's rule does: ichor-admin:u:USER, or ichor-admin:h: and a
hash), a colon and a nonce, and bound to cluster-admin. A binding of their name
to another role is not Ichor's and is left alone (and named). The command says
how many it deleted.

A request of theirs the manager is answering while you revoke may make a new
binding a moment later. So, after deleting, the command looks for their
kubeconfig-admin requests not answered yet (in every namespace), waits up to
--wait for the manager to answer them, and deletes any binding that appeared.
If it cannot list those requests (it needs list on taloscredentialrequests) or
they are not answered in time, it says how many bindings it deleted and exits
non-zero: run it again. A request they make after that is judged on their
grant: without download on talosclusters/kubeconfig-admin it is refused.

After each DELETE the command reads the binding again: one a finalizer keeps
(anyone who may patch bindings can add one, without the power to bind) still
grants cluster-admin, so the command names its finalizers, says it is NOT
revoked and exits non-zero; remove them and run revoke again.

The binding is deleted with your rights (delete on clusterrolebindings; no
power to grant anything), and an Event AdminRevoked on it, in namespace
default, names them and you (from a SelfSubjectReview), written with your rights
too (create on events.k8s.io events there). The manager records the deletion in
its decision log and as its own Event; the API server's audit log records your
DELETE and its user, the record of who revoked that no client writes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reqs, err := adminRequirementsOf(cmd.Context(), args[0], s)
			if err != nil {
				return err
			}
			c, _, _, err := kube.Client(k)
			if err != nil {
				return err
			}
			who, err := credential.WhoAmI(cmd.Context(), c)
			if err != nil {
				return err
			}
			return revokeAdmin(cmd.Context(), c, revocation{user: args[0], identity: reqs.AdminBinding.Identity, grant: reqs.Authorization, revoker: who.Username, wait: inFlight}, s)
		},
	}
	cmd.Flags().DurationVar(&inFlight, "wait", inFlight, "how long to wait for the person's kubeconfig-admin requests in flight to be answered before looking for bindings they made")
	return cmd
}

// adminIdentityOf is the person's admin identity as the policy derives it.
func adminIdentityOf(ctx context.Context, user string, s streams) (string, error) {
	reqs, err := adminRequirementsOf(ctx, user, s)
	if err != nil {
		return "", err
	}
	return reqs.AdminBinding.Identity, nil
}

// adminRequirementsOf is the requirements of kubeconfig-admin for that
// username, asked of the policy built into the CLI (the manager's rule,
// unless its operator changed person_identity in a bundle of their own): the
// person's admin identity, and the grant an admin kubeconfig is asked with.
func adminRequirementsOf(ctx context.Context, user string, s streams) (engine.CredentialRequirements, error) {
	eng, err := engine.New(ctx, engine.Options{DecisionLog: io.Discard, Log: s.err, ID: "ichor-cli"})
	if err != nil {
		return engine.CredentialRequirements{}, err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	reqs, err := eng.RequirementsFor(ctx, string(ichorv1alpha1.PurposeKubeconfigAdmin), user)
	if err != nil {
		return engine.CredentialRequirements{}, fmt.Errorf("the policy's admin identity of %q: %w", user, err)
	}
	if reqs.AdminBinding == nil {
		return engine.CredentialRequirements{}, fmt.Errorf("the policy gives user %q no admin identity", user)
	}
	return reqs, nil
}

// adminBindings are the admins' bindings, by username, then name.
func adminBindings(ctx context.Context, c client.Reader) ([]rbacv1.ClusterRoleBinding, error) {
	var list rbacv1.ClusterRoleBindingList
	if err := c.List(ctx, &list, credentials.AdminBindingLabels); err != nil {
		return nil, fmt.Errorf("list the admins' ClusterRoleBindings: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b rbacv1.ClusterRoleBinding) int {
		if a.Annotations[credentials.AnnotationAdminUsername] != b.Annotations[credentials.AnnotationAdminUsername] {
			if a.Annotations[credentials.AnnotationAdminUsername] < b.Annotations[credentials.AnnotationAdminUsername] {
				return -1
			}
			return 1
		}
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return list.Items, nil
}

// listAdmins prints the admins' bindings as -o asks. Every cell is
// escaped: usernames are what an authenticator said, and annotations what
// anyone who may patch a binding wrote.
func listAdmins(ctx context.Context, c client.Reader, out io.Writer, output *printFlags) error {
	items, err := adminBindings(ctx, c)
	if err != nil {
		return err
	}
	docs := make([]unstructured.Unstructured, 0, len(items))
	t := newTable([]string{"User", "Identity", "Binding", "Made", "Latest Certificate Expires", "Role"}, "Intact")
	for _, b := range items {
		r := adminOf(&b)
		r.Binding, r.Made, r.CertificateExpires = b.Name, b.CreationTimestamp.UTC(), b.Annotations[credentials.AnnotationCertificateExpiry]
		r.Role, r.Intact = b.RoleRef.Name, intactAdminBinding(&b)
		d, err := document("AdminBinding", "", r.Binding, r)
		if err != nil {
			return err
		}
		docs = append(docs, *d)
		role := r.Role
		if !r.Intact {
			// The rule refuses to reuse it (AdminBindingAltered); say so here.
			role += " (altered: revoke it)"
		}
		user, identity := r.User, r.Identity
		switch {
		case r.Annotated != "":
			user = fmt.Sprintf("%s (annotated %q)", r.User, r.Annotated)
		case r.UserClaimed:
			user = r.User + " (claimed)"
		}
		if identity == "" {
			identity = "(not an admin binding's name)"
		}
		addRow(t, user, identity, r.Binding, r.Made.Format(time.RFC3339), r.CertificateExpires, role, strconv.FormatBool(r.Intact))
	}
	switch {
	case !output.isHuman():
		return output.print(out, documentList(docs))
	case len(docs) == 0:
		fmt.Fprintln(out, "No admin bindings: nobody holds an admin kubeconfig that works.")
		return nil
	}
	return output.printTable(out, t)
}

// adminOf is whom a binding grants cluster-admin, as the list shows it:
// the identity read from its name, which only a holder of bind on
// cluster-admin can choose (credentials.AdminBindingIdentity), not from its
// annotations, which anyone who may patch a binding can rewrite (the hostile
// review of 2026-12-05: a binding annotated as another person's was listed
// as theirs, and the operator would revoke the wrong one). The user is the
// identity's own for a plain one (ichor-admin:u:USER), the username
// annotation quoted beside it when it says otherwise; a hashed identity
// names nobody, so its user is the annotation's claim, said as such.
func adminOf(b *rbacv1.ClusterRoleBinding) adminRow {
	claimed := b.Annotations[credentials.AnnotationAdminUsername]
	identity, ok := credentials.AdminBindingIdentity(b)
	if !ok {
		return adminRow{User: claimed, UserClaimed: true}
	}
	named, plain := strings.CutPrefix(identity, "ichor-admin:u:")
	switch {
	case !plain:
		return adminRow{User: claimed, UserClaimed: true, Identity: identity}
	case claimed != "" && claimed != named:
		return adminRow{User: named, Annotated: claimed, Identity: identity}
	}
	return adminRow{User: named, Identity: identity}
}

// intactAdminBinding is what the rule reuses: cluster-admin to the binding's
// own group alone. Shown, never decided on.
func intactAdminBinding(b *rbacv1.ClusterRoleBinding) bool {
	return b.RoleRef == rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"} &&
		slices.Equal(b.Subjects, []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.Name}})
}

// errNoAdminBinding is revoking someone who holds no binding.
var errNoAdminBinding = errors.New("no admin binding")

// revocation is one `ichor cluster admins revoke`: whom (their username and
// the identity the policy gives it), by whom, and how long to wait for their
// requests in flight.
type revocation struct {
	user, identity, revoker string
	// grant is what a person is asked to hold for an admin kubeconfig;
	// zero: not looked at after the revocation.
	grant engine.CredentialAuthorization
	wait  time.Duration
	// poll is how often the requests in flight are looked at again; a
	// second if zero.
	poll time.Duration
}

// nonceForm is the end of an admin binding's name after the identity.
var nonceForm = regexp.MustCompile(`^[a-z0-9]{10}$`)

// theirs reports whether b is one of the person's bindings as the manager
// makes them: labelled (the list selects it), named identity:nonce, bound
// to cluster-admin (credentials.Revocable). An altered one (a subject added)
// still binds cluster-admin and is theirs to revoke.
func (r revocation) theirs(b *rbacv1.ClusterRoleBinding) bool {
	nonce, ok := strings.CutPrefix(b.Name, r.identity+":")
	return ok && nonceForm.MatchString(nonce)
}

// revokeAdmin deletes every admin binding of the person (a race may have
// made two), writes an Event naming them and the revoker on each, then waits
// for their kubeconfig-admin requests in flight and deletes what those made.
func revokeAdmin(ctx context.Context, c client.Client, r revocation, s streams) error {
	// Listed before the bindings: a request answered after this list made
	// its binding before its answer, so the second pass sees it.
	// Whatever the outcome (a binding that could not be listed or deleted,
	// one held, requests in flight, or nothing of theirs left to delete, as
	// at a second run), say whether they may still ask (reviews 179, 180:
	// said only after a full success).
	defer r.warnIfStillGranted(ctx, c, s)
	inFlight, listErr := pendingAdminRequests(ctx, c, r.user)
	deleted, held, err := r.deleteBindings(ctx, c, s)
	if err != nil {
		return err
	}
	// unfinished is why a binding made after this command may survive it:
	// the command then fails, whatever it deleted, so that a script that
	// offboards someone does not read success.
	var unfinished error
	switch {
	case apierrors.IsForbidden(listErr):
		unfinished = fmt.Errorf("could not look for their kubeconfig-admin requests in flight (%w): the revoker needs list on taloscredentialrequests", listErr)
	case listErr != nil:
		unfinished = fmt.Errorf("could not look for their kubeconfig-admin requests in flight: %w", listErr)
	case len(inFlight) > 0:
		fmt.Fprintf(s.out, "Waiting up to %s for %d kubeconfig-admin request(s) of %s in flight to be answered.\n", r.wait, len(inFlight), cell(r.user))
		unfinished = untilAnswered(ctx, c, inFlight, r.wait, r.poll)
		more, moreHeld, err := r.deleteBindings(ctx, c, s)
		if err != nil {
			return err
		}
		deleted += more
		held = append(held, moreHeld...)
	}
	if len(held) > 0 {
		slices.Sort(held)
		held = slices.Compact(held)
		return fmt.Errorf("%w: %d of %s's admin binding(s) still exist and still grant cluster-admin (%s); remove their finalizers and run revoke again",
			errBindingHeld, len(held), cell(r.user), strings.Join(held, ", "))
	}
	if unfinished != nil {
		return fmt.Errorf("%w: deleted %d admin binding(s) of %s, but %w; one the manager answers after this may make a binding: run revoke again",
			errRevocationUnfinished, deleted, cell(r.user), unfinished)
	}
	if deleted == 0 {
		return fmt.Errorf("%w of user %q (identity %s): see `ichor cluster admins list`", errNoAdminBinding, r.user, r.identity)
	}
	fmt.Fprintf(s.out, "Revoked %s: deleted %d admin binding(s). If they still hold download on talosclusters/kubeconfig-admin, their next request gets a new one: take it from them, then run revoke again. "+
		"An os:admin talosconfig they were issued (purpose credentials-talos; see the decision log) is not revoked by this: Talos cannot revoke a certificate; if they got one, or you cannot tell, rotate that cluster's OS CA. "+
		"Nor is a grant to their identity made by other means (a binding of any role to their certificate's user or group, which only someone who may bind that role can make): look for one with kubectl get clusterrolebindings,rolebindings -A -o wide | grep %s.\n",
		cell(r.user), deleted, cell(r.identity))
	return nil
}

// maxGrantClusters bounds the TalosClusters whose grant revoke asks about:
// one SubjectAccessReview each.
const maxGrantClusters = 100

// warnIfStillGranted says, on s.err, where the person may still ask for an
// admin kubeconfig, which would make them a new binding (review 176: the
// runbook had the grant taken away after the revocation, and a request made
// between the two was issued). The API server is asked about the user with
// system:authenticated alone: their other groups are known only when they
// authenticate, so a grant through one is not seen, and the message says so.
func (r revocation) warnIfStillGranted(ctx context.Context, c client.Client, s streams) {
	if r.grant == (engine.CredentialAuthorization{}) {
		return
	}
	what := fmt.Sprintf("%s on %s/%s", r.grant.Verb, r.grant.Resource, r.grant.Subresource)
	granted, asked, err := r.grantedOn(ctx, c)
	if len(granted) > 0 {
		fmt.Fprintf(s.err, "warning: %s still holds %s for %s: their next request gets a new binding and a working admin kubeconfig. Take it from them, then run revoke again.\n",
			cell(r.user), what, strings.Join(granted, ", "))
	}
	switch {
	case err != nil:
		fmt.Fprintf(s.err, "warning: could not ask whether %s still holds %s (%s): if they do, their next request gets a new binding.\n", cell(r.user), what, termsafe.ErrorText(err))
	case len(granted) == 0:
		fmt.Fprintf(s.out, "%s, as a user alone, does not hold %s for every TalosCluster, nor for any of the %d there are (a grant through their groups other than system:authenticated cannot be seen from here).\n", cell(r.user), what, asked)
	}
}

// grantedOn is where the user alone (and system:authenticated, which every
// request of theirs carries) may still ask for an admin kubeconfig: for every
// TalosCluster (a ClusterRole's grant, which also covers one made later), or
// for each TalosCluster asked as the issuer asks (its namespace and name: a
// grant may name clusters, resourceNames; review 179), at most
// maxGrantClusters of them; with how many it asked about, and why it could
// not ask about the rest.
func (r revocation) grantedOn(ctx context.Context, c client.Client) ([]string, int, error) {
	ask := func(namespace, name string) (bool, error) {
		sar, err := accessreview.Ask(ctx, c, accessreview.User{Name: r.user, Groups: []string{"system:authenticated"}}, authorizationv1.ResourceAttributes{
			Namespace: namespace, Name: name,
			Verb: r.grant.Verb, Group: r.grant.Group, Resource: r.grant.Resource, Subresource: r.grant.Subresource,
		})
		if err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	}
	switch everywhere, err := ask("", ""); {
	case err != nil:
		return nil, 0, err
	case everywhere:
		return []string{"every TalosCluster"}, 0, nil
	}
	var clusters metav1.PartialObjectMetadataList
	clusters.SetGroupVersionKind(ichorv1alpha1.GroupVersion.WithKind("TalosClusterList"))
	if err := c.List(ctx, &clusters); err != nil {
		return nil, 0, fmt.Errorf("list TalosClusters: %w", err)
	}
	var granted []string
	for i, tc := range clusters.Items {
		if i == maxGrantClusters {
			return granted, i, fmt.Errorf("asked about the first %d of %d TalosClusters only", maxGrantClusters, len(clusters.Items))
		}
		allowed, err := ask(tc.Namespace, tc.Name)
		if err != nil {
			return granted, i, err
		}
		if allowed {
			granted = append(granted, "TalosCluster "+cell(tc.Namespace+"/"+tc.Name))
		}
	}
	return granted, len(clusters.Items), nil
}

// errRevocationUnfinished is a revocation whose wait for the person's
// requests in flight could not be made or did not end: a binding one of
// them makes later is not revoked.
var errRevocationUnfinished = errors.New("revocation unfinished")

// errBindingHeld is a binding deleted that still exists: a finalizer keeps
// it, and until it goes it grants cluster-admin as before.
var errBindingHeld = errors.New("admin binding deleted but still there")

// deleteBindings deletes the person's bindings that exist now, and returns
// how many are gone, and the names of those a finalizer keeps.
func (r revocation) deleteBindings(ctx context.Context, c client.Client, s streams) (int, []string, error) {
	items, err := adminBindings(ctx, c)
	if err != nil {
		return 0, nil, err
	}
	deleted := 0
	var held []string
	for i := range items {
		b := &items[i]
		if !r.theirs(b) {
			continue
		}
		if !credentials.Revocable(b) {
			fmt.Fprintf(s.err, "Left ClusterRoleBinding %s alone: it is named after %s but binds %s %s, not cluster-admin, so it is not Ichor's.\n",
				cell(b.Name), cell(r.user), cell(b.RoleRef.Kind), cell(b.RoleRef.Name))
			continue
		}
		if err := credentials.RevokeBinding(ctx, c, b, ""); err != nil {
			return deleted, held, err
		}
		// A DELETE is answered before a finalizer lets the object go:
		// anyone who may patch the binding (no bind needed) can hold it,
		// granting cluster-admin, with its deletion only requested.
		gone, err := bindingGone(ctx, c, b, r.user, s)
		if err != nil {
			return deleted, held, err
		}
		if !gone {
			held = append(held, cell(b.Name))
			continue
		}
		deleted++
		fmt.Fprintf(s.out, "Revoked %s: deleted ClusterRoleBinding %s (identity %s). Their admin kubeconfigs no longer have cluster-admin from it.\n",
			cell(r.user), cell(b.Name), cell(r.identity))
		if err := c.Create(ctx, revocationEvent(b, r.user, r.identity, r.revoker, time.Now())); err != nil {
			// The revocation is done; the API server's audit log and the
			// manager's decision log record it still.
			fmt.Fprintf(s.err, "warning: the Event naming you as the revoker could not be written: %s\n", termsafe.ErrorText(err))
		}
	}
	return deleted, held, nil
}

// bindingGone reports whether the binding deleted is gone; when a finalizer
// keeps it, it says so on s.err. It lists, as revoke does, rather than gets:
// a revoker needs list and delete only.
func bindingGone(ctx context.Context, c client.Reader, b *rbacv1.ClusterRoleBinding, user string, s streams) (bool, error) {
	items, err := adminBindings(ctx, c)
	if err != nil {
		return false, fmt.Errorf("check that ClusterRoleBinding %s is gone: %w", cell(b.Name), err)
	}
	i := slices.IndexFunc(items, func(o rbacv1.ClusterRoleBinding) bool { return o.Name == b.Name && o.UID == b.UID })
	if i < 0 {
		// Gone; another of that name is the second pass's to find.
		return true, nil
	}
	now := items[i]
	finalizers := make([]string, 0, len(now.Finalizers))
	for _, f := range now.Finalizers {
		finalizers = append(finalizers, cell(f))
	}
	fmt.Fprintf(s.err, "NOT revoked: ClusterRoleBinding %s is marked for deletion but still exists, held by the finalizer(s) %s, and still grants %s cluster-admin. "+
		"Someone who may patch it added them. Remove them (kubectl patch clusterrolebinding %s --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]', which needs patch on clusterrolebindings) and run revoke again.\n",
		cell(b.Name), strings.Join(finalizers, ", "), cell(user), cell(b.Name))
	return false, nil
}

// pendingAdminRequests are the person's kubeconfig-admin requests the
// manager has not answered yet, in every namespace.
func pendingAdminRequests(ctx context.Context, c client.Reader, user string) ([]client.ObjectKey, error) {
	var list ichorv1alpha1.TalosCredentialRequestList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list TalosCredentialRequests: %w", err)
	}
	var out []client.ObjectKey
	for i := range list.Items {
		tcr := &list.Items[i]
		if tcr.Spec.Purpose == ichorv1alpha1.PurposeKubeconfigAdmin && tcr.Spec.Requester.Username == user &&
			meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady) == nil {
			out = append(out, client.ObjectKeyFromObject(tcr))
		}
	}
	return out, nil
}

// untilAnswered waits until each request is answered or gone.
func untilAnswered(ctx context.Context, c client.Reader, keys []client.ObjectKey, timeout, poll time.Duration) error {
	if poll <= 0 {
		poll = time.Second
	}
	err := wait.PollUntilContextTimeout(ctx, poll, timeout, false, func(ctx context.Context) (bool, error) {
		for _, key := range keys {
			var tcr ichorv1alpha1.TalosCredentialRequest
			err := c.Get(ctx, key, &tcr)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return false, err
			}
			if meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady) == nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("their requests in flight were not all answered within %s: %w", timeout, err)
	}
	return nil
}

// revocationEvent is the revoker's own record, on the deleted binding.
func revocationEvent(b *rbacv1.ClusterRoleBinding, user, identity, revoker string, now time.Time) *eventsv1.Event {
	note := fmt.Sprintf("Revoked the admin binding of %q (%s) by %q, with ichor cluster admins revoke",
		user, identity, revoker)
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "ichor-admin-revoked-"},
		EventTime:  metav1.NewMicroTime(now),
		Regarding: corev1.ObjectReference{
			APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding", Name: b.Name, UID: b.UID,
		},
		ReportingController: "ichor.dev/cli",
		ReportingInstance:   revokerInstance(revoker),
		Action:              "Revoke",
		Reason:              credentials.ReasonAdminRevoked,
		Type:                corev1.EventTypeNormal,
		Note:                engine.Clip(note, "", engine.MaxEventNote),
	}
}

// revokerInstance is the Event's reportingInstance: the revoker, within the
// API server's 128 bytes, cut where a character begins (a character cut in
// two is sent as U+FFFD, three bytes, and the API server refuses the Event:
// review 197A F4).
func revokerInstance(revoker string) string {
	const limit = 128
	revoker = strings.ToValidUTF8(revoker, "?")
	if len(revoker) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(revoker[cut]) {
			cut--
		}
		return revoker[:cut]
	}
	if revoker == "" {
		return "unknown"
	}
	return revoker
}
