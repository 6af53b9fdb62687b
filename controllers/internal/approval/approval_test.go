package approval_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
)

// A pure unit test of what is written: the approvers' tests against the real
// API server show the writes at work.
func TestApproveAndDenyWriteOneConditionOnTheVersionDecidedOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(context.Context, *fake.Clientset, *certificatesv1.CertificateSigningRequest) error
		want  certificatesv1.RequestConditionType
	}{
		{"approve", func(ctx context.Context, cs *fake.Clientset, csr *certificatesv1.CertificateSigningRequest) error {
			return approval.Approve(ctx, cs, csr, "IchorKubeletServing", "matches", start)
		}, certificatesv1.CertificateApproved},
		{"deny", func(ctx context.Context, cs *fake.Clientset, csr *certificatesv1.CertificateSigningRequest) error {
			return approval.Deny(ctx, cs, csr, "IchorKubeletServing", "matches", start)
		}, certificatesv1.CertificateDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", ResourceVersion: "7"}}
			cs := fake.NewClientset(csr)
			var sent *certificatesv1.CertificateSigningRequest
			cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "approval" {
					sent = a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest)
				}
				return false, nil, nil
			})
			require.NoError(t, tc.write(context.Background(), cs, csr))

			require.NotNil(t, sent, "written through the approval subresource")
			assert.Equal(t, "7", sent.ResourceVersion, "on the version decided on, so a change since conflicts")
			require.Len(t, sent.Status.Conditions, 1)
			c := sent.Status.Conditions[0]
			assert.Equal(t, tc.want, c.Type)
			assert.Equal(t, corev1.ConditionTrue, c.Status)
			assert.Equal(t, "IchorKubeletServing", c.Reason)
			assert.Equal(t, "matches", c.Message)
			assert.True(t, c.LastUpdateTime.Time.Equal(start))
			assert.Empty(t, csr.Status.Conditions, "the cached object is not changed")
			assert.Equal(t, tc.want == certificatesv1.CertificateApproved, approval.IsApproved(sent))
			assert.True(t, approval.IsDecided(sent))
			assert.False(t, approval.IsDecided(csr))
		})
	}
}

func TestAWriteThatConflictsSaysWhichRequestAndKeepsTheCause(t *testing.T) {
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", ResourceVersion: "7"}}
	cs := fake.NewClientset(csr)
	conflict := apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, "csr-a", errors.New("the object has been modified"))
	cs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, conflict
	})
	err := approval.Deny(context.Background(), cs, csr, "SANMissing", "no names", time.Now())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "deny CSR csr-a")
	assert.True(t, apierrors.IsConflict(err), "the API error is wrapped, so callers can tell a conflict")
}

// conflictOnce answers the first approval write with 409, as when the request
// changed since it was read, and counts the writes.
func conflictOnce(cs *fake.Clientset, writes *int) {
	cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "approval" {
			return false, nil, nil
		}
		*writes++
		if *writes == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, "csr-a", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
}

// A conflict is not a failure: the request is read again and, undecided, the
// verdict is written on it at once.
func TestAConflictedWriteIsWrittenAgainOnTheRequestAsItIsNow(t *testing.T) {
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", UID: "u-1", ResourceVersion: "7"}}
	live := csr.DeepCopy()
	live.ResourceVersion = "8"
	live.Annotations = map[string]string{"changed": "by someone"}
	cs := fake.NewClientset(live)
	writes := 0
	conflictOnce(cs, &writes)
	require.NoError(t, approval.Approve(context.Background(), cs, csr, "IchorKubeletServing", "matches", start))
	assert.Equal(t, 2, writes)
	got, err := cs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr-a", metav1.GetOptions{})
	require.NoError(t, err)
	require.Len(t, got.Status.Conditions, 1)
	assert.True(t, approval.IsApproved(got))
	assert.Equal(t, "by someone", got.Annotations["changed"], "written on the request as read again")
}

// A conflict because someone else decided the request meanwhile writes
// nothing more, and says so; a request of the same name that is another one
// is not written either.
func TestAConflictedWriteIsNotWrittenAgainOnARequestDecidedOrReplaced(t *testing.T) {
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", UID: "u-1", ResourceVersion: "7"}}
	decided := csr.DeepCopy()
	decided.ResourceVersion = "8"
	decided.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "ByAPerson"}}
	replaced := csr.DeepCopy()
	replaced.UID, replaced.ResourceVersion = "u-2", "9"
	for _, tc := range []struct {
		name string
		live *certificatesv1.CertificateSigningRequest
		want string
	}{
		{"decided meanwhile", decided, "decided by another writer meanwhile"},
		{"another request of the name", replaced, "it is another request now (uid u-2, decided on u-1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(tc.live)
			writes := 0
			conflictOnce(cs, &writes)
			err := approval.Approve(context.Background(), cs, csr, "IchorKubeletServing", "matches", start)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "approve CSR csr-a: ")
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, tc.live == decided, errors.Is(err, approval.ErrDecidedMeanwhile))
			assert.Equal(t, 1, writes, "nothing written after the conflict")
			got, err := cs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "csr-a", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.live.Status.Conditions, got.Status.Conditions)
		})
	}
}

// A write answered with an error that does not say the API server refused
// it may have been applied: it is an UnknownOutcome naming the version it
// was made on (the last try's, after a conflict), with its cause kept. One
// the server refused is not.
func TestAWriteOfUnknownOutcomeSaysTheVersionItWasMadeOn(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}
	for name, tc := range map[string]struct {
		err     error
		unknown bool
	}{
		"a 504":             {err: apierrors.NewTimeoutError("the answer", 1), unknown: true},
		"a 500":             {err: apierrors.NewInternalError(errors.New("etcd")), unknown: true},
		"a 408":             {err: apierrors.NewGenericServerResponse(408, "PUT", gr, "csr-a", "", 0, false), unknown: true},
		"a lost connection": {err: errors.New("connection reset by peer"), unknown: true},
		"a 403":             {err: apierrors.NewForbidden(gr, "csr-a", errors.New("RBAC")), unknown: false},
		"a 429":             {err: apierrors.NewTooManyRequests("slow down", 1), unknown: false},
		"a 404":             {err: apierrors.NewNotFound(gr, "csr-a"), unknown: false},
	} {
		t.Run(name, func(t *testing.T) {
			csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", UID: "u-1", ResourceVersion: "7"}}
			live := csr.DeepCopy()
			live.ResourceVersion = "8"
			cs := fake.NewClientset(live)
			writes := 0
			cs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
				writes++
				if writes == 1 {
					// The first try conflicts: the second is made on the
					// request as it is now.
					return true, nil, apierrors.NewConflict(gr, "csr-a", errors.New("the object has been modified"))
				}
				return true, nil, tc.err
			})
			err := approval.Approve(context.Background(), cs, csr, "Test", "test", time.Now())
			require.Error(t, err)
			require.Equal(t, 2, writes)
			var unknown *approval.UnknownOutcome
			require.Equal(t, tc.unknown, errors.As(err, &unknown), "%v", err)
			assert.ErrorIs(t, err, tc.err, "the cause is not kept")
			if tc.unknown {
				assert.Equal(t, "8", unknown.ResourceVersion, "not the version of the try that failed")
			}
		})
	}
}

// Review 16, L1: a write client-go sends again by itself (a 5xx with
// Retry-After, as a proxy in front of the API server may answer) after its
// first try was applied meets a conflict, and the request read again
// carries this very condition: written, not "decided by another writer
// meanwhile", which left the verdict in effect without its record.
func TestAWriteAppliedByAnEarlierTryIsWritten(t *testing.T) {
	var mu sync.Mutex
	stored := &certificatesv1.CertificateSigningRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "CertificateSigningRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: "csr-a", UID: "u1", ResourceVersion: "7"},
	}
	puts := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		status := func(code int32, reason metav1.StatusReason) {
			w.WriteHeader(int(code))
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Code: code, Reason: reason})
		}
		switch r.Method {
		case http.MethodPut:
			puts++
			var in certificatesv1.CertificateSigningRequest
			if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
				status(http.StatusBadRequest, metav1.StatusReasonBadRequest)
				return
			}
			if in.ResourceVersion != stored.ResourceVersion {
				status(http.StatusConflict, metav1.StatusReasonConflict)
				return
			}
			// Applied, and answered as a proxy may after an upstream
			// hiccup.
			stored.Status = in.Status
			stored.ResourceVersion = "8"
			w.Header().Set("Retry-After", "1")
			status(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable)
		case http.MethodGet:
			_ = json.NewEncoder(w).Encode(stored)
		}
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"}})
	require.NoError(t, err)

	message := "ok (decision 01234567-89ab-cdef-0123-456789abcdef, policy revision r)"
	require.NoError(t, approval.Approve(context.Background(), cs, stored.DeepCopy(), "IchorKubeletServing", message, time.Now()))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 2, puts, "client-go did not send the write again")
	require.Len(t, stored.Status.Conditions, 1)

	// Another writer's verdict is still another's.
	other := stored.DeepCopy()
	other.Status.Conditions = nil
	other.ResourceVersion = "7"
	stored.Status.Conditions[0].Message = "by hand"
	stored.ResourceVersion = "9"
	mu.Unlock()
	err = approval.Approve(context.Background(), cs, other, "IchorKubeletServing", message, time.Now())
	mu.Lock()
	assert.ErrorIs(t, err, approval.ErrDecidedMeanwhile)
}

// The decision a condition names is read from its tail, which the approver
// writes: the reasons before it quote what a requester wrote (a node name
// from the request's subject), and a requester may write "(decision ..."
// there (review 17).
func TestTheDecisionOfAConditionIsItsTails(t *testing.T) {
	const ours = "0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c"
	const forged = "ffffffff-ffff-ffff-ffff-ffffffffffff"
	for name, tc := range map[string]struct {
		message string
		want    string
	}{
		"an approver's":       {message: "NodeIdentityMatches: ok (decision " + ours + ", policy revision sha256:4181216f)", want: ours},
		"no revision":         {message: "ok (decision " + ours + ", policy revision )", want: ours},
		"a forged one before": {message: `UsernameMismatch: CN "system:node:x (decision ` + forged + `, policy revision " is not the requester (decision ` + ours + `, policy revision r)`, want: ours},
		"a forged one alone":  {message: `approved by hand: "x (decision ` + forged + `, policy revision r)" and more`},
		"a person's":          {message: "This CSR was approved by kubectl certificate approve."},
		"an id that is none":  {message: "ok (decision 0b5c6f1e-zzzz-4a53-9d7e-0c7f7f9a1b2c, policy revision r)"},
		"a person's quoting one after": {
			// The webhook lets a person write this (it does not end as an
			// approver's), and the watch records it as theirs: the
			// approvers must not read a decision in it either.
			message: "same as (decision " + ours + ", policy revision r) (INC-42)",
		},
	} {
		t.Run(name, func(t *testing.T) {
			csr := &certificatesv1.CertificateSigningRequest{Status: certificatesv1.CertificateSigningRequestStatus{
				Conditions: []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Message: tc.message}},
			}}
			d, ok := approval.DecisionOf(csr)
			assert.Equal(t, tc.want != "", ok)
			assert.Equal(t, tc.want, d.ID)
			if ok {
				assert.Equal(t, "deny", d.Action)
			}
		})
	}
}
