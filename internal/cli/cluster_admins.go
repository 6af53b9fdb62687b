package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/kube"
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
	User               string    `json:"user"`
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
	return &cobra.Command{
		Use:   "revoke USER",
		Short: "Delete one person's admin binding: their admin kubeconfigs stop working at once",
		Long: `Delete the admin binding of USER (the username as the API server knows it, as
'ichor cluster admins list' shows it). Every admin kubeconfig issued to them stops
working at their next request; everyone else's keeps working. A kubeconfig they
ask for later gets a new binding and a new group, so the revoked ones never come
back. To stop them asking again, take download on talosclusters/kubeconfig-admin
from them too.

The binding is deleted with your rights (delete on clusterrolebindings; no
power to grant anything), and an Event AdminRevoked on it, in namespace
default, names them and you (from a SelfSubjectReview), written with your rights
too (create on events.k8s.io events there). The manager records the deletion in
its decision log and as its own Event; the API server's audit log records your
DELETE and its user, the record of who revoked that no client writes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, _, err := kube.Client(k)
			if err != nil {
				return err
			}
			who, err := credential.WhoAmI(cmd.Context(), c)
			if err != nil {
				return err
			}
			return revokeAdmin(cmd.Context(), c, args[0], who.Username, s)
		},
	}
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
		r := adminRow{
			User: b.Annotations[credentials.AnnotationAdminUsername], Identity: b.Annotations[credentials.AnnotationAdminIdentity],
			Binding: b.Name, Made: b.CreationTimestamp.UTC(), CertificateExpires: b.Annotations[credentials.AnnotationCertificateExpiry],
			Role: b.RoleRef.Name, Intact: intactAdminBinding(&b),
		}
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
		addRow(t, r.User, r.Identity, r.Binding, r.Made.Format(time.RFC3339), r.CertificateExpires, role, strconv.FormatBool(r.Intact))
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

// intactAdminBinding is what the rule reuses: cluster-admin to the binding's
// own group alone. Shown, never decided on.
func intactAdminBinding(b *rbacv1.ClusterRoleBinding) bool {
	return b.RoleRef == rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"} &&
		slices.Equal(b.Subjects, []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.Name}})
}

// errNoAdminBinding is revoking someone who holds no binding.
var errNoAdminBinding = errors.New("no admin binding")

// revokeAdmin deletes every admin binding of user (a race may have made
// two), then writes an Event naming user and revoker on each.
func revokeAdmin(ctx context.Context, c client.Client, user, revoker string, s streams) error {
	items, err := adminBindings(ctx, c)
	if err != nil {
		return err
	}
	var theirs []rbacv1.ClusterRoleBinding
	for _, b := range items {
		if b.Annotations[credentials.AnnotationAdminUsername] == user {
			theirs = append(theirs, b)
		}
	}
	if len(theirs) == 0 {
		return fmt.Errorf("%w of user %q: see `ichor cluster admins list`", errNoAdminBinding, user)
	}
	for i := range theirs {
		b := &theirs[i]
		if err := credentials.RevokeBinding(ctx, c, b, ""); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "Revoked %s: deleted ClusterRoleBinding %s (identity %s). Their admin kubeconfigs no longer have cluster-admin.\n",
			cell(user), cell(b.Name), cell(b.Annotations[credentials.AnnotationAdminIdentity]))
		if err := c.Create(ctx, revocationEvent(b, user, revoker, time.Now())); err != nil {
			// The revocation is done; the API server's audit log and the
			// manager's decision log record it still.
			fmt.Fprintf(s.err, "warning: the Event naming you as the revoker could not be written: %v\n", err)
		}
	}
	return nil
}

// revocationEvent is the revoker's own record, on the deleted binding.
func revocationEvent(b *rbacv1.ClusterRoleBinding, user, revoker string, now time.Time) *eventsv1.Event {
	note := fmt.Sprintf("Revoked the admin binding of %q (%s) by %q, with ichor cluster admins revoke",
		user, b.Annotations[credentials.AnnotationAdminIdentity], revoker)
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
// API server's 128 characters.
func revokerInstance(revoker string) string {
	const limit = 128
	if len(revoker) > limit {
		return revoker[:limit]
	}
	if revoker == "" {
		return "unknown"
	}
	return revoker
}
