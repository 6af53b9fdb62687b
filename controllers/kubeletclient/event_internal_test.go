package kubeletclient

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/ichor-dev/ichor-policy/engine"
)

// A request the rule recognized and left pending gets an Event saying why;
// one it did not recognize gets none: it is no kubelet's, and whoever holds
// a bootstrap token can make as many as they like (review 225 F2).
func TestOnlyARecognizedRequestLeftPendingGetsAnEvent(t *testing.T) {
	recorder := events.NewFakeRecorder(4)
	r := &Reconciler{Recorder: recorder}
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-1"}}
	pending := func(kind, code string) engine.CSRDecision {
		return engine.CSRDecision{Action: engine.ActionPending, Kind: kind, DecisionID: "d-1", Reasons: engine.Reasons{{Code: code, Message: "why"}}}
	}

	r.pendingEvent(csr, nil, pending("", "OrganizationNotNodes"))
	r.pendingEvent(csr, nil, pending("nodeclient", "NodeClientNotAuthorized"))

	require.Len(t, recorder.Events, 1, "one Event, for the recognized request alone")
	e := <-recorder.Events
	assert.Contains(t, e, "Warning "+ReasonPending)
	assert.Contains(t, e, "NodeClientNotAuthorized")
	assert.Contains(t, e, "d-1", "the decision is named")
}
