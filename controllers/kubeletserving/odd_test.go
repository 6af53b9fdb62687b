package kubeletserving_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// oddServing answers odd for the machines a test names.
func oddServing(_ context.Context, in csrinput.KubeletServing) (engine.CSRDecision, error) {
	if in.Machine == nil {
		return engine.CSRDecision{}, enginetest.ErrPass
	}
	return odd.Answer(in.Machine.Name)
}

// rejection answers odd for the machines a test names, else holds the
// machines' rejections a test holds (flood_test.go), else lets the real
// engine answer.
func rejection(ctx context.Context, in csrinput.KubeletServing) (engine.CSRDecision, error) {
	if in.Machine != nil {
		if d, err := oddRejection.Answer(in.Machine.Name); !errors.Is(err, enginetest.ErrPass) {
			return d, err
		}
	}
	return gates.hold(ctx, in)
}

// A rejection is acted on without the node's identity, so only a reasoned
// denial is: a bundle whose rejection answers an approval approves nothing,
// and the requests are decided on their merits once it answers properly.
func TestARejectionThatIsNotADenialIsNeverActedOn(t *testing.T) {
	f := newFixture(t, false)
	oddRejection.Set("odd-reject", func() (engine.CSRDecision, error) {
		return engine.CSRDecision{Action: engine.ActionApprove, Reasons: engine.Reasons{{Code: "X", Message: "x"}}, DecisionID: "d-reject"}, nil
	})
	t.Cleanup(func() { oddRejection.Set("odd-reject", nil) })
	node := nodeClient(t, "system:node:odd-reject", "system:nodes")
	// Two requests of one requester before its machine exists: each is then
	// looked at with the other undecided, so the rejection is asked first.
	var names []string
	for _, n := range []string{"csr-odd-reject-1", "csr-odd-reject-2"} {
		names = append(names, submit(t, node, n, csrgen.Request{Subject: csrgen.NodeSubject("odd-reject"), IPs: []net.IP{net.ParseIP("10.40.0.6")}}))
	}
	// The machine comes once both requests are counted as the requester's:
	// the counts follow the requests' events, which the machine's event
	// could otherwise overtake, and each request would be looked at alone.
	require.Eventually(t, func() bool {
		for _, e := range entriesFor(names[1]) {
			if e.Input.Requests != nil && e.Input.Requests.FromRequester >= 2 {
				return true
			}
		}
		return false
	}, wait, 100*time.Millisecond, "the requester's two requests were not counted together")
	f.machine("odd-reject", "10.40.0.6")

	require.Eventually(t, func() bool { return oddRejection.Asked("odd-reject") >= 2 }, wait, 100*time.Millisecond)
	for _, name := range names {
		assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "nothing is written on a rejection that does not deny")
	}

	oddRejection.Set("odd-reject", nil)
	for _, name := range names {
		c := decided(t, name)
		assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
	}
}

// A bundle that answers something the approver cannot act on (its decision
// fails, an action it does not know, a denial without a reason, an approval
// without one) holds the request undecided, is asked again with backoff,
// and the request is decided once the bundle answers properly again.
func TestAnOddAnswerOfTheBundleLeavesTheRequestUndecidedUntilItAnswersProperly(t *testing.T) {
	f := newFixture(t, false)
	for _, tc := range []struct {
		node   string
		answer func() (engine.CSRDecision, error)
	}{
		{"odd-error", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{}, errors.New("evaluate ichor/kubelet_serving/decision: builtin error")
		}},
		{"odd-action", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{Action: "maybe", Reasons: engine.Reasons{{Code: "X", Message: "x"}}, DecisionID: "d-action"}, nil
		}},
		{"odd-deny", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{Action: engine.ActionDeny, DecisionID: "d-deny"}, nil
		}},
		{"odd-approve", func() (engine.CSRDecision, error) {
			return engine.CSRDecision{Action: engine.ActionApprove, DecisionID: "d-approve"}, nil
		}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			t.Parallel()
			odd.Set(tc.node, tc.answer)
			t.Cleanup(func() { odd.Set(tc.node, nil) })
			ip := map[string]string{"odd-error": "10.40.0.2", "odd-action": "10.40.0.3", "odd-deny": "10.40.0.4", "odd-approve": "10.40.0.5"}[tc.node]
			f.machine(tc.node, ip)
			node := nodeClient(t, "system:node:"+tc.node, "system:nodes")
			name := submit(t, node, "csr-"+tc.node, csrgen.Request{Subject: csrgen.NodeSubject(tc.node), IPs: []net.IP{net.ParseIP(ip)}})

			// Asked a second time: the first answer was handled (a request
			// is decided by one worker at a time) and it is retried.
			require.Eventually(t, func() bool { return odd.Asked(tc.node) >= 2 }, wait, 100*time.Millisecond)
			assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "nothing is written on an odd answer")

			odd.Set(tc.node, nil)
			c := decided(t, name)
			assert.Equal(t, certificatesv1.CertificateApproved, c.Type, c.Message)
		})
	}
}
