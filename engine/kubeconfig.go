package engine

import (
	"context"
	"fmt"

	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
)

// PathKubeconfig is the entrypoint judging a TalosCluster's kubeconfigRef.
const PathKubeconfig = "ichor/kubeconfig/decision"

// KubeconfigCluster names the TalosCluster whose kubeconfigRef is judged.
type KubeconfigCluster struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// KubeconfigSettings are the operator's choices the rule reads.
type KubeconfigSettings struct {
	// AllowInsecureSkipTLSVerify is --remote-kubeconfig-allow-insecure.
	AllowInsecureSkipTLSVerify bool `json:"allow_insecure_skip_tls_verify"`
}

// KubeconfigInput is the input of the kubeconfig decision: the facts of the
// document (never its credential data: only whether it is there) and, in the
// second step, what its server is.
type KubeconfigInput struct {
	Cluster        KubeconfigCluster    `json:"cluster"`
	Kubeconfig     kubeconfig.Facts     `json:"kubeconfig"`
	Settings       KubeconfigSettings   `json:"settings"`
	ServerIdentity *kubeconfig.Identity `json:"server_identity,omitempty"`
}

// KubeconfigDecision is the decision on a kubeconfigRef. CheckIdentity asks
// for the server's identity and the decision again; it never comes with
// Allowed.
type KubeconfigDecision struct {
	Allowed       bool    `json:"allowed"`
	CheckIdentity bool    `json:"check_identity"`
	Reasons       Reasons `json:"reasons"`
	DecisionID    string  `json:"decision_id"`
	Revision      string  `json:"revision"`
}

// ConditionMessage is the reasons and where the decision is, cut to what a
// condition takes.
func (d KubeconfigDecision) ConditionMessage() string {
	return Clip(d.Reasons.String(), fmt.Sprintf(" (decision %s, policy revision %s)", d.DecisionID, d.Revision), MaxConditionMessage)
}

// EventNote is the reasons and the decision id, cut to what an Event takes.
func (d KubeconfigDecision) EventNote() string {
	return Clip(d.Reasons.String(), fmt.Sprintf(" (decision %s)", d.DecisionID), MaxEventNote)
}

// Kubeconfig judges a TalosCluster's kubeconfigRef.
func (e *Engine) Kubeconfig(ctx context.Context, in KubeconfigInput) (KubeconfigDecision, error) {
	d, err := e.Decide(ctx, PathKubeconfig, in)
	if err != nil {
		return KubeconfigDecision{}, err
	}
	return parseKubeconfig(d)
}

func parseKubeconfig(d Decision) (KubeconfigDecision, error) {
	var out KubeconfigDecision
	if err := decodeInto(d, &out); err != nil {
		return KubeconfigDecision{}, err
	}
	// A bundle that allows and asks for more, or gives no reason, is broken:
	// nothing is connected to on a guess.
	if len(out.Reasons) == 0 || (out.Allowed && out.CheckIdentity) {
		return KubeconfigDecision{}, fmt.Errorf("decision %s of %s does not have the documented shape (allowed %t, check_identity %t, %d reasons)",
			d.ID, d.Path, out.Allowed, out.CheckIdentity, len(out.Reasons))
	}
	out.DecisionID, out.Revision = d.ID, d.Revision
	return out, nil
}
