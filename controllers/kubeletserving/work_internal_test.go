package kubeletserving

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/kube"
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

// A pass whose decisions outlived it (a node that hangs past PassWait) still
// asks for its own next look as its requeue: its conditions' wake-ups (one a
// machine, at its certificate's expiry) are not timers that outlive it, and
// only its decisions' retries are wake-ups. Before: one timer and one
// TalosCluster a certified machine per such pass, each kept until the
// certificate's expiry, a year; a node that kept hanging made such a pass
// about every 13 s (a 10 s read, then the 3 s recheck).
func TestADetachedPassAsksForItsOwnNextLookAsARequeue(t *testing.T) {
	ctx := context.Background()
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo"}}
	cluster.Spec.Security.KubeletServingCertificates.Enabled = true
	objs := []client.Object{cluster}
	expiry := time.Now().Add(365 * 24 * time.Hour)
	for _, name := range []string{"node-1", "node-2", "node-3"} {
		m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		m.Spec.ClusterName, m.Spec.Hostname = "demo", name
		m.Status.KubeletServingCertificate = &ichorv1alpha1.KubeletServingCertificateStatus{Request: "csr-" + name, NotAfter: metav1.NewTime(expiry)}
		objs = append(objs, m)
	}
	scheme, err := kube.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(cluster)
	if err := AddIndexes(ctx, indexerOf{b}); err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Client: b.Build(), work: newWorkers(1)}
	p := &pass{r: r, cluster: cluster.DeepCopy(), now: time.Now()}
	p.detach()

	if err := r.updateConditions(ctx, cluster, p); err != nil {
		t.Fatal(err)
	}
	if got := r.work.pendingKicks(); got != 0 {
		t.Errorf("%d wake-up timers pending after the conditions, want none", got)
	}
	if got := p.result().RequeueAfter; got < 364*24*time.Hour {
		t.Errorf("requeue after %v, want the certificates' expiry, a year", got)
	}
	// A decision still running asks for a look: a wake-up of the cluster.
	t.Cleanup(func() { r.work.cancelWakeUp(p.key()) })
	p.retryIn(time.Minute, nil)
	if got := r.work.pendingKicks(); got != 1 {
		t.Errorf("%d wake-up timers pending after a decision's retry, want 1", got)
	}
}

// The decisions that outlive their pass wake their cluster once, at the
// earliest time any of them asked for: however many ask, a cluster has at
// most one wake-up timer. It carries every request asked for, marked dirty
// before the kick, so that the reconcile it starts looks at each of them
// (and one whose wait is not over asks again), even when events have marked
// others meanwhile. A wake-up for no request in particular is owed a full
// pass.
func TestTheWakeUpsOfDetachedDecisionsAreOneTimerACluster(t *testing.T) {
	w := newWorkers(1)
	dirty := &dirtySet{}
	w.owe = dirty.owe
	demo := types.NamespacedName{Namespace: "ns", Name: "demo"}
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	want := map[string]bool{}
	for i := range 1000 {
		name := fmt.Sprintf("csr-%d", i)
		w.kickAfter(demo, time.Hour+time.Duration(i)*time.Second, name)
		want[name] = true
	}
	w.kickAfter(other, time.Hour, "")
	if got := w.pendingKicks(); got != 2 {
		t.Fatalf("%d wake-up timers pending, want 2 (one a cluster)", got)
	}
	// An event marked another request of demo meanwhile.
	dirty.add(demo, "csr-event")
	want["csr-event"] = true

	// An earlier one replaces the later and takes its requests over.
	w.kickAfter(demo, 10*time.Millisecond, "csr-early")
	want["csr-early"] = true
	select {
	case e := <-w.kicks:
		if e.Object.GetName() != "demo" || e.Object.GetNamespace() != "ns" {
			t.Errorf("woke %s/%s, want ns/demo", e.Object.GetNamespace(), e.Object.GetName())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the earlier wake-up did not come")
	}
	if got := w.pendingKicks(); got != 1 {
		t.Fatalf("%d wake-up timers pending after demo's came, want 1 (other's)", got)
	}
	dirty.mu.Lock()
	got := maps.Clone(dirty.m[demo].csrs)
	full := dirty.m[demo].full
	dirty.mu.Unlock()
	if !maps.Equal(got, want) || full {
		t.Errorf("demo's wake-up marked %d requests (full pass %v), want the %d asked for and the event's, no full pass", len(got), full, len(want))
	}
	// A later one after it came is scheduled anew, and a gone cluster's is
	// stopped.
	w.kickAfter(demo, time.Hour, "csr-late")
	if got := w.pendingKicks(); got != 2 {
		t.Errorf("%d wake-up timers pending, want 2", got)
	}
	w.cancelWakeUp(demo)
	if got := w.pendingKicks(); got != 1 {
		t.Errorf("%d wake-up timers pending after demo's was cancelled, want 1", got)
	}
	// One for the whole cluster is owed a full pass.
	w.kickAfter(other, 10*time.Millisecond, "")
	select {
	case <-w.kicks:
	case <-time.After(5 * time.Second):
		t.Fatal("other's wake-up did not come")
	}
	dirty.mu.Lock()
	defer dirty.mu.Unlock()
	if !dirty.m[other].full {
		t.Error("a wake-up for the whole cluster is not owed a full pass")
	}
}

// A wake-up whose kick the full channel drops still marks its requests: the
// cluster's next reconcile (its requeue, the resync at the latest) looks at
// them.
func TestAWakeUpWhoseKickIsDroppedStillMarksItsRequests(t *testing.T) {
	w := newWorkers(1)
	dirty := &dirtySet{}
	w.owe = dirty.owe
	for range cap(w.kicks) {
		w.kicks <- event.GenericEvent{}
	}
	demo := types.NamespacedName{Namespace: "ns", Name: "demo"}
	w.kickAfter(demo, time.Millisecond, "csr-a")

	deadline := time.Now().Add(5 * time.Second)
	for {
		dirty.mu.Lock()
		marked := dirty.m[demo] != nil && dirty.m[demo].csrs["csr-a"]
		dirty.mu.Unlock()
		if marked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the wake-up did not mark csr-a")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := len(w.kicks), cap(w.kicks); got != want {
		t.Errorf("%d kicks queued, want %d: the full channel takes none", got, want)
	}
}

// pendingKicks is the number of wake-up timers not yet fired.
func (w *workers) pendingKicks() int {
	w.wakeMu.Lock()
	defer w.wakeMu.Unlock()
	return len(w.wakeUps)
}
