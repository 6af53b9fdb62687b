package kubeletserving

import (
	"context"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// A request another pass holds (another cluster's full pass looking at every
// request of the API server, which decides none of this cluster's) is looked
// at again by this cluster soon, not left until some later event.
func TestARequestHeldByAnotherPassIsLookedAtAgain(t *testing.T) {
	r := &Reconciler{work: newWorkers(2)}
	p := &pass{r: r, cluster: &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo"}}, now: time.Now()}
	csr := csrOf("system:node:worker-1", "csr-a", time.Unix(1_000_000, 0))
	csr.UID = "uid-a"
	if !r.work.claim(csr.UID) {
		t.Fatal("claim")
	}

	p.dispatch(context.Background(), []certificatesv1.CertificateSigningRequest{csr}, time.Second)

	if got := p.pendingCount(); got != 1 {
		t.Errorf("pending %d, want 1", got)
	}
	if got := p.result().RequeueAfter; got != busyRequesterRecheck {
		t.Errorf("requeue after %v, want %v", got, busyRequesterRecheck)
	}
	if got := len(r.work.slots); got != 0 {
		t.Errorf("%d worker slots still taken", got)
	}
}
