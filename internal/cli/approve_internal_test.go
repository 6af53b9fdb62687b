package cli

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A person's decision is written on the version of the request that was
// read: one the manager decided since, or a request deleted and made again
// under the name, conflicts, and is not decided twice (review 172: nothing
// tested that the version reached the write).
func TestAManualDecisionIsWrittenOnTheVersionRead(t *testing.T) {
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-1", ResourceVersion: "7"},
		Spec:       certificatesv1.CertificateSigningRequestSpec{SignerName: certificatesv1.KubeletServingSignerName},
	}
	cs := k8sfake.NewClientset(csr)
	var written string
	cs.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "approval" {
			return false, nil, nil
		}
		written = a.(k8stesting.UpdateAction).GetObject().(*certificatesv1.CertificateSigningRequest).ResourceVersion
		return true, nil, apierrors.NewConflict(certificatesv1.Resource("certificatesigningrequests"), "csr-1", nil)
	})
	err := manualDecision{approve: true, reason: ManualApprovalReason, message: "checked by hand"}.decide(context.Background(), cs, "csr-1", "ada")
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), "%v", err)
	assert.Equal(t, "7", written, "the write did not carry the version read")
}
