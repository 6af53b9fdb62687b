package kubeletclient

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ichor-dev/ichor-policy/controllers/internal/approval/approvaltest"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

const testDecision = "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c"

// approvingEngine approves every request, and keeps the records it is
// given, or refuses them while refuse is set (a decision-log sink that
// refuses entries).
type approvingEngine struct {
	mu      sync.Mutex
	refuse  bool
	records []engine.Applied
}

func (*approvingEngine) KubeletClient(context.Context, csrinput.KubeletClient) (engine.CSRDecision, error) {
	return engine.CSRDecision{Action: engine.ActionApprove, Reasons: engine.Reasons{{Code: "Test", Message: "test"}}, DecisionID: testDecision, Revision: "abc"}, nil
}

func (e *approvingEngine) RecordApplied(_ context.Context, a engine.Applied) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.refuse {
		return errors.New("the decision log refused the entry")
	}
	e.records = append(e.records, a)
	return nil
}

func (e *approvingEngine) outcomes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, a := range e.records {
		out = append(out, a.DecisionID+" "+a.Outcome)
	}
	return out
}

type indexerOf struct{ b *fake.ClientBuilder }

func (i indexerOf) IndexField(_ context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	i.b.WithIndex(obj, field, extract)
	return nil
}

type recordFixture struct {
	r   *Reconciler
	cs  *k8sfake.Clientset
	eng *approvingEngine
	req reconcile.Request
}

func newRecordFixture(t *testing.T) *recordFixture {
	t.Helper()
	pem, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("x")})
	require.NoError(t, err)
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-c", UID: "uid-c", ResourceVersion: "1"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: pem, SignerName: SignerName, Username: "system:node:x", Groups: []string{"system:nodes"},
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(csr.DeepCopy()).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if review, ok := obj.(*authorizationv1.SubjectAccessReview); ok {
				// The requester may create its own client certificate
				// (the fake API server has no authorizer).
				review.Status.Allowed = true
				return nil
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	require.NoError(t, machines.AddNodeNameIndex(context.Background(), indexerOf{b}))
	cs := k8sfake.NewClientset(csr.DeepCopy())
	eng := &approvingEngine{}
	r := &Reconciler{
		Client: b.Build(), Clientset: cs, Engine: eng, LocalClusters: &cluster.Local{},
		RecheckInterval: time.Second, MaxRecheckInterval: time.Minute, Clock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0)),
	}
	return &recordFixture{r: r, cs: cs, eng: eng, req: reconcile.Request{NamespacedName: types.NamespacedName{Name: "csr-c"}}}
}

// An approval whose write was applied and answered with a timeout is
// recorded, once, when the request shows it: before, the retry found the
// request decided and recorded nothing. The cache here never shows the
// write, so the look reads the request from the API server.
func TestAnApprovalOfUnknownOutcomeIsRecordedOnceItShows(t *testing.T) {
	f := newRecordFixture(t)
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	answered := false
	f.cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		if answered {
			return false, nil, nil
		}
		answered = true
		written := a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).DeepCopy()
		written.ResourceVersion = "2"
		if err := f.cs.Tracker().Update(gvr, written, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewTimeoutError("the write's answer", 1)
	})
	ctx := context.Background()
	_, err := f.r.Reconcile(ctx, f.req)
	require.True(t, apierrors.IsTimeout(err), "a write answered with a timeout is no success: %v", err)
	assert.Empty(t, f.eng.outcomes())

	for range 3 {
		_, err = f.r.Reconcile(ctx, f.req)
		require.NoError(t, err)
	}
	assert.Equal(t, []string{testDecision + " observed"}, f.eng.outcomes(), "the approval in effect is not recorded once")
}

// A record the decision log refuses is tried again, and then recorded once.
func TestARefusedRecordOfAnApprovalIsTriedAgain(t *testing.T) {
	f := newRecordFixture(t)
	f.eng.refuse = true
	ctx := context.Background()
	res, err := f.r.Reconcile(ctx, f.req)
	require.NoError(t, err)
	assert.Equal(t, recordRetry, res.RequeueAfter, "a refused record is not tried again")
	live, err := f.cs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-c", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, live.Status.Conditions, "not approved")

	f.eng.mu.Lock()
	f.eng.refuse = false
	f.eng.mu.Unlock()
	for range 3 {
		res, err = f.r.Reconcile(ctx, f.req)
		require.NoError(t, err)
	}
	assert.Zero(t, res.RequeueAfter)
	assert.Equal(t, []string{testDecision + " written"}, f.eng.outcomes(), "not the record of what it wrote, once")
}

// A write the API server refused was not applied: nothing is recorded for
// it, and the request is read from the cache as before.
func TestARefusedApprovalIsNotUncertain(t *testing.T) {
	f := newRecordFixture(t)
	f.cs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(certificatesv1.Resource("certificatesigningrequests"), "csr-c", errors.New("RBAC"))
	})
	_, err := f.r.Reconcile(context.Background(), f.req)
	require.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.False(t, f.r.unrecorded.Has(requestKey{name: "csr-c", uid: "uid-c"}))
}

// A record owed (an approval written, its record refused) is made even when
// the request is deleted before the cache shows the approval, or made again
// under its name (bootstrap requests are named after their key and
// subject) before this approver looked (review 17).
func TestARecordOwedIsMadeWhenTheRequestIsGoneOrMadeAgain(t *testing.T) {
	for _, how := range []string{"deleted", "made again"} {
		t.Run(how, func(t *testing.T) {
			f := newRecordFixture(t)
			f.eng.refuse = true
			ctx := context.Background()
			_, err := f.r.Reconcile(ctx, f.req)
			require.NoError(t, err)
			f.eng.mu.Lock()
			f.eng.refuse = false
			f.eng.mu.Unlock()
			switch how {
			case "deleted":
				// The API server has deleted it; the cache does not show it
				// yet, then does.
				require.NoError(t, f.cs.CertificatesV1().CertificateSigningRequests().Delete(ctx, "csr-c", metav1.DeleteOptions{}))
				_, err = f.r.Reconcile(ctx, f.req)
				require.NoError(t, err)
				require.NoError(t, f.r.Client.Delete(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-c"}}))
			case "made again":
				var old certificatesv1.CertificateSigningRequest
				require.NoError(t, f.r.Client.Get(ctx, client.ObjectKey{Name: "csr-c"}, &old))
				require.NoError(t, f.r.Client.Delete(ctx, &old))
				again := old.DeepCopy()
				again.ResourceVersion, again.UID, again.Status = "", "uid-c2", certificatesv1.CertificateSigningRequestStatus{}
				require.NoError(t, f.r.Client.Create(ctx, again))
				require.NoError(t, f.cs.CertificatesV1().CertificateSigningRequests().Delete(ctx, "csr-c", metav1.DeleteOptions{}))
				_, err = f.cs.CertificatesV1().CertificateSigningRequests().Create(ctx, again, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			_, err = f.r.Reconcile(ctx, f.req)
			require.NoError(t, err)
			assert.Equal(t, 1, f.eng.recordsOf("uid-c"), "the record owed was not made once")
			assert.False(t, f.r.unrecorded.Has(requestKey{name: "csr-c", uid: "uid-c"}))
		})
	}
}

// recordsOf counts the records made of the request of that uid.
func (e *approvingEngine) recordsOf(uid string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, a := range e.records {
		if a.UID == uid {
			n++
		}
	}
	return n
}

// An approval on the wire when the manager stops is finished and recorded:
// no replica records a verdict of another's here, so a write cut short that
// the API server applied would be in effect without its record. A stop
// before the write begins writes nothing.
func TestAnApprovalInFlightWhenTheManagerStopsIsFinishedAndRecorded(t *testing.T) {
	f := newRecordFixture(t)
	held := approvaltest.NewHeld()
	f.r.Clientset = held.Clientset(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.r.Reconcile(ctx, f.req)
		done <- err
	}()
	select {
	case <-held.Sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the approval was not sent")
	}
	stop()
	require.Never(t, func() bool { return held.Cut() > 0 }, 200*time.Millisecond, time.Millisecond, "the stop cut the write short")
	held.Answer()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the reconcile did not return")
	}
	require.NoError(t, err)
	assert.Equal(t, []string{testDecision + " written"}, f.eng.outcomes(), "the approval applied is not recorded")

	// Stopped before it begins: nothing written, nothing recorded.
	g := newRecordFixture(t)
	g.r.Clientset = f.r.Clientset
	_, err = g.r.Reconcile(ctx, g.req)
	require.NoError(t, err)
	assert.Equal(t, int64(1), held.Writes(), "written after the stop")
	assert.Empty(t, g.eng.outcomes())
}

// A request another writer decided between the read and the write
// (kube-controller-manager's approver beside Ichor, a person, the leader
// before) is theirs: losing that race is no reconcile error, so nothing is
// logged as one, counted in controller_runtime_reconcile_errors_total or
// tried again with backoff, and nothing is recorded applied (review 177).
func TestARequestDecidedByAnotherWriterMeanwhileIsNoError(t *testing.T) {
	f := newRecordFixture(t)
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	f.cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		theirs := a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).DeepCopy()
		theirs.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
			Type: certificatesv1.CertificateApproved, Status: "True", Reason: "AutoApproved",
			Message: "Auto approving kubelet client certificate after SubjectAccessReview.",
		}}
		if err := f.cs.Tracker().Update(gvr, theirs, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(gvr.GroupResource(), theirs.Name, errors.New("the object has been modified"))
	})
	res, err := f.r.Reconcile(context.Background(), f.req)
	require.NoError(t, err, "losing the race to another approver is reported as a failure")
	assert.Zero(t, res.RequeueAfter)
	assert.Empty(t, f.eng.outcomes(), "a verdict not written is recorded applied")
}
