package manualact_test

import (
	"context"
	"fmt"
	"sync"
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
)

// raceRounds is how many requests get an approve and a deny at once.
const raceRounds = 20

// racingDecisionsAreRecordedAsStored: review 3's F2. A webhook is called
// before the write is stored, and the API server may refuse the write
// afterwards; the decision log must say what was stored. Run by
// TestAPersonsActsAreRecordedWithWhoActed while the webhook is called.
func racingDecisionsAreRecordedAsStored(t *testing.T, re *recEnv) {
	ctx := t.Context()

	t.Run("an approve and a deny at once: one record, of the verdict stored", func(t *testing.T) {
		stored := make([]string, raceRounds)
		for i := range raceRounds {
			csr := re.csr(t, fmt.Sprintf("csr-race-%d", i))
			// Both writes pass admission from the same version of the
			// request: the webhook's first Event of each waits for the
			// other's, so that neither is stored before both are admitted.
			admitted := re.holdUntilBothAdmitted(csr.UID)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for j, verdict := range []certificatesv1.RequestConditionType{certificatesv1.CertificateDenied, certificatesv1.CertificateApproved} {
				c := csr.DeepCopy()
				c.ResourceVersion = "" // as a client that does not retry on conflict, or one that read the request just before
				c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
					Type: verdict, Status: corev1.ConditionTrue, Reason: "Race", Message: "ada's " + string(verdict),
				})
				wg.Go(func() {
					_, errs[j] = re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{})
				})
			}
			wg.Wait()
			re.eventHook.Store(nil)
			require.True(t, admitted.Load(), "round %d: both writes passed the webhook", i)
			require.True(t, (errs[0] == nil) != (errs[1] == nil), "round %d: the API server stored one write and refused the other: %v", i, errs)
			stored[i] = verdictOf(re.env.GetCSR(t, csr.Name))
			require.NotEmpty(t, stored[i], "round %d", i)
		}
		re.flush(t)
		wins := map[string]int{}
		for _, v := range stored {
			wins[v]++
		}
		t.Logf("%d rounds, both writes admitted in each; stored: %v", raceRounds, wins)
		for i := range raceRounds {
			rs := re.records(fmt.Sprintf("csr/csr-race-%d", i))
			var acts []string
			for _, r := range rs {
				acts = append(acts, r.Result.Action+" by "+r.Result.Actor)
			}
			want := map[string]string{"Approved": engine.ActionApprove, "Denied": engine.ActionDeny}[stored[i]]
			if assert.Equal(t, 1, len(rs), "round %d: the request is %s, the decision log says %v", i, stored[i], acts) {
				assert.Equal(t, want, rs[0].Result.Action, "round %d: the request is %s", i, stored[i])
				assert.Equal(t, "ada", rs[0].Result.Actor, "round %d: one attempt of the verdict stored, hers", i)
				assert.Contains(t, rs[0].Result.Reasons[0].Message, "ada's "+stored[i], "round %d: the condition stored is quoted", i)
			}
		}
	})

	t.Run("two people who approve at once are both named, neither as the approver", func(t *testing.T) {
		re.grant(t, "cy", approverRules()...)
		require.NoError(t, re.env.WaitAllowed(ctx, "cy", nil, authorizationv1.ResourceAttributes{
			Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "approval", Verb: "update",
		}))
		cyCfg, err := re.env.UserConfig("cy")
		require.NoError(t, err)
		cy, err := kubernetes.NewForConfig(cyCfg)
		require.NoError(t, err)
		csr := re.csr(t, "csr-two-approvers")
		admitted := re.holdUntilBothAdmitted(csr.UID)
		var wg sync.WaitGroup
		for _, api := range []kubernetes.Interface{re.adaAPI, cy} {
			c := csr.DeepCopy()
			c.ResourceVersion = ""
			c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand", Message: "looks fine",
			})
			wg.Go(func() {
				_, _ = api.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{})
			})
		}
		wg.Wait()
		re.eventHook.Store(nil)
		require.True(t, admitted.Load(), "both approvals passed the webhook")
		r := re.waitRecord(t, "csr/"+csr.Name, engine.ActorUnknown)
		assert.Equal(t, engine.ActionApprove, r.Result.Action)
		assert.Equal(t, "ambiguous", r.Result.ActorSource)
		assert.Contains(t, r.Result.Reasons[0].Message, `2 people asked for this verdict at once ("ada", "cy")`)
		re.flush(t)
		assert.Len(t, re.records("csr/"+csr.Name), 1)
	})

	t.Run("a person's denial that lost to Ichor's approval is recorded nowhere", func(t *testing.T) {
		csr := re.csr(t, "csr-lost-to-ichor")
		// While the webhook admits Ada's denial, the manager's approver
		// approves the request: its write is stored first, and hers is
		// refused.
		var managerErr error
		var fired atomic.Bool
		hook := func(ev *corev1.Event) {
			if ev.InvolvedObject.UID != csr.UID || fired.Swap(true) {
				return
			}
			managerErr = re.managerApprovesNow(context.Background(), csr.Name)
		}
		re.eventHook.Store(&hook)
		denial := csr.DeepCopy()
		denial.Status.Conditions = append(denial.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "Stolen", Message: "not one of ours",
		})
		_, err := re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, denial.Name, denial, metav1.UpdateOptions{})
		re.eventHook.Store(nil)
		require.True(t, fired.Load(), "the webhook admitted Ada's denial")
		require.NoError(t, managerErr)
		require.Error(t, err, "Ada's denial is refused: the request was approved meanwhile")
		assert.Equal(t, "Approved", verdictOf(re.env.GetCSR(t, csr.Name)))
		re.flush(t)
		assert.Empty(t, re.records("csr/"+csr.Name), "Ichor's approval is no person's act, and Ada's denial was never stored")
		var ev corev1.Event
		err = re.env.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "ichor-act-" + string(csr.UID)}, &ev)
		assert.True(t, apierrors.IsNotFound(err), "no record Event: %v", err)
	})
}

// holdUntilBothAdmitted makes the webhook call that wrote the first Event
// about the object with uid wait, up to 2 s (within the webhook's 3 s), for
// a second one written: two webhook calls are then both under way, with
// both attempts kept before either write is stored. It reports whether they
// met.
func (re *recEnv) holdUntilBothAdmitted(uid types.UID) *atomic.Bool {
	var arrived atomic.Int32
	var met atomic.Bool
	both := make(chan struct{})
	hook := func(ev *corev1.Event) {
		if ev.InvolvedObject.UID != uid {
			return
		}
		switch arrived.Add(1) {
		case 1:
			select {
			case <-both:
			case <-time.After(2 * time.Second):
			}
		case 2:
			met.Store(true)
			close(both)
		}
	}
	re.eventHook.Store(&hook)
	return &met
}

// flush waits until the watch has recorded a decision by hand made after
// every act before it: one informer delivers the requests' changes in
// order, so what it has not recorded of the earlier ones by then, it never
// will.
func (re *recEnv) flush(t *testing.T) {
	t.Helper()
	re.waitRecord(t, "csr/"+re.sentinel(t), "ada")
}

// flushAfterStart is flush for a manager just started: until its watch has
// its handler, a request decided is first seen listed (an Add, recorded as
// no one's), in no particular order among the listed ones. A first sentinel
// recorded either way says the listed requests were handed over; a second,
// then seen as a change, comes after all of them.
func (re *recEnv) flushAfterStart(t *testing.T) {
	t.Helper()
	first := "csr/" + re.sentinel(t)
	require.NoError(t, wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(re.records(first)) > 0, nil
	}), "no record of %s in the decision log:\n%s", first, re.log.String())
	re.flush(t)
}

// sentinel is a new request Ada approves, by name.
func (re *recEnv) sentinel(t *testing.T) string {
	t.Helper()
	sentinel := re.csr(t, fmt.Sprintf("csr-flush-%d", time.Now().UnixNano()))
	sentinel.Status.Conditions = append(sentinel.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Flush", Message: "the last act",
	})
	_, err := re.adaAPI.CertificatesV1().CertificateSigningRequests().UpdateApproval(t.Context(), sentinel.Name, sentinel, metav1.UpdateOptions{})
	require.NoError(t, err)
	return sentinel.Name
}

// managerApprovesNow writes, as the manager, an approval as the approver
// writes it (from within the webhook's call: no t).
func (re *recEnv) managerApprovesNow(ctx context.Context, name string) error {
	csr, err := re.manager.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "IchorKubeletServing",
		Message: "IchorKubeletServing: the request matches the node (decision 0b6f3c1e-2a4d-4e5f-8a9b-1c2d3e4f5a6b, policy revision sha256:0123456789abcdef)",
	})
	_, err = re.manager.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, csr, metav1.UpdateOptions{})
	return err
}

// verdictOf is the request's Approved or Denied condition type, or "".
func verdictOf(csr *certificatesv1.CertificateSigningRequest) string {
	for _, c := range csr.Status.Conditions {
		if (c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied) && c.Status == corev1.ConditionTrue {
			return string(c.Type)
		}
	}
	return ""
}

// hookedClient is the recorder's client, calling the test's hooks before
// each object it creates or updates, and after each Event it wrote.
type hookedClient struct {
	client.Client
	hook *atomic.Pointer[func(*corev1.Event)]
	fail *atomic.Pointer[func(client.Object) error]
}

// Create calls the hook once an Event is written: an attempt's, within the
// webhook's call, so that a test can hold a write's admission with its
// attempt kept (two writes held so are both kept before either is stored).
// Before, fail may answer for the API server.
func (h *hookedClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if f := h.fail.Load(); f != nil {
		if err := (*f)(obj); err != nil {
			return err
		}
	}
	if err := h.Client.Create(ctx, obj, opts...); err != nil {
		return err
	}
	if ev, ok := obj.(*corev1.Event); ok {
		if f := h.hook.Load(); f != nil {
			(*f)(ev)
		}
	}
	return nil
}

// Update asks fail first, as Create does: the recorder updates only the
// marks' ConfigMap.
func (h *hookedClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if f := h.fail.Load(); f != nil {
		if err := (*f)(obj); err != nil {
			return err
		}
	}
	return h.Client.Update(ctx, obj, opts...)
}
