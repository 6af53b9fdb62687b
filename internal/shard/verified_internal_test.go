package shard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// A renewal that the read from the API server is the first to show is
// noted as seen when the answer came, not when the read was sent: noted
// earlier, it would expire early by the read's latency, and a replica slow
// to hear from the API server could take the shards of one still serving
// them (review of ee75044).
func TestAMembershipReadIsNotedWhenItsAnswerCame(t *testing.T) {
	const latency = 2 * time.Second
	member := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: MemberLeaseName("b"), Namespace: "ichor-system", ResourceVersion: "7",
			Labels: map[string]string{LabelRole: roleMember, LabelShards: "4"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("b")},
	}
	client := fake.NewClientset(member)
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
	client.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		clock.Step(latency) // the read on its way
		return false, nil, nil
	})
	s, err := New(Options{Client: client, Namespace: "ichor-system", Identity: "a", Shards: 4,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Clock: clock})
	require.NoError(t, err)

	v, err := s.verified(t.Context())
	require.NoError(t, err)
	require.True(t, v.isLive["b"], "b's membership, first seen by the read")

	// A lease duration less a little after the answer (more than one
	// after the read was sent), with no renewal seen since: still live.
	clock.Step(s.o.LeaseDuration - 500*time.Millisecond)
	v, err = s.live(clock.Now(), []*coordinationv1.Lease{member})
	require.NoError(t, err)
	require.True(t, v.isLive["b"], "b expired %s after the answer", s.o.LeaseDuration-500*time.Millisecond)

	// A lease duration after the answer: gone.
	clock.Step(time.Second)
	v, err = s.live(clock.Now(), []*coordinationv1.Lease{member})
	require.NoError(t, err)
	require.False(t, v.isLive["b"])
}
