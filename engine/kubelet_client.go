package engine

import (
	"context"

	"github.com/ichor-dev/ichor-policy/csrinput"
)

// PathKubeletClient is the entrypoint of the kubelet-client rule.
const PathKubeletClient = "ichor/kubelet_client/decision"

// KubeletClient decides a kube-apiserver-client-kubelet CSR. The decision's
// Kind is the kind the request is approved as (selfnodeclient or
// nodeclient), or would be but for a guard; empty when it is not recognized.
// The rule never denies: Action is approve or pending. It returns
// ErrNoDecision for a request of another signer.
func (e *Engine) KubeletClient(ctx context.Context, in csrinput.KubeletClient) (CSRDecision, error) {
	return e.decideCSR(ctx, PathKubeletClient, in)
}
