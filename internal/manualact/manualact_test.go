package manualact_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// managerUser is the identity the manager runs as, with the rights of the
// recorder's +kubebuilder:rbac markers (and, to write its own approvals in
// the test, those of the approvers on the approval subresource).
const managerUser = "ichor-test:manager"

var signers = []string{certificatesv1.KubeletServingSignerName, certificatesv1.KubeAPIServerClientKubeletSignerName}

// recEnv is a real API server, the recorder's webhooks installed as the
// chart installs them, and a manager serving them and running the watches.
type recEnv struct {
	env     *harness.Env
	log     *harness.DecisionLog
	dir     string
	install *envtest.WebhookInstallOptions
	node    kubernetes.Interface
	manager kubernetes.Interface
	// ada's kubeconfig: a person who may approve and deny kubelet requests
	// and revoke admin bindings, with her own rights.
	ada    string
	adaAPI kubernetes.Interface
	// eventHook, when set, is called with every Event the recorder
	// writes, once it is written (within admission for the webhook's).
	eventHook atomic.Pointer[func(*corev1.Event)]
	// failWrite and failRead, when set, are asked before each object the
	// recorder writes, and each it reads from the API server: an error
	// they return is the API server's answer instead.
	failWrite atomic.Pointer[func(client.Object) error]
	failRead  atomic.Pointer[func(client.ObjectKey, client.Object) error]
	// clockOffset moves the recorder's clock from the real one, in
	// nanoseconds: an attempt kept long before.
	clockOffset atomic.Int64
	// eng is the manager's engine, kept across its restarts; ctx bounds
	// every manager the test starts, and stop stops the one running.
	eng  *engine.Engine
	ctx  context.Context
	stop func()
}

// TestAPersonsActsAreRecordedWithWhoActed: the acts of people the manager
// does not decide, recorded once each in the decision log and as an Event,
// naming who acted as the API server authenticated them; a revocation or a
// decision never waits on the manager, and when its webhook is not called
// the watches record the act with the actor unknown.
func TestAPersonsActsAreRecordedWithWhoActed(t *testing.T) {
	re := startRecEnv(t)
	approved := re.csr(t, "csr-approve")
	denied := re.csr(t, "csr-deny")
	own := re.csr(t, "csr-own")
	hostile := re.csr(t, "csr-hostile")

	t.Run("a person's approval names the person", func(t *testing.T) {
		re.ichor(t, 0, "approve", approved.Name, "--message", "worker-1's IP moved; checked with talosctl", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "csr/"+approved.Name, "ada")
		assert.Equal(t, engine.ManualKindDecision, r.Result.Kind)
		assert.Equal(t, engine.ActionApprove, r.Result.Action)
		assert.Equal(t, engine.SeenByWatch, r.Input.SeenBy, "the verdict as the API server stored it")
		assert.Equal(t, "admission", r.Result.ActorSource, "the one attempt of that verdict, as admitted")
		assert.Equal(t, "system:node:worker-1", r.Result.Whom)
		assert.Equal(t, "worker-1", r.Result.Node)
		require.Len(t, r.Result.Reasons, 1)
		assert.Equal(t, "ManualApproval", r.Result.Reasons[0].Code)
		assert.Contains(t, r.Result.Reasons[0].Message, `approved by hand by "ada"`)
		assert.Contains(t, r.Result.Reasons[0].Message, `worker-1's IP moved; checked with talosctl`)
		ev := re.event(t, approved.UID)
		assert.Equal(t, "ManualApproval", ev.Reason)
		assert.Equal(t, "CertificateSigningRequest", ev.InvolvedObject.Kind)
		assert.Contains(t, ev.Message, `by "ada"`)
		assert.Contains(t, ev.Message, r.DecisionID)
		assert.NotEmpty(t, ev.Annotations[manualact.AnnotationMAC])
	})

	t.Run("a person's denial", func(t *testing.T) {
		re.ichor(t, 0, "deny", denied.Name, "--reason", "Stolen", "--message", "not one of ours", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "csr/"+denied.Name, "ada")
		assert.Equal(t, engine.ActionDeny, r.Result.Action)
		assert.Equal(t, "ManualDenial", r.Result.Reasons[0].Code)
		assert.Contains(t, r.Result.Reasons[0].Message, `reason "Stolen"`)
	})

	t.Run("the manager's own approval calls no webhook", func(t *testing.T) {
		before := re.env.GetCSR(t, own.Name)
		re.managerApproves(t, own)
		// The API server calls a webhook within the write: had it been
		// called, the attempt it keeps would exist now.
		var ev corev1.Event
		assert.True(t, apierrors.IsNotFound(re.env.Client.Get(t.Context(), types.NamespacedName{
			Namespace: manualact.EventNamespace, Name: re.attemptName(t, own.UID, before.ResourceVersion, 0),
		}, &ev)))
	})

	t.Run("a forged, oversized reason and message are bounded", func(t *testing.T) {
		csr := re.env.GetCSR(t, hostile.Name)
		message := "\x1b]0;owned\x07\r\n" + strings.Repeat("m", 64<<10)
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "IchorKubeletServing", Message: message,
		})
		_, err := re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(t.Context(), csr.Name, csr, metav1.UpdateOptions{})
		require.NoError(t, err)
		r := re.waitRecord(t, "csr/"+hostile.Name, "ada")
		msg := r.Result.Reasons[0].Message
		assert.Less(t, len(msg), 1024, "the reason quotes at most 256 bytes of what was written")
		assert.Contains(t, msg, fmt.Sprintf("... (%d bytes)", len(message)))
		assert.NotContains(t, msg, "\x1b")
		assert.NotContains(t, msg, "\r")
		assert.Contains(t, r.Input.Truncated, "certificate_request.conditions", "the logged input says it was cut")
		assert.Less(t, len(r.raw), 16<<10, "the entry is bounded")
		ev := re.event(t, hostile.UID)
		assert.LessOrEqual(t, len(ev.Message), engine.MaxEventNote)
		assert.NotContains(t, ev.Message, "\x1b")
	})

	bob := re.adminBinding(t, "bob")
	t.Run("a revocation by Ada of Bob names both", func(t *testing.T) {
		re.ichor(t, 0, "cluster", "admins", "revoke", "bob", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+bob.Name, "ada")
		assert.Equal(t, engine.ManualKindRevocation, r.Result.Kind)
		assert.Equal(t, engine.ActionRevoke, r.Result.Action)
		assert.Equal(t, "bob", r.Result.Whom)
		assert.Equal(t, "AdminRevoked", r.Result.Reasons[0].Code)
		assert.Contains(t, r.Result.Reasons[0].Message, `of "bob"`)
		assert.Contains(t, r.Result.Reasons[0].Message, `revoked by "ada"`)
		ev := re.event(t, bob.UID)
		assert.Equal(t, credentials.ReasonAdminRevoked, ev.Reason)
		assert.Contains(t, ev.Message, `"bob"`)
		assert.Contains(t, ev.Message, `"ada"`)
	})

	carl := re.adminBinding(t, "carl")
	t.Run("a forged record does not silence a revocation", func(t *testing.T) {
		// Anyone who may create Events in default can take the record's name.
		require.NoError(t, re.env.Client.Create(t.Context(), &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: manualact.EventNamespace, Name: manualact.EventName(carl.UID), Annotations: map[string]string{manualact.AnnotationMAC: "forged"}},
			InvolvedObject: manualact.BindingReference(carl),
			Reason:         "AdminRevoked", Message: "nothing to see", Type: corev1.EventTypeNormal,
		}))
		re.ichor(t, 0, "cluster", "admins", "revoke", "carl", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+carl.Name, "ada")
		assert.Equal(t, "carl", r.Result.Whom)
	})

	eve := re.adminBinding(t, "eve")
	t.Run("a review sent by anyone but the API server is not kept", func(t *testing.T) {
		// The webhook's port answers whoever reaches it (the hostile review
		// of 2026-12-05): a review posted straight to it names the user
		// its sender likes. One that names a version of the binding the
		// API server does not store is not recorded, so it neither accuses
		// Mallory's victim nor silences the real revocation's record.
		forged := eve.DeepCopy()
		forged.ResourceVersion = "1"
		answer := re.postReview(t, webhook.PathRecordAdminBindingDelete, admissionv1.AdmissionRequest{
			UID: "forged-1", Kind: metav1.GroupVersionKind{Group: rbacv1.GroupName, Version: "v1", Kind: "ClusterRoleBinding"},
			Resource: metav1.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "clusterrolebindings"},
			Name:     eve.Name, Operation: admissionv1.Delete, UserInfo: authenticationv1.UserInfo{Username: "mallory"},
			OldObject: runtime.RawExtension{Raw: mustJSON(t, forged)},
		})
		assert.True(t, answer.Allowed, "the recorder refused a review")
		re.ichor(t, 0, "cluster", "admins", "revoke", "eve", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+eve.Name, "ada")
		assert.Equal(t, "eve", r.Result.Whom)
		for _, r := range re.records("clusterrolebinding/" + eve.Name) {
			assert.NotEqual(t, "mallory", r.Result.Actor, "a forged review was recorded")
		}
	})

	t.Run("a revocation is recorded as the API server stored it (review of 2026-12-06)", func(t *testing.T) {
		revocationsAreRecordedAsStored(t, re)
	})
	t.Run("hostile acts are recorded as they happened (review 3)", func(t *testing.T) {
		hostileActsAreRecordedAsTheyHappened(t, re)
	})
	t.Run("a decision is recorded as the API server stored it (review 3, F2)", func(t *testing.T) {
		racingDecisionsAreRecordedAsStored(t, re)
	})
	t.Run("a decision made while no manager watched is recorded when one starts", func(t *testing.T) {
		decisionsNoManagerWatchedAreRecorded(t, re)
	})

	// The webhook becomes unreachable: every write still succeeds, and the
	// watches record what they see with the actor unknown.
	re.breakWebhooks(t)
	dan := re.adminBinding(t, "dan")
	ownLater := re.csr(t, "csr-own-later")
	unseen := re.csr(t, "csr-unseen")
	t.Run("without the webhook a revocation succeeds and is recorded, the revoker unknown", func(t *testing.T) {
		re.ichor(t, 0, "cluster", "admins", "revoke", "dan", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+dan.Name, engine.ActorUnknown)
		assert.Equal(t, engine.SeenByWatch, r.Input.SeenBy)
		assert.Equal(t, "dan", r.Result.Whom)
		assert.Contains(t, r.Result.Reasons[0].Message, "the API server's audit log names the user")
	})
	t.Run("without the webhook an approval succeeds and is recorded, the approver unknown", func(t *testing.T) {
		re.managerApproves(t, ownLater)
		re.ichor(t, 0, "approve", unseen.Name, "--message", "by hand", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "csr/"+unseen.Name, engine.ActorUnknown)
		assert.Equal(t, engine.ActionApprove, r.Result.Action)
		assert.Equal(t, engine.SeenByWatch, r.Input.SeenBy)
		assert.Equal(t, engine.ActorUnknown, r.Result.ActorSource, "no attempt was kept")
	})

	t.Run("each act is recorded once", func(t *testing.T) {
		// The watches saw every act before the last ones they recorded
		// (one informer per kind delivers in order): what they did not
		// record by now, they never will.
		for _, object := range []string{"csr/" + approved.Name, "csr/" + denied.Name, "csr/" + hostile.Name, "clusterrolebinding/" + bob.Name} {
			assert.Len(t, re.records(object), 1, object)
		}
		assert.Empty(t, re.records("csr/"+own.Name), "the manager's own approval is no person's act")
		assert.Empty(t, re.records("csr/"+ownLater.Name), "the manager's own approval is no person's act")
	})
}

// revocationsAreRecordedAsStored: a DELETE refused after admission is no
// revocation, and one made while no leader watches is recorded by the
// replica whose webhook admitted it.
func revocationsAreRecordedAsStored(t *testing.T, re *recEnv) {
	frank := re.adminBinding(t, "frank")
	t.Run("a DELETE refused after admission is not recorded as a revocation", func(t *testing.T) {
		// The review of 2026-12-06: the webhook recorded a revocation as it
		// admitted the DELETE, and another webhook (here one that is down,
		// failing closed) refused it after: the log said Ada revoked Frank
		// while his binding still granted cluster-admin, and its record
		// silenced the real revocation's.
		held := re.holdDeletions(t, frank)
		err := re.adaAPI.RbacV1().ClusterRoleBindings().Delete(t.Context(), frank.Name, metav1.DeleteOptions{})
		require.Error(t, err, "the DELETE was not refused")
		require.NoError(t, re.env.Client.Get(t.Context(), client.ObjectKeyFromObject(frank), &rbacv1.ClusterRoleBinding{}), "the binding is gone")
		// The webhook has answered: a record made at admission is there.
		assert.Empty(t, re.records("clusterrolebinding/"+frank.Name), "a refused DELETE was recorded as a revocation")
		assert.True(t, apierrors.IsNotFound(re.env.Client.Get(t.Context(), types.NamespacedName{Namespace: manualact.EventNamespace, Name: manualact.EventName(frank.UID)}, &corev1.Event{})))

		// Let go, Ada revokes him: recorded once the binding is gone,
		// naming her (her refused DELETE and this one, one person).
		held()
		re.ichor(t, 0, "cluster", "admins", "revoke", "frank", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+frank.Name, "ada")
		assert.Equal(t, engine.SeenByWatch, r.Input.SeenBy, "recorded as stored")
		assert.Equal(t, "admission", r.Result.ActorSource)
		assert.Equal(t, "frank", r.Result.Whom)
	})

	hal := re.adminBinding(t, "hal")
	t.Run("a person's DELETE sent again long after their refused one names them", func(t *testing.T) {
		// The review of 2026-12-06: the webhook brings a person's kept
		// DELETE up to their later one by updating its Event, which the
		// manager's rights did not allow. Her attempt of ten minutes before
		// the deletion no longer counts, and the revocation named nobody.
		re.clockOffset.Store(int64(-10 * time.Minute))
		held := re.holdDeletions(t, hal)
		err := re.adaAPI.RbacV1().ClusterRoleBindings().Delete(t.Context(), hal.Name, metav1.DeleteOptions{})
		require.Error(t, err, "the DELETE was not refused")
		held()
		re.clockOffset.Store(0)
		re.ichor(t, 0, "cluster", "admins", "revoke", "hal", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+hal.Name, "ada")
		assert.Equal(t, "admission", r.Result.ActorSource)
		assert.Equal(t, "hal", r.Result.Whom)
	})

	ivy := re.adminBinding(t, "ivy")
	t.Run("a revocation whose record fails is tried again, and recorded once (review 240, F3)", func(t *testing.T) {
		// The binding is gone when its record is made, so nothing lists it
		// again: a record that failed once was lost, the watch's and the
		// webhook's replica's alike. The first two looks for the record's
		// mark time out, then the first write of its Event fails.
		var reads, writes atomic.Int32
		failRead := func(key client.ObjectKey, _ client.Object) error {
			if key.Name != manualact.EventName(ivy.UID) || reads.Add(1) > 2 {
				return nil
			}
			return apierrors.NewTimeoutError("injected: the look for the revocation's mark times out", 1)
		}
		failWrite := func(obj client.Object) error {
			if obj.GetAnnotations()[manualact.AnnotationObjectUID] != string(ivy.UID) || isAttempt(obj) || writes.Add(1) > 1 {
				return nil
			}
			return apierrors.NewServiceUnavailable("injected: the first write of the revocation's Event fails")
		}
		re.failRead.Store(&failRead)
		defer re.failRead.Store(nil)
		re.failWrite.Store(&failWrite)
		defer re.failWrite.Store(nil)
		re.ichor(t, 0, "cluster", "admins", "revoke", "ivy", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+ivy.Name, "ada")
		assert.Equal(t, "ivy", r.Result.Whom)
		ev := re.event(t, ivy.UID)
		assert.Equal(t, r.DecisionID, ev.Annotations[manualact.AnnotationDecisionID])
		assert.GreaterOrEqual(t, reads.Load(), int32(3), "the mark was looked for again after two failures")
		assert.GreaterOrEqual(t, writes.Load(), int32(2), "the Event was written again after a failure")
		assert.Len(t, re.records("clusterrolebinding/"+ivy.Name), 1, "the rule was asked once: the try after the Event failed wrote the Event alone")
	})

	joy := re.adminBinding(t, "joy")
	t.Run("a revocation whose attempts cannot be read at first still names who revoked (review 245, F1)", func(t *testing.T) {
		// Read once and given up on, the attempts left the revoker
		// unknown for good; they are read again, for a minute.
		first := re.attemptName(t, joy.UID, manualact.DeletionVersion, 0)
		var reads atomic.Int32
		failRead := func(key client.ObjectKey, _ client.Object) error {
			if key.Name != first || reads.Add(1) > 2 {
				return nil
			}
			return apierrors.NewTimeoutError("injected: the read of the DELETE's attempt times out", 1)
		}
		re.failRead.Store(&failRead)
		defer re.failRead.Store(nil)
		re.ichor(t, 0, "cluster", "admins", "revoke", "joy", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+joy.Name, "ada")
		assert.Equal(t, "admission", r.Result.ActorSource)
		assert.GreaterOrEqual(t, reads.Load(), int32(3), "the attempt was read again after two failures")
	})

	kim := re.adminBinding(t, "kim")
	t.Run("a revocation's Event stored by a write that timed out is not written again (review 245, F3)", func(t *testing.T) {
		var writes atomic.Int32
		failWrite := func(obj client.Object) error {
			if obj.GetAnnotations()[manualact.AnnotationObjectUID] != string(kim.UID) || isAttempt(obj) || writes.Add(1) > 1 {
				return nil
			}
			// Stored, and the answer lost.
			if err := re.env.Client.Create(t.Context(), obj.DeepCopyObject().(client.Object)); err != nil {
				return err
			}
			return apierrors.NewTimeoutError("injected: the write of the revocation's Event was stored, and its answer timed out", 1)
		}
		// The looks for the record's mark: the first try's, then the
		// try's after the timeout, which finds the Event and ends.
		var looks atomic.Int32
		countLooks := func(key client.ObjectKey, _ client.Object) error {
			if key.Name == manualact.EventName(kim.UID) {
				looks.Add(1)
			}
			return nil
		}
		re.failWrite.Store(&failWrite)
		defer re.failWrite.Store(nil)
		re.failRead.Store(&countLooks)
		defer re.failRead.Store(nil)
		re.ichor(t, 0, "cluster", "admins", "revoke", "kim", "--kubeconfig", re.ada)
		re.waitRecord(t, "clusterrolebinding/"+kim.Name, "ada")
		re.event(t, kim.UID)
		require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return writes.Load() >= 1 && looks.Load() >= 2, nil
		}), "the try after the timeout looked for the record's mark")
		var events corev1.EventList
		require.NoError(t, re.env.Client.List(t.Context(), &events, client.InNamespace(manualact.EventNamespace)))
		var records int
		for _, ev := range events.Items {
			if ev.Annotations[manualact.AnnotationObjectUID] == string(kim.UID) && !isAttempt(&ev) {
				records++
			}
		}
		assert.Equal(t, 1, records, "one record Event")
		assert.Len(t, re.records("clusterrolebinding/"+kim.Name), 1)
	})

	gil := re.adminBinding(t, "gil")
	t.Run("a revocation while no leader watches is recorded by the webhook's replica", func(t *testing.T) {
		// The watch that records revocations runs on the leader only, and
		// a binding deleted while the leader changes is not in the next
		// one's list (review of 2026-12-06, when the webhook stopped
		// recording at admission).
		re.stopManager()
		re.startManagerWith(t, false)
		// Deferred, not a cleanup: the test's context still lives.
		defer func() { re.stopManager(); re.startManager(t) }()
		re.ichor(t, 0, "cluster", "admins", "revoke", "gil", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "clusterrolebinding/"+gil.Name, "ada")
		assert.Equal(t, "gil", r.Result.Whom)
		assert.Equal(t, "admission", r.Result.ActorSource)
	})
}

func startRecEnv(t *testing.T) *recEnv {
	t.Helper()
	ctx := t.Context()
	env := harness.StartForTest(t, harness.Options{})
	re := &recEnv{env: env, log: &harness.DecisionLog{}, dir: t.TempDir()}

	rules, err := webhooktest.MarkerRules("internal/manualact")
	require.NoError(t, err)
	rules = append(rules, approverRules()...)
	re.grant(t, managerUser, rules...)
	keyRules, err := webhooktest.NamespacedMarkerRules("internal/facts/credential")
	require.NoError(t, err)
	// The marks of the records, in the manager's namespace.
	markRules, err := webhooktest.NamespacedMarkerRules("internal/manualact")
	require.NoError(t, err)
	keyRules = append(keyRules, markRules...)
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: harness.ManagerNamespace, Name: "manager"}, Rules: keyRules}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: harness.ManagerNamespace, Name: "manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "manager"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: managerUser}},
	}))
	// Ada: a person's rights for ichor approve|deny and ichor cluster admins.
	re.grant(t, "ada", append(approverRules(),
		rbacv1.PolicyRule{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"get", "list"}},
		rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterrolebindings"}, Verbs: []string{"get", "list", "delete"}},
		rbacv1.PolicyRule{APIGroups: []string{"ichor.dev"}, Resources: []string{"taloscredentialrequests"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	)...)
	for user, attrs := range map[string]authorizationv1.ResourceAttributes{
		managerUser: {Namespace: harness.ManagerNamespace, Resource: "secrets", Name: "ichor-policy-admission-key", Verb: "update"},
		"ada":       {Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "list"},
	} {
		require.NoError(t, env.WaitAllowed(ctx, user, nil, attrs))
	}
	adaCfg, err := env.UserConfig("ada")
	require.NoError(t, err)
	re.ada = writeKubeconfig(t, re.dir, "ada", adaCfg)
	re.adaAPI, err = kubernetes.NewForConfig(adaCfg)
	require.NoError(t, err)
	nodeCfg, err := env.UserConfig("system:node:worker-1", harness.NodesGroup)
	require.NoError(t, err)
	re.node, err = kubernetes.NewForConfig(nodeCfg)
	require.NoError(t, err)

	re.install, err = webhooktest.InstallRecorder(env.Config, managerUser)
	require.NoError(t, err)
	t.Cleanup(func() { _ = re.install.Cleanup() })
	eng, err := engine.New(ctx, engine.Options{DecisionLog: re.log, Log: os.Stderr, ID: "recorder-test"})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Stop(context.Background()) })
	re.eng, re.ctx = eng, ctx
	t.Cleanup(re.stopManager)
	re.startManager(t)
	return re
}

// startManager starts the manager: its webhook and its watches, as the
// manager's user. It runs until stopManager, or the end of the test.
func (re *recEnv) startManager(t *testing.T) { re.startManagerWith(t, true) }

// startManagerWith is startManager, with the admin bindings' watch or
// without it (a replica that is not the leader: only its webhook runs).
func (re *recEnv) startManagerWith(t *testing.T, bindingsWatch bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(re.ctx)
	cfg, err := re.env.UserConfig(managerUser)
	require.NoError(t, err)
	re.manager, err = kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	// A manager started again registers its controllers' names again.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: re.env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		WebhookServer: crwebhook.NewServer(webhooktest.ServerOptions(re.install)),
		Controller:    config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	eng := re.eng
	keyClient, err := client.New(cfg, client.Options{Scheme: re.env.Scheme})
	require.NoError(t, err)
	recorder := &manualact.Recorder{
		Reader: &hookedReader{Reader: mgr.GetAPIReader(), fail: &re.failRead},
		Client: &hookedClient{Client: mgr.GetClient(), hook: &re.eventHook, fail: &re.failWrite}, Engine: eng,
		Keys: re.env.AdmissionKeys(keyClient), Instance: "recorder-test", Namespace: harness.ManagerNamespace,
		Clock: offsetClock{&re.clockOffset},
	}
	// One queue of revocations' records for the webhook and the watch, as
	// the manager has it.
	revocations := &manualact.Revocations{Recorder: recorder}
	require.NoError(t, mgr.Add(revocations))
	require.NoError(t, (&webhook.ActRecorder{Recorder: recorder, Signers: signers, Revocations: revocations}).SetupWithManager(mgr))
	require.NoError(t, (&manualact.CSRDecisions{Recorder: recorder, Signers: signers}).SetupWithManager(mgr))
	if bindingsWatch {
		require.NoError(t, (&credentials.AdminBindings{Engine: eng, AdminKubeconfigs: true, Revocations: revocations}).SetupWithManager(mgr))
	}
	done := harness.RunManager(ctx, mgr, "manager")
	re.stop = func() { cancel(); <-done }
	started := mgr.GetWebhookServer().StartedChecker()
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return started(nil) == nil, nil
	}))
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))
	// The watch's handler may come later than the cache: from now on, what
	// is decided is seen as a change.
	re.flushAfterStart(t)
}

// stopManager stops the manager, and waits until it has stopped: its
// webhook is then unreachable (failurePolicy Ignore) and nothing watches.
func (re *recEnv) stopManager() {
	if re.stop != nil {
		re.stop()
		re.stop = nil
	}
}

// approverRules are the rights to decide kubelet requests.
func approverRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests/approval"}, Verbs: []string{"update"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: signers, Verbs: []string{"approve"}},
	}
}

func (re *recEnv) grant(t *testing.T, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	name := "test:" + user
	require.NoError(t, re.env.Client.Create(t.Context(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}))
	require.NoError(t, re.env.Client.Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}))
}

// csr is a kubelet serving request of worker-1, left pending.
func (re *recEnv) csr(t *testing.T, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	pem, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}})
	require.NoError(t, err)
	re.env.SubmitCSR(t, re.node, csrgen.ServingObject(name, "worker-1", pem))
	return re.env.GetCSR(t, name)
}

// managerApproves writes an approval as the approver writes it, as the
// manager.
func (re *recEnv) managerApproves(t *testing.T, csr *certificatesv1.CertificateSigningRequest) {
	t.Helper()
	csr = re.env.GetCSR(t, csr.Name)
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "IchorKubeletServing",
		Message: "IchorKubeletServing: the request matches the node (decision 0b6f3c1e-2a4d-4e5f-8a9b-1c2d3e4f5a6b, policy revision sha256:0123456789abcdef)",
	})
	_, err := re.manager.CertificatesV1().CertificateSigningRequests().UpdateApproval(t.Context(), csr.Name, csr, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// adminBinding is a person's admin binding as the issuer makes it.
func (re *recEnv) adminBinding(t *testing.T, user string) *rbacv1.ClusterRoleBinding {
	t.Helper()
	name := "ichor-admin:u:" + user + ":0123456789"
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{credentials.LabelAdminBinding: "true", credentials.LabelManagedBy: credentials.ManagedBy},
			Annotations: map[string]string{
				credentials.AnnotationAdminUsername: user,
				credentials.AnnotationAdminIdentity: "ichor-admin:u:" + user,
			},
		},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}},
	}
	require.NoError(t, re.env.Client.Create(t.Context(), b))
	return b
}

// postReview posts a review straight to the recorder's webhook, as anyone
// who reaches its port can, and returns its answer.
func (re *recEnv) postReview(t *testing.T, path string, req admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(re.install.LocalServingCAData))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	body := mustJSON(t, &admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: &req})
	url := fmt.Sprintf("https://%s%s", net.JoinHostPort(re.install.LocalServingHost, strconv.Itoa(re.install.LocalServingPort)), path)
	resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close() //nolint:errcheck // a test's read
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var review admissionv1.AdmissionReview
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&review))
	require.NotNil(t, review.Response)
	return review.Response
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// breakWebhooks points the recorder's webhooks at a port nobody serves.
func (re *recEnv) breakWebhooks(t *testing.T) {
	t.Helper()
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, re.env.Client.Get(t.Context(), types.NamespacedName{Name: "ichor-test-recorder"}, &vwc))
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].ClientConfig.URL = ptr.To("https://127.0.0.1:1/unavailable")
	}
	require.NoError(t, re.env.Client.Update(t.Context(), &vwc))
	// The API server reads the configuration through an informer: approve
	// probes by hand until one is recorded without its approver, of whom
	// the webhook kept no attempt.
	for i := 0; ; i++ {
		require.Less(t, i, 50, "the API server still calls the webhook")
		probe := re.csr(t, fmt.Sprintf("csr-probe-%d", i))
		re.ichor(t, 0, "approve", probe.Name, "--message", "probe", "--kubeconfig", re.ada)
		var r recordEntry
		require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			rs := re.records("csr/" + probe.Name)
			if len(rs) > 0 {
				r = rs[0]
			}
			return len(rs) > 0, nil
		}), "the probe %s was not recorded", probe.Name)
		if r.Result.Actor == engine.ActorUnknown {
			return
		}
	}
}

type recordEntry struct {
	DecisionID string `json:"decision_id"`
	Path       string `json:"path"`
	Input      struct {
		SeenBy    string         `json:"seen_by"`
		Truncated map[string]any `json:"log_truncated"`
	} `json:"input"`
	Result engine.ManualRecord `json:"result"`
	raw    string
}

// records are the manual records of object in the decision log.
// holdDeletions makes the API server refuse every DELETE of b after the
// recorder's webhook admitted it: a second webhook, failing closed, that
// nothing answers. It returns once a DELETE is refused, and its result lets
// go and returns once one is not.
func (re *recEnv) holdDeletions(t *testing.T, b *rbacv1.ClusterRoleBinding) func() {
	t.Helper()
	const label = "ichor.test/held"
	labelled := b.DeepCopy()
	require.NoError(t, re.env.Client.Get(t.Context(), client.ObjectKeyFromObject(b), labelled))
	labelled.Labels[label] = "true"
	require.NoError(t, re.env.Client.Update(t.Context(), labelled))
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "ichor-test-refuser"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "refuser.ichor.test",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/unavailable")},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete}, Rule: admissionregistrationv1.Rule{APIGroups: []string{rbacv1.GroupName}, APIVersions: []string{"v1"}, Resources: []string{"clusterrolebindings"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{label: "true"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](2),
		}},
	}
	require.NoError(t, re.env.Client.Create(t.Context(), vwc))
	refused := func(ctx context.Context) bool {
		// A dry run: the recorder leaves it be, the refuser does not.
		return re.env.Client.Delete(ctx, b.DeepCopy(), client.DryRunAll) != nil
	}
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return refused(ctx), nil
	}), "the API server never called the refusing webhook")
	return func() {
		require.NoError(t, re.env.Client.Delete(t.Context(), vwc))
		require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return !refused(ctx), nil
		}), "the API server still calls the refusing webhook")
	}
}

func (re *recEnv) records(object string) []recordEntry {
	var out []recordEntry
	for _, line := range strings.Split(re.log.String(), "\n") {
		var e recordEntry
		if !strings.Contains(line, engine.PathManualRecord) || json.Unmarshal([]byte(line), &e) != nil || e.Path != engine.PathManualRecord || e.Result.Object != object {
			continue
		}
		e.raw = line
		out = append(out, e)
	}
	return out
}

// waitRecord waits, up to 30 s, for a record of object naming actor.
func (re *recEnv) waitRecord(t *testing.T, object, actor string) recordEntry {
	t.Helper()
	var found recordEntry
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, r := range re.records(object) {
			if r.Result.Actor == actor {
				found = r
				return true, nil
			}
		}
		return false, nil
	}), "no record of %s by %s in the decision log:\n%s", object, actor, re.log.String())
	return found
}

// event waits, up to 30 s, for the record's Event of the object with uid
// (written just after the record).
func (re *recEnv) event(t *testing.T, uid types.UID) corev1.Event {
	t.Helper()
	var ev corev1.Event
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := re.env.Client.Get(ctx, types.NamespacedName{Namespace: manualact.EventNamespace, Name: manualact.EventName(uid)}, &ev)
		return err == nil, client.IgnoreNotFound(err)
	}), "no record Event of %s", uid)
	return ev
}

// attemptName is the name of an attempt's Event at place slot, made with
// the manager's key.
func (re *recEnv) attemptName(t *testing.T, uid types.UID, oldRV string, slot int) string {
	t.Helper()
	key, err := re.env.AdmissionKeys(re.env.Client).Key(t.Context())
	require.NoError(t, err)
	return manualact.AttemptEventName(key, uid, oldRV, slot)
}

// ichor runs the command line in-process, expects the exit code, and
// returns what it wrote (out, then err).
func (re *recEnv) ichor(t *testing.T, code int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	got := cli.Run(ctx, args, strings.NewReader(""), &out, &errOut)
	t.Logf("$ ichor %s\n%s%s(exit %d)", strings.Join(args, " "), out.String(), errOut.String(), got)
	require.Equal(t, code, got, errOut.String())
	return out.String() + errOut.String()
}

func writeKubeconfig(t *testing.T, dir, user string, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts[user] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	kc.CurrentContext = user
	path := filepath.Join(dir, user+".kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// offsetClock is the real clock moved by an offset, in nanoseconds.
type offsetClock struct{ offset *atomic.Int64 }

func (c offsetClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
