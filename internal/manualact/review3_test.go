package manualact_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
)

// hostileActsAreRecordedAsTheyHappened: the attacks of hostile review 3 on
// the recorder, each against the real API server and the manager's webhook
// and watches (run by TestAPersonsActsAreRecordedWithWhoActed while the
// webhook is called: one manager per test binary).
func hostileActsAreRecordedAsTheyHappened(t *testing.T, re *recEnv) {
	ctx := t.Context()

	t.Run("a verdict behind sixteen conditions of a person's own is recorded (F1)", func(t *testing.T) {
		csr := re.env.GetCSR(t, re.csr(t, "csr-padded").Name)
		for i := range 16 {
			csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.RequestConditionType(fmt.Sprintf("Note%d", i)), Status: corev1.ConditionTrue, Reason: "pad", Message: "pad",
			})
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand", Message: "approved by ada, behind the padding",
		})
		_, err := re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.Len(t, re.env.GetCSR(t, csr.Name).Status.Conditions, 17)
		r := re.waitRecord(t, "csr/"+csr.Name, "ada")
		assert.Equal(t, engine.ActionApprove, r.Result.Action)
		assert.Equal(t, "admission", r.Result.ActorSource)
		assert.Contains(t, r.Result.Reasons[0].Message, "behind the padding")
		assert.Equal(t, "ManualApproval", re.event(t, csr.UID).Reason)
	})

	// Mallory may create and delete bindings, and patch them, but may not
	// bind cluster-admin.
	re.grant(t, "mallory", rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterrolebindings"}, Verbs: []string{"get", "list", "create", "delete", "patch"}})
	require.NoError(t, re.env.WaitAllowed(ctx, "mallory", nil, authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "clusterrolebindings", Verb: "patch"}))
	mcfg, err := re.env.UserConfig("mallory")
	require.NoError(t, err)
	mallory, err := kubernetes.NewForConfig(mcfg)
	require.NoError(t, err)

	t.Run("a labelled binding to a harmless role, deleted, revokes nobody (F3)", func(t *testing.T) {
		name := "ichor-admin:u:alice:aaaaaaaaaa"
		b := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Labels: map[string]string{credentials.LabelAdminBinding: "true"},
				Annotations: map[string]string{credentials.AnnotationAdminUsername: "alice", credentials.AnnotationAdminIdentity: "ichor-admin:u:alice"},
			},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:public-info-viewer"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}},
		}
		made, err := mallory.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NoError(t, mallory.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}))
		// The webhook is called within the DELETE: a record it wrote
		// exists now.
		assert.Empty(t, re.records("clusterrolebinding/"+name))
		var ev corev1.Event
		assert.Error(t, re.env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "ichor-act-" + string(made.UID)}, &ev))
	})

	t.Run("whom is the identity in the binding's name, not its annotation (F3)", func(t *testing.T) {
		bea := re.adminBinding(t, "bea")
		// Only a holder of bind on cluster-admin can change it; the test's
		// admin writes the wrong username on it.
		var cur rbacv1.ClusterRoleBinding
		require.NoError(t, re.env.Client.Get(ctx, types.NamespacedName{Name: bea.Name}, &cur))
		cur.Annotations[credentials.AnnotationAdminUsername] = "alice"
		require.NoError(t, re.env.Client.Update(ctx, &cur))
		re.ichor(t, 0, "cluster", "admins", "revoke", "bea", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+bea.Name, "ada")
		assert.Equal(t, "bea", r.Result.Whom)
		assert.Contains(t, r.Result.Reasons[0].Message, `of "bea" (identity "ichor-admin:u:bea") (its ichor.dev/admin-username annotation, a claim on the object, says "alice")`)
	})

	t.Run("a revocation a finalizer holds is not reported done (F4)", func(t *testing.T) {
		b := re.adminBinding(t, "alice2")
		_, err := mallory.RbacV1().ClusterRoleBindings().Patch(ctx, b.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":["review3.example/hold"]}}`), metav1.PatchOptions{})
		require.NoError(t, err, "mallory (patch, no bind) adds a finalizer to alice2's cluster-admin binding")
		t.Cleanup(func() {
			_, _ = mallory.RbacV1().ClusterRoleBindings().Patch(t.Context(), b.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
		})
		out := re.ichor(t, 1, "cluster", "admins", "revoke", "alice2", "--kubeconfig", re.ada)
		assert.NotContains(t, out, "no longer have cluster-admin")
		assert.Contains(t, out, "NOT revoked: ClusterRoleBinding "+b.Name+" is marked for deletion but still exists, held by the finalizer(s) review3.example/hold")
		assert.Contains(t, out, "still grant cluster-admin")
		var got rbacv1.ClusterRoleBinding
		require.NoError(t, re.env.Client.Get(ctx, types.NamespacedName{Name: b.Name}, &got))
		require.NotNil(t, got.DeletionTimestamp, "the binding is still there, its deletion requested")

		// Nor does the decision log say it was revoked while it is held
		// (review of 2026-12-05): the webhook's record said "their admin
		// kubeconfigs no longer have cluster-admin", and its mark kept the
		// watch from recording the removal when it came.
		assert.Empty(t, re.records("clusterrolebinding/"+b.Name), "a held binding recorded as revoked")

		// Once the finalizer goes, the watch records the removal, naming
		// Ada, whose DELETE the webhook kept as an attempt (since
		// 2026-12-06: before, a held deletion was recorded with its revoker
		// unknown).
		_, err = mallory.RbacV1().ClusterRoleBindings().Patch(ctx, b.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
		require.NoError(t, err)
		r := re.waitRecord(t, "clusterrolebinding/"+b.Name, "ada")
		assert.Equal(t, "admission", r.Result.ActorSource)
	})

	t.Run("a revocation that foreground propagation holds is not reported done", func(t *testing.T) {
		// The webhook sees the binding without a finalizer; the API server
		// adds foregroundDeletion after it, and the binding stays until the
		// garbage collector takes it off (none runs here).
		b := re.adminBinding(t, "alice3")
		foreground := metav1.DeletePropagationForeground
		require.NoError(t, re.adaAPI.RbacV1().ClusterRoleBindings().Delete(ctx, b.Name, metav1.DeleteOptions{PropagationPolicy: &foreground}))
		got, err := re.env.Clientset.RbacV1().ClusterRoleBindings().Get(ctx, b.Name, metav1.GetOptions{})
		require.NoError(t, err, "the binding is still there")
		require.Contains(t, got.Finalizers, metav1.FinalizerDeleteDependents)
		assert.Empty(t, re.records("clusterrolebinding/"+b.Name), "a held binding recorded as revoked")

		// What the garbage collector does: the binding goes, and the watch
		// records it.
		_, err = re.env.Clientset.RbacV1().ClusterRoleBindings().Patch(ctx, b.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
		require.NoError(t, err)
		re.waitRecord(t, "clusterrolebinding/"+b.Name, "ada")
	})
}
