package manualact_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// TestADecisionByHandIsRecordedOnceWhateverFailsOrExpires: review 4, R3 and
// R4, against the real API server. A decision's record outlives the record's
// Event (which the API server deletes after its --event-ttl while the request
// lives on); a read or a write of the recorder that fails is tried again, and
// the decision recorded once; and a person whose attempt of the verdict
// stored wrote other words than the condition stored is not named for it.
func TestADecisionByHandIsRecordedOnceWhateverFailsOrExpires(t *testing.T) {
	re := startRecEnv(t)
	ctx := t.Context()

	t.Run("a restart after the record's Event expired records nothing again", func(t *testing.T) {
		csr := re.csr(t, "csr-event-expired")
		re.ichor(t, 0, "approve", csr.Name, "--message", "checked", "--kubeconfig", re.ada)
		re.waitRecord(t, "csr/"+csr.Name, "ada")
		ev := re.event(t, csr.UID)
		// As the API server does once --event-ttl has passed (an hour),
		// while kube-controller-manager keeps the decided request an hour
		// more, or for ever with its cleaner off.
		require.NoError(t, re.env.Client.Delete(ctx, &ev))

		re.stopManager()
		re.startManager(t)
		re.flush(t)
		assert.Len(t, re.records("csr/"+csr.Name), 1, "the restarted manager found the request decided, and its mark")

		// The mark: in the ConfigMap the chart creates in the manager's
		// namespace, under a key made with the admission key.
		var marks corev1.ConfigMap
		require.NoError(t, re.env.Client.Get(ctx, client.ObjectKey{Namespace: harness.ManagerNamespace, Name: "ichor-policy-record-marks"}, &marks))
		var mine []string
		for k, v := range marks.Data {
			if strings.Contains(v, string(csr.UID)) {
				mine = append(mine, k)
				assert.NotContains(t, k, string(csr.UID), "the mark's key is made with the key, not guessable from the request")
				assert.Contains(t, v, `"act":"Approved"`)
			}
		}
		assert.Len(t, mine, 1, "one mark: %v", marks.Data)
	})

	t.Run("a write of the recorder that fails is tried again, and the decision recorded once", func(t *testing.T) {
		csr := re.csr(t, "csr-write-fails")
		var eventFailed, markFailed atomic.Int32
		fail := func(obj client.Object) error {
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				// The first write of this request's mark (review 5, F7).
				if !marksOf(cm, csr.UID) || markFailed.Add(1) > 1 {
					return nil
				}
				return apierrors.NewServiceUnavailable("injected: the first write of the mark fails")
			}
			if obj.GetAnnotations()[manualact.AnnotationObjectUID] != string(csr.UID) || isAttempt(obj) || eventFailed.Add(1) > 1 {
				return nil
			}
			return apierrors.NewServiceUnavailable("injected: the first write of the record fails")
		}
		re.failWrite.Store(&fail)
		defer re.failWrite.Store(nil)
		re.ichor(t, 0, "approve", csr.Name, "--message", "checked", "--kubeconfig", re.ada)
		re.waitRecord(t, "csr/"+csr.Name, "ada")
		ev := re.event(t, csr.UID)
		assert.Contains(t, ev.Message, `by "ada"`)
		re.waitMark(t, csr.UID)
		require.GreaterOrEqual(t, eventFailed.Load(), int32(1), "a write of the record's Event failed")
		require.GreaterOrEqual(t, markFailed.Load(), int32(1), "a write of the mark failed")

		// The Event expires: only the mark, tried again, is left to mark it.
		require.NoError(t, re.env.Client.Delete(ctx, &ev))
		re.stopManager()
		re.startManager(t)
		re.flush(t)
		assert.Len(t, re.records("csr/"+csr.Name), 1, "tried again until marked: recorded once, whatever the restarts")
	})

	t.Run("a read of the recorder that fails is tried again, and the decision recorded once", func(t *testing.T) {
		csr := re.csr(t, "csr-read-fails")
		var failed atomic.Int32
		fail := func(key client.ObjectKey, obj client.Object) error {
			_, mark := obj.(*corev1.ConfigMap)
			if !mark && key.Name != manualact.EventName(csr.UID) || failed.Add(1) > 1 {
				return nil
			}
			return apierrors.NewTimeoutError("injected: the first look for the record's mark times out", 1)
		}
		re.failRead.Store(&fail)
		defer re.failRead.Store(nil)
		re.ichor(t, 0, "deny", csr.Name, "--reason", "Stolen", "--message", "not ours", "--kubeconfig", re.ada)
		r := re.waitRecord(t, "csr/"+csr.Name, "ada")
		assert.Equal(t, engine.ActionDeny, r.Result.Action)
		require.GreaterOrEqual(t, failed.Load(), int32(1), "a read of the recorder failed")
		re.flush(t)
		assert.Len(t, re.records("csr/"+csr.Name), 1)
	})

	t.Run("a manager that may not read its marks still records, once (review 5, F2)", func(t *testing.T) {
		csr := re.csr(t, "csr-marks-forbidden")
		var failed atomic.Int32
		fail := func(_ client.ObjectKey, obj client.Object) error {
			if _, mark := obj.(*corev1.ConfigMap); !mark {
				return nil
			}
			failed.Add(1)
			return apierrors.NewForbidden(corev1.Resource("configmaps"), manualact.MarksConfigMapName, errors.New("injected: its Role lost get"))
		}
		re.failRead.Store(&fail)
		defer re.failRead.Store(nil)
		re.ichor(t, 0, "approve", csr.Name, "--message", "checked", "--kubeconfig", re.ada)
		re.waitRecord(t, "csr/"+csr.Name, "ada")
		re.event(t, csr.UID)
		require.GreaterOrEqual(t, failed.Load(), int32(1), "a read of the marks was forbidden")
		re.failRead.Store(nil)

		re.stopManager()
		re.startManager(t)
		re.flush(t)
		assert.Len(t, re.records("csr/"+csr.Name), 1, "its Event marked it")
	})

	t.Run("an attempt of the verdict stored in other words names nobody (review 4, R4)", func(t *testing.T) {
		anAttemptInOtherWordsNamesNobody(t, re)
	})

	t.Run("long names fill no marks: a later decision by hand is marked, has its Event, and is recorded once (review 5, F1)", func(t *testing.T) {
		longNamesFillNoMarks(t, re)
	})
}

// longNamesFillNoMarks: the API server does not validate a request's name
// (etcd's request size bounds it), so three requests decided by hand, named
// with about a third of 1 MiB each, filled the marks' ConfigMap when a mark
// held the name. Every later decision by hand then had no mark (its update
// refused, 422, and tried again for ever), no Event (held back by the mark),
// and was recorded again at each restart.
func longNamesFillNoMarks(t *testing.T, re *recEnv) {
	ctx := t.Context()
	approve := func(csr *certificatesv1.CertificateSigningRequest) {
		c := csr.DeepCopy()
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand", Message: "by ada, by hand: ok",
		})
		_, err := re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	// The lengths the review found: the three names' marks summed to just
	// under 1 MiB, so that the next mark did not fit.
	for _, long := range []struct {
		c string
		n int
	}{{"a", 349262}, {"b", 349262}, {"c", 348949}} {
		big := re.csr(t, strings.Repeat(long.c, long.n))
		approve(big)
		re.event(t, big.UID)
		re.waitMark(t, big.UID)
	}
	marks := re.marks(t)
	size := 0
	for k, v := range marks.Data {
		size += len(k) + len(v)
		// Longer than any run of a UUID's digits: a mark's own uid and
		// decision id, random, held "aaaa" once in a few hundred runs.
		assert.False(t, strings.Contains(v, strings.Repeat("a", 64)), "a mark holds no name: %.100s", v)
	}
	assert.Less(t, size, 64<<10, "the marks stay small whatever the names")

	csr := re.csr(t, "csr-after-long-names")
	approve(csr)
	re.waitRecord(t, "csr/"+csr.Name, "ada")
	re.event(t, csr.UID)
	re.waitMark(t, csr.UID)
	re.stopManager()
	re.startManager(t)
	re.flush(t)
	assert.Len(t, re.records("csr/"+csr.Name), 1, "marked: recorded once, whatever the restarts")
}

// marks is the marks' ConfigMap.
func (re *recEnv) marks(t *testing.T) corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	require.NoError(t, re.env.Client.Get(t.Context(), client.ObjectKey{Namespace: harness.ManagerNamespace, Name: manualact.MarksConfigMapName}, &cm))
	return cm
}

// waitMark waits until the request with uid has exactly one mark.
func (re *recEnv) waitMark(t *testing.T, uid types.UID) {
	t.Helper()
	var found int
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var cm corev1.ConfigMap
		if err := re.env.Client.Get(ctx, client.ObjectKey{Namespace: harness.ManagerNamespace, Name: manualact.MarksConfigMapName}, &cm); err != nil {
			return false, err
		}
		found = 0
		for _, v := range cm.Data {
			if strings.Contains(v, `"uid":"`+string(uid)+`"`) {
				found++
			}
		}
		return found > 0, nil
	}), "no mark of %s", uid)
	assert.Equal(t, 1, found, "one mark of %s", uid)
}

// anAttemptInOtherWordsNamesNobody: Cy's approval is admitted and kept as an
// attempt, then loses (a conflict) to Ada's approval from the same version,
// whose attempt the webhook could not keep (its Event write failed, as a
// timed-out webhook call would). The stored condition is Ada's words; Cy
// asked for the same verdict in his. Before, the record named Cy.
func anAttemptInOtherWordsNamesNobody(t *testing.T, re *recEnv) {
	ctx := t.Context()
	re.grant(t, "cy", approverRules()...)
	require.NoError(t, re.env.WaitAllowed(ctx, "cy", nil, authorizationv1.ResourceAttributes{
		Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "approval", Verb: "update",
	}))
	cyCfg, err := re.env.UserConfig("cy")
	require.NoError(t, err)
	cy, err := kubernetes.NewForConfig(cyCfg)
	require.NoError(t, err)

	csr := re.csr(t, "csr-other-words")
	withVerdict := func(who string) *certificatesv1.CertificateSigningRequest {
		c := csr.DeepCopy() // the version both read: a write from it conflicts with one stored since
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "IchorManualApproval",
			Message: "by " + who + ", by hand with ichor: looks fine", // as ichor approve writes it
		})
		return c
	}
	failAda := func(obj client.Object) error {
		if isAttempt(obj) && obj.GetAnnotations()[manualact.AnnotationUsername] == "ada" {
			return apierrors.NewTimeoutError("injected: Ada's attempt is not kept", 1)
		}
		return nil
	}
	re.failWrite.Store(&failAda)
	defer re.failWrite.Store(nil)
	var adaErr error
	var fired atomic.Bool
	hook := func(ev *corev1.Event) {
		if ev.InvolvedObject.UID != csr.UID || ev.Annotations[manualact.AnnotationUsername] != "cy" || fired.Swap(true) {
			return
		}
		// Cy's attempt is kept, his write not yet stored: Ada's is.
		_, adaErr = re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(context.Background(), csr.Name, withVerdict("ada"), metav1.UpdateOptions{})
	}
	re.eventHook.Store(&hook)
	_, cyErr := cy.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, withVerdict("cy"), metav1.UpdateOptions{})
	re.eventHook.Store(nil)
	re.failWrite.Store(nil)
	require.True(t, fired.Load(), "the webhook kept Cy's attempt")
	require.NoError(t, adaErr, "Ada's approval is stored")
	require.True(t, apierrors.IsConflict(cyErr), "Cy's approval loses: %v", cyErr)
	stored := re.env.GetCSR(t, csr.Name)
	require.Len(t, stored.Status.Conditions, 1)
	require.Contains(t, stored.Status.Conditions[0].Message, "by ada,")

	re.flush(t)
	recs := re.records("csr/" + csr.Name)
	require.Len(t, recs, 1)
	assert.Equal(t, engine.ActionApprove, recs[0].Result.Action)
	assert.NotEqual(t, "cy", recs[0].Result.Actor, "Cy did not write the condition stored")
	assert.Equal(t, engine.ActorUnknown, recs[0].Result.Actor, "no attempt kept wrote the condition stored")
	assert.Contains(t, recs[0].Result.Reasons[0].Message, "by ada, by hand with ichor", "the condition stored is quoted")
}

// isAttempt reports whether obj is an attempt's Event.
func isAttempt(obj client.Object) bool {
	ev, ok := obj.(*corev1.Event)
	return ok && ev.Reason == manualact.ReasonAttempt
}

// hookedReader is the recorder's reader (the API server, uncached), asking
// the test's hook before each read.
type hookedReader struct {
	client.Reader
	fail *atomic.Pointer[func(client.ObjectKey, client.Object) error]
}

func (h *hookedReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if f := h.fail.Load(); f != nil {
		if err := (*f)(key, obj); err != nil {
			return err
		}
	}
	return h.Reader.Get(ctx, key, obj, opts...)
}

// marksOf reports whether the marks in cm hold one of the request with uid.
func marksOf(cm *corev1.ConfigMap, uid types.UID) bool {
	for _, v := range cm.Data {
		if strings.Contains(v, `"uid":"`+string(uid)+`"`) {
			return true
		}
	}
	return false
}
