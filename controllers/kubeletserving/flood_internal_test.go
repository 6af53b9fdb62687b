package kubeletserving

import (
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func csrOf(user, name string, created time.Time) certificatesv1.CertificateSigningRequest {
	return certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Username: user, SignerName: certificatesv1.KubeletServingSignerName},
	}
}

func TestRequestsAreGroupedByRequesterOldestFirst(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var csrs []certificatesv1.CertificateSigningRequest
	for i := range 4 {
		// Listed newest first, as a cache may list them.
		csrs = append(csrs, csrOf("system:node:flood", string(rune('d'-i)), t0.Add(time.Duration(3-i)*time.Second)))
	}
	csrs = append(csrs, csrOf("system:node:calm", "z", t0.Add(10*time.Second)))

	var got []string
	for _, group := range byRequester(csrs) {
		for _, c := range group {
			got = append(got, c.Spec.Username[len("system:node:"):]+"/"+c.Name)
		}
		got = append(got, "|")
	}
	want := []string{"calm/z", "|", "flood/a", "flood/b", "flood/c", "flood/d", "|"}
	if len(got) != len(want) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("groups %v, want %v: one group a requester, its oldest first", got, want)
		}
	}
}

func TestNewerBreaksTiesByName(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	a, b := csrOf("u", "csr-a", t0), csrOf("u", "csr-b", t0)
	if !newer(&b, &a) || newer(&a, &b) {
		t.Fatal("within one second, the name orders the requests")
	}
	c := csrOf("u", "csr-0", t0.Add(time.Second))
	if !newer(&c, &b) {
		t.Fatal("a later second is newer, whatever the name")
	}
}

func TestOnlyUndecidedKubeletServingRequestsAreCounted(t *testing.T) {
	c := csrOf("system:node:x", "a", time.Unix(0, 0))
	if got := undecidedKeys(&c); !slices.Equal(got, []string{undecidedAll, "user:system:node:x", "made-by:system:node:x"}) {
		t.Fatalf("keys %v", got)
	}
	approved := c
	approved.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved}}
	denied := c
	denied.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied}}
	issued := c
	issued.Status.Certificate = []byte("x")
	for name, csr := range map[string]*certificatesv1.CertificateSigningRequest{"approved": &approved, "denied": &denied, "issued": &issued} {
		if got := undecidedKeys(csr); !slices.Equal(got, []string{"made-by:system:node:x"}) {
			t.Fatalf("%s: keys %v, want only the requester's: it still counts as newer than an older request", name, got)
		}
	}
	other := c
	other.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	if got := undecidedKeys(&other); got != nil {
		t.Fatalf("another signer: keys %v, want none", got)
	}
}

// A wake-up a pass asked for survives the dirty passes that come before it
// (the queue keeps one entry a key), and a stream of dirty passes does not
// put off the full pass beyond the resync interval.
func TestAWakeUpIsNotLostToTheDirtyPassesBeforeIt(t *testing.T) {
	var d dirtySet
	key := types.NamespacedName{Namespace: "ns", Name: "demo"}
	t0 := time.Unix(1_000_000, 0)
	resync := time.Minute

	if w := d.take(key, t0, resync); !w.full {
		t.Fatal("the first pass is a full one")
	}
	if got := d.requeue(key, t0, 5*time.Second); got.RequeueAfter != 5*time.Second {
		t.Fatalf("requeue %v, want 5s", got.RequeueAfter)
	}
	d.add(key, "csr-a")
	w := d.take(key, t0.Add(time.Second), resync)
	if w.full || !w.csrs["csr-a"] {
		t.Fatalf("an event before the wake-up is a dirty pass: %+v", w)
	}
	if got := d.requeue(key, t0.Add(time.Second), 0); got.RequeueAfter != 4*time.Second {
		t.Fatalf("the dirty pass passes the wake-up on: requeue %v, want 4s", got.RequeueAfter)
	}
	d.add(key, "csr-b")
	if w := d.take(key, t0.Add(5*time.Second), resync); !w.full {
		t.Fatal("once the wake-up is due the pass is a full one, events or not")
	}
	if got := d.requeue(key, t0.Add(5*time.Second), 0); got.RequeueAfter != 0 {
		t.Fatalf("nothing asked for: requeue %v", got.RequeueAfter)
	}

	// Events every second for longer than the resync interval.
	now := t0.Add(5 * time.Second)
	fulls := 0
	for range 130 {
		now = now.Add(time.Second)
		d.add(key, "csr-c")
		if d.take(key, now, resync).full {
			fulls++
		}
	}
	if fulls != 2 {
		t.Fatalf("%d full passes in 130 s of events, want one a resync interval (2)", fulls)
	}
}
