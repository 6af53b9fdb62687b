package chart

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
)

// asTheManager is a client of the installed chart's manager: its service
// account, impersonated.
func asTheManager(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	asManager := rest.CopyConfig(cfg)
	asManager.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + release,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	manager, err := client.New(asManager, client.Options{})
	require.NoError(t, err)
	return manager
}

// TestTheManagerWritesOnlyAdminBindings (hostile review 2, F3) installs the
// chart into a real API server and acts as the manager's service account,
// which RBAC lets create, patch and delete every ClusterRoleBinding and bind
// cluster-admin. The chart's ValidatingAdmissionPolicy lets it create only a
// person's admin binding exactly as Ichor makes it, change nothing but the
// annotations of one, and delete only admin bindings; anyone else's writes
// are not its business.
func TestTheManagerWritesOnlyAdminBindings(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	cfg, kc := installedChart(t)
	c, err := client.New(cfg, client.Options{})
	require.NoError(t, err)

	manager := asTheManager(t, cfg)
	ctx := t.Context()

	binding := func(name, role string, subjects ...string) *rbacv1.ClusterRoleBinding {
		b := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{credentials.LabelAdminBinding: "true", credentials.LabelManagedBy: credentials.ManagedBy}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		}
		for _, s := range subjects {
			b.Subjects = append(b.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: s})
		}
		return b
	}
	const ours = "ichor-admin:u:ichor:ada:0123456789"
	refused := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+release+"-admin-bindings'")
	}

	// The policy is in force once a write it forbids is refused by it; its
	// expressions must type-check.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var policy admissionregistrationv1.ValidatingAdmissionPolicy
		if err := c.Get(ctx, client.ObjectKey{Name: release + "-admin-bindings"}, &policy); err != nil {
			return false, err
		}
		if tc := policy.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
			return false, assert.AnError
		}
		err := manager.Create(ctx, binding("ichor-policy-probe", "cluster-admin", "ichor-policy-probe"), client.DryRunAll)
		return refused(err), nil
	}), "the policy is not enforced, or does not type-check")

	// Creating: only the shape Ichor makes.
	for what, b := range map[string]*rbacv1.ClusterRoleBinding{
		"cluster-admin for everyone":    binding("ichor-admin:u:ichor:ada:aaaaaaaaaa", "cluster-admin", "system:authenticated"),
		"a second subject":              binding("ichor-admin:u:ichor:ada:bbbbbbbbbb", "cluster-admin", "ichor-admin:u:ichor:ada:bbbbbbbbbb", "system:authenticated"),
		"a name not an admin binding's": binding("mallory", "cluster-admin", "mallory"),
		"another role":                  binding("ichor-admin:u:ichor:ada:cccccccccc", "admin", "ichor-admin:u:ichor:ada:cccccccccc"),
		"without the label": func() *rbacv1.ClusterRoleBinding {
			b := binding("ichor-admin:u:ichor:ada:dddddddddd", "cluster-admin", "ichor-admin:u:ichor:ada:dddddddddd")
			b.Labels = nil
			return b
		}(),
	} {
		err := manager.Create(ctx, b)
		assert.True(t, refused(err), "%s: %v", what, err)
	}
	require.NoError(t, manager.Create(ctx, binding(ours, "cluster-admin", ours)), "the binding Ichor makes")
	hashed := "ichor-admin:h:0123456789abcdef0123456789abcdef0123:aaaaaaaaaa"
	require.NoError(t, manager.Create(ctx, binding(hashed, "cluster-admin", hashed)), "a hashed identity's")

	// Changing: its annotations, not its subjects; and nothing of anyone
	// else's binding (the cluster's own cluster-admin binding included).
	var got rbacv1.ClusterRoleBinding
	require.NoError(t, manager.Get(ctx, client.ObjectKey{Name: ours}, &got))
	patch := client.MergeFrom(got.DeepCopy())
	got.Annotations = map[string]string{credentials.AnnotationCertificateExpiry: "2027-01-01T00:00:00Z"}
	require.NoError(t, manager.Patch(ctx, &got, patch), "recording the expiry")
	patch = client.MergeFrom(got.DeepCopy())
	got.Subjects = append(got.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:authenticated"})
	err = manager.Patch(ctx, &got, patch)
	assert.True(t, refused(err), "widening an admin binding: %v", err)
	var system rbacv1.ClusterRoleBinding
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: "cluster-admin"}, &system))
	patch = client.MergeFrom(system.DeepCopy())
	system.Subjects = append(system.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:authenticated"})
	err = manager.Patch(ctx, &system, patch)
	assert.True(t, refused(err), "widening the cluster's cluster-admin binding: %v", err)

	// Deleting: admin bindings only.
	for _, name := range []string{"system:discovery", "cluster-admin"} {
		err := manager.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}})
		assert.True(t, refused(err), "deleting %s: %v", name, err)
	}
	require.NoError(t, manager.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ours}}), "revoking an admin binding")

	// An altered admin binding (a subject added by someone who holds bind on
	// cluster-admin) may still be annotated and deleted by the manager, under
	// --admin-kubeconfigs=false.
	altered := binding("ichor-admin:u:ichor:bob:0123456789", "cluster-admin", "ichor-admin:u:ichor:bob:0123456789", "ichor:mallory")
	require.NoError(t, c.Create(ctx, altered))
	patch = client.MergeFrom(altered.DeepCopy())
	altered.Annotations = map[string]string{credentials.AnnotationRevokedBy: credentials.RevokedByOperator}
	require.NoError(t, manager.Patch(ctx, altered, patch), "naming the operator on an altered binding")
	require.NoError(t, manager.Delete(ctx, altered), "deleting an altered binding")

	// The policy is the manager's alone: an administrator still creates any
	// binding.
	other := binding("ichor-test-anyone", "view", "ichor-test:team")
	require.NoError(t, c.Create(ctx, other))
	require.NoError(t, c.Delete(ctx, other))

	// Admin kubeconfigs revoked: the manager makes no binding, so RBAC
	// takes create from it, and it still annotates and deletes the
	// bindings left (the hashed identity's).
	helm(t, nil, append([]string{"upgrade", release, chartDir(t), "--set", "adminCredentials.enabled=false"}, kc...)...)
	another := "ichor-admin:u:ichor:cy:0123456789"
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := manager.Create(ctx, binding(another, "cluster-admin", another), client.DryRunAll)
		return apierrors.IsForbidden(err) && !refused(err), nil
	}), "the manager may still create admin bindings with admin kubeconfigs revoked")
	var left rbacv1.ClusterRoleBinding
	require.NoError(t, manager.Get(ctx, client.ObjectKey{Name: hashed}, &left))
	patch = client.MergeFrom(left.DeepCopy())
	left.Annotations = map[string]string{credentials.AnnotationRevokedBy: credentials.RevokedByOperator}
	require.NoError(t, manager.Patch(ctx, &left, patch), "naming the operator, admin kubeconfigs revoked")
	require.NoError(t, manager.Delete(ctx, &left), "deleting a binding, admin kubeconfigs revoked")
}
