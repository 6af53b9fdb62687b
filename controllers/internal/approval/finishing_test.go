package approval_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/ichor-policy/controllers/internal/approval"
)

// A write begun before the stop is not cut short by it, only grace after
// it; ended by its own cancel, it leaves nothing running.
func TestAFinishingWriteOutlivesTheStopForItsGrace(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel := approval.Finishing(parent, time.Second)
	defer cancel()
	stop()
	require.Never(t, func() bool { return ctx.Err() != nil }, 100*time.Millisecond, time.Millisecond, "cut short by the stop")
	require.Eventually(t, func() bool { return ctx.Err() != nil }, 10*time.Second, time.Millisecond, "not ended after its grace")

	parent, stop = context.WithCancel(context.Background())
	defer stop()
	ctx, cancel = approval.Finishing(parent, time.Hour)
	cancel()
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
}

// A write that conflicts once the manager was told to stop is not made
// again (another leader may be deciding the request by now): it was not
// applied, and says so. The request is read first all the same: a conflict
// that is this very write, applied by an earlier try whose answer was lost,
// is written (review 20, M1).
func TestAWriteAfterTheStopIsNotTriedAgainOnAConflict(t *testing.T) {
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", UID: "u1", ResourceVersion: "7"}}
	for _, stopped := range []bool{false, true} {
		cs := fake.NewClientset(csr.DeepCopy())
		updates := 0
		cs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
			updates++
			if updates == 1 {
				return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, "csr-a", errors.New("the object has been modified"))
			}
			return false, nil, nil
		})
		parent, stop := context.WithCancel(context.Background())
		ctx, cancel := approval.Finishing(parent, time.Minute)
		if stopped {
			stop()
		}
		err := approval.Approve(ctx, cs, csr.DeepCopy(), "IchorKubeletServing", "ok", time.Now())
		cancel()
		stop()
		if !stopped {
			require.NoError(t, err)
			assert.Equal(t, 2, updates, "a conflict before the stop is not tried again")
			continue
		}
		require.Error(t, err)
		assert.Equal(t, 1, updates, "tried again after a conflict once the manager was told to stop")
		var unknown *approval.UnknownOutcome
		assert.False(t, errors.As(err, &unknown), "a conflicted write not made again counts as maybe applied: %v", err)
	}

	// Applied by the first try, whose answer was lost; the second conflicts.
	cs := fake.NewClientset(csr.DeepCopy())
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	updates := 0
	cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		updates++
		if updates == 1 {
			written := a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).DeepCopy()
			written.ResourceVersion = "8"
			if err := cs.Tracker().Update(gvr, written, ""); err != nil {
				return true, nil, err
			}
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, "csr-a", errors.New("the object has been modified"))
	})
	parent, stop := context.WithCancel(context.Background())
	stop()
	ctx, cancel := approval.Finishing(parent, time.Minute)
	defer cancel()
	require.NoError(t, approval.Approve(ctx, cs, csr.DeepCopy(), "IchorKubeletServing", "ok", time.Now()), "the write applied is not written")
	assert.Equal(t, 1, updates, "written again after the stop")
}

// A write whose try after a conflict ends with its context (a timeout, a
// cancel: the API server may still apply it) is of unknown outcome, not the
// conflict before it, which client-go's retry hands back in its place; so is
// one whose request cannot be read again after the conflict, which may be
// this very write, applied by an earlier try (review 21, M1).
func TestAWriteCutShortAfterAConflictIsOfUnknownOutcome(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, "csr-a", errors.New("the object has been modified"))
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-a", UID: "u1", ResourceVersion: "7"}}
	for _, cause := range []error{context.DeadlineExceeded, context.Canceled} {
		cs := fake.NewClientset(csr.DeepCopy())
		updates := 0
		cs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
			updates++
			if updates == 1 {
				return true, nil, conflict
			}
			return true, nil, &url.Error{Op: "Put", URL: "https://api/x", Err: cause}
		})
		err := approval.Approve(context.Background(), cs, csr.DeepCopy(), "IchorKubeletServing", "ok", time.Now())
		var unknown *approval.UnknownOutcome
		require.True(t, errors.As(err, &unknown), "%v: a write cut short after a conflict is not of unknown outcome: %v", cause, err)
		assert.Equal(t, 2, updates)
		assert.Equal(t, "7", unknown.ResourceVersion)
	}

	cs := fake.NewClientset(csr.DeepCopy())
	cs.PrependReactor("update", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, conflict
	})
	cs.PrependReactor("get", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is slow")
	})
	err := approval.Approve(context.Background(), cs, csr.DeepCopy(), "IchorKubeletServing", "ok", time.Now())
	var unknown *approval.UnknownOutcome
	require.True(t, errors.As(err, &unknown), "a write whose request cannot be read again after a conflict is not of unknown outcome: %v", err)
	assert.Contains(t, err.Error(), "read it again after a conflict")
}
