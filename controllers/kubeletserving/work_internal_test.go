package kubeletserving

import (
	"context"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// A requester's requests are decided oldest first: when another pass holds
// one of them, the newer ones are left for the next look too, not decided
// ahead of it (the rule counts each one's newer requests).
func TestTheRequestsAfterOneHeldByAnotherPassWaitForIt(t *testing.T) {
	r := &Reconciler{work: newWorkers(2)}
	p := &pass{r: r, cluster: &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo"}}, now: time.Now()}
	t0 := time.Unix(1_000_000, 0)
	var csrs []certificatesv1.CertificateSigningRequest
	for i, name := range []string{"csr-old", "csr-held", "csr-new"} {
		csr := csrOf("system:node:worker-1", name, t0.Add(time.Duration(i)*time.Second))
		csr.UID = types.UID("uid-" + name)
		csrs = append(csrs, csr)
	}
	// The oldest is of another signer, which handle leaves alone at once.
	csrs[0].Spec.SignerName = "example.com/other"
	if !r.work.claim(csrs[1].UID) {
		t.Fatal("claim")
	}

	p.dispatch(context.Background(), csrs, time.Second)

	if got := p.pendingCount(); got != 2 {
		t.Errorf("pending %d, want 2: the held request and the newer one", got)
	}
	if got := p.result().RequeueAfter; got != busyRequesterRecheck {
		t.Errorf("requeue after %v, want %v", got, busyRequesterRecheck)
	}
	if !r.work.claim(csrs[2].UID) {
		t.Error("the newer request was claimed and not released")
	}
	if !r.work.claim(csrs[0].UID) {
		t.Error("the oldest request was not released after it was handled")
	}
}
