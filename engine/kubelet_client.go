package engine

import (
	"context"
	"fmt"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// PathKubeletClient is the entrypoint of the kubelet-client rule.
const PathKubeletClient = "ichor/kubelet_client/decision"

// KubeletClient decides a kube-apiserver-client-kubelet CSR. The decision's
// Kind is the kind the request is approved as (selfnodeclient or
// nodeclient), or would be but for a guard; empty when it is not recognized.
// The rule never denies: Action is approve or pending. It returns
// ErrNoDecision for a request of another signer.
func (e *Engine) KubeletClient(ctx context.Context, in csrinput.KubeletClient) (CSRDecision, error) {
	d, err := e.Decide(ctx, PathKubeletClient, in)
	if err != nil {
		return CSRDecision{}, err
	}
	return parseKubeletClient(d)
}

func parseKubeletClient(dec Decision) (CSRDecision, error) {
	d, err := parseCSR(dec)
	if err != nil {
		return CSRDecision{}, err
	}
	// This approver never denies: a denial is final, and kube-controller-
	// manager's approver, whose place it takes, leaves what it does not
	// approve to a person. A bundle whose rule denies is broken, like one
	// that answers an unknown action: nothing is done and the caller retries.
	if d.Action == ActionDeny {
		return CSRDecision{}, fmt.Errorf("decision %s of %s answers deny, which the kubelet client rule never does: the bundle is broken; the request is left as it is", d.DecisionID, PathKubeletClient)
	}
	return d, nil
}
