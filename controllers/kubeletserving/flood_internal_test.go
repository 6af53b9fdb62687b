package kubeletserving

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
)

func csrOf(user, name string, created time.Time) certificatesv1.CertificateSigningRequest {
	return certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       certificatesv1.CertificateSigningRequestSpec{Username: user, SignerName: certificatesv1.KubeletServingSignerName},
	}
}

// A requester's requests are listed oldest first (the name breaks a tie),
// and only that requester's.
func TestARequestersRequestsAreListedOldestFirst(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var csrs []certificatesv1.CertificateSigningRequest
	for i := range 4 {
		// Created newest first, as a cache may list them.
		csrs = append(csrs, csrOf("system:node:flood", string(rune('d'-i)), t0.Add(time.Duration(3-i)*time.Second)))
	}
	csrs = append(csrs, csrOf("system:node:flood", "0", t0.Add(3*time.Second)), csrOf("system:node:calm", "z", t0))
	f := newQueueFixture(t, clock.RealClock{}, csrs...)
	p, ok, err := f.r.passFor(context.Background(), f.cluster)
	require.NoError(t, err)
	require.True(t, ok)
	list, err := p.requestsOf(context.Background(), "system:node:flood")
	require.NoError(t, err)
	var got []string
	for _, c := range list {
		got = append(got, c.Name)
	}
	assert.Equal(t, []string{"a", "b", "c", "0", "d"}, got)
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
