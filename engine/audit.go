package engine

import (
	"context"
	"fmt"

	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
)

// PathKubeletServingAudit is the entrypoint judging a kubelet serving
// certificate in service.
const PathKubeletServingAudit = "ichor/kubelet_serving/audit"

// The statuses of an audit.
const (
	// AuditCurrent: the certificate names only the node's identity, was
	// issued by the cluster's CA and does not expire soon.
	AuditCurrent = "current"
	// AuditDrifted: a check failed; the reasons say which.
	AuditDrifted = "drifted"
	// AuditUnknown: the certificate or the node could not be read; nothing
	// was judged, which is not drift.
	AuditUnknown = "unknown"
)

// AuditDecision is the audit of one kubelet's serving certificate.
type AuditDecision struct {
	Status     string  `json:"status"`
	Reasons    Reasons `json:"reasons"`
	Node       string  `json:"node"`
	DecisionID string  `json:"decision_id"`
	Revision   string  `json:"revision"`
}

// KubeletServingAudit judges the certificate a kubelet served against its
// node's identity of today. It returns ErrNoDecision for an input without a
// certificate.
func (e *Engine) KubeletServingAudit(ctx context.Context, in servingcert.Audit) (AuditDecision, error) {
	d, err := e.Decide(ctx, PathKubeletServingAudit, in)
	if err != nil {
		return AuditDecision{}, err
	}
	return parseAudit(d)
}

func parseAudit(d Decision) (AuditDecision, error) {
	var out AuditDecision
	if err := decodeResult(d.Result, &out); err != nil {
		return AuditDecision{}, fmt.Errorf("decision %s of %s is not an audit: %w", d.ID, d.Path, err)
	}
	// As for a CSR rule: an unknown status or no reason is a broken bundle,
	// reported, never guessed at (an unknown status read as current would
	// hide drift).
	switch out.Status {
	case AuditCurrent, AuditDrifted, AuditUnknown:
	default:
		return AuditDecision{}, fmt.Errorf("decision %s of %s has unknown status %q", d.ID, d.Path, out.Status)
	}
	if len(out.Reasons) == 0 {
		return AuditDecision{}, fmt.Errorf("decision %s of %s gives no reason", d.ID, d.Path)
	}
	out.DecisionID, out.Revision = d.ID, d.Revision
	return out, nil
}

// Message is the reasons with the decision id and policy revision that find
// the audit again in the log, cut to what a condition takes.
func (d AuditDecision) Message() string {
	return Clip(d.Reasons.String(), fmt.Sprintf(" (decision %s, policy revision %s)", d.DecisionID, d.Revision), MaxConditionMessage)
}

// EventNote is the reasons and the decision id, cut to what an Event takes.
func (d AuditDecision) EventNote() string {
	return Clip(d.Reasons.String(), fmt.Sprintf(" (decision %s)", d.DecisionID), MaxEventNote)
}
