package engine

import (
	"context"
	"errors"
	"fmt"
)

// PathManualRecord is the record of a person's act that Ichor does not decide
// (policy/ichor/manual): a CSR approved or denied by hand, an admin binding
// revoked.
const PathManualRecord = "ichor/manual/record"

// The acts of a person the rule records (ManualActInput.Act).
const (
	ActCSRDecision          = "csr_decision"
	ActAdminBindingDeletion = "admin_binding_deletion"
)

// Who saw the act (ManualActInput.SeenBy): the manager's webhook, told by the
// API server who acted; or a watch of the manager, which sees the result and
// never the actor.
const (
	SeenByAdmission = "admission"
	SeenByWatch     = "watch"
	// SeenByWatchStart is a request the watch found decided when it first
	// saw it (the requests it lists as it starts: after a leader change or
	// a restart): the change itself was not watched.
	SeenByWatchStart = "watch_start"
)

// The actor_source of a record: how the record knows who acted, if it does.
const (
	// ActorSourceAdmission: the API server named the person to the
	// manager's webhook.
	ActorSourceAdmission = "admission"
	// ActorSourceAnnotation: a binding's ichor.dev/revoked-by annotation,
	// a claim on the object.
	ActorSourceAnnotation = "annotation"
	// ActorSourceAmbiguous: several people attempted the verdict stored,
	// or attempts were not kept; nobody is named.
	ActorSourceAmbiguous = "ambiguous"
	// ActorSourceNotWatched is the actor_source of a decision the watch
	// found made when it started: no manager watched it, so nobody is
	// named.
	ActorSourceNotWatched = "not_watched"
	// ActorSourceUnknown: the webhook saw no attempt (down, unreachable or
	// timed out); nobody is named.
	ActorSourceUnknown = "unknown"
)

// ActionRevoke is the action of a revocation record.
const ActionRevoke = "revoke"

// Kinds of a manual record.
const (
	ManualKindDecision   = "manual-decision"
	ManualKindRevocation = "revocation"
)

// ActorUnknown is the actor of an act the webhook did not see.
const ActorUnknown = "unknown"

// ManualActInput is the input of the record: the act, who saw it, the user the
// API server named (admission only), and the object's facts.
type ManualActInput struct {
	Act    string          `json:"act"`
	SeenBy string          `json:"seen_by"`
	User   *CredentialUser `json:"user,omitempty"`
	// CertificateRequest is set for ActCSRDecision.
	CertificateRequest *ManualCSRFacts `json:"certificate_request,omitempty"`
	// Binding is set for ActAdminBindingDeletion.
	Binding *ManualBindingFacts `json:"binding,omitempty"`
	// Attempts, for ActCSRDecision, are the writes of a verdict the
	// manager's webhook admitted from the version of the request that the
	// stored write replaced, whoever's write was then stored (several
	// writes can pass admission; the API server stores one).
	Attempts []ManualAttempt `json:"attempts,omitempty"`
	// AttemptsIncomplete says that Attempts may miss some: more were made
	// than the manager keeps, or some could not be read.
	AttemptsIncomplete bool `json:"attempts_incomplete,omitempty"`
}

// ManualAttempt is one write of a verdict the webhook admitted: the
// condition type it added, the digest of that condition as written
// (ConditionSHA256), and its user as the API server authenticated them.
type ManualAttempt struct {
	Verdict string `json:"verdict"`
	// ConditionSHA256 is the hex sha256 of the verdict condition the write
	// added: its type, reason and message (review 4, R4: an attempt names
	// its person only for the very condition stored).
	ConditionSHA256 string `json:"condition_sha256"`
	Username        string `json:"username"`
	UID             string `json:"uid"`
}

// ManualCSRFacts are a CSR's facts for the record: its name, signer, the
// requester as the API server recorded it, and its conditions after and
// before the write (bounded by the gatherer).
type ManualCSRFacts struct {
	Name               string            `json:"name"`
	UID                string            `json:"uid"`
	SignerName         string            `json:"signer_name"`
	Username           string            `json:"username"`
	Conditions         []ManualCondition `json:"conditions"`
	PreviousConditions []ManualCondition `json:"previous_conditions"`
	// VerdictConditionSHA256 is the hex sha256 of the verdict condition the
	// write added, as an attempt's ConditionSHA256 is made, computed on the
	// condition before any bound cuts it; "" when the write added none.
	VerdictConditionSHA256 string `json:"verdict_condition_sha256,omitempty"`
}

// ManualCondition is one condition of a CSR as written.
type ManualCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// ManualBindingFacts are an admin binding's facts: its name and uid, whose it
// is (the manager's annotations), the revoked-by annotation, and its role.
type ManualBindingFacts struct {
	Name      string       `json:"name"`
	UID       string       `json:"uid"`
	Username  string       `json:"username"`
	Identity  string       `json:"identity"`
	RevokedBy string       `json:"revoked_by"`
	RoleRef   RoleRefFacts `json:"role_ref"`
}

// ManualRecord is the rule's record of the act.
type ManualRecord struct {
	Kind        string  `json:"kind"`
	Action      string  `json:"action"`
	Actor       string  `json:"actor"`
	ActorSource string  `json:"actor_source"`
	Whom        string  `json:"whom"`
	Object      string  `json:"object"`
	Node        string  `json:"node,omitempty"`
	Reasons     Reasons `json:"reasons"`
	DecisionID  string  `json:"decision_id"`
	Revision    string  `json:"revision"`
}

// EventNote is the record's reasons and its decision id, cut to what an
// Event takes (escaped: the reasons quote what a person wrote).
func (r ManualRecord) EventNote() string {
	return Clip(r.Reasons.String(), fmt.Sprintf(" (decision %s)", r.DecisionID), MaxEventNote)
}

// ErrRecordShape is a record of a person's act that the rule made without
// what its documentation promises (a kind, an action, an object, a
// reason): the bundle's to fix, and the same input gives the same again,
// after its entry was logged.
var ErrRecordShape = errors.New("does not have the documented shape")

// RecordManual writes the record of a person's act to the decision log. It
// returns ErrNoDecision when the rule does not record the act (a write that
// decides nothing).
func (e *Engine) RecordManual(ctx context.Context, in ManualActInput) (ManualRecord, error) {
	d, err := e.Decide(ctx, PathManualRecord, in)
	if err != nil {
		return ManualRecord{}, err
	}
	out, err := parseManualRecord(d)
	if err != nil {
		return ManualRecord{}, err
	}
	e.metrics.manualAct(out)
	return out, nil
}

func parseManualRecord(d Decision) (ManualRecord, error) {
	var out ManualRecord
	if err := decodeInto(d, &out); err != nil {
		return ManualRecord{}, err
	}
	if len(out.Reasons) == 0 || out.Kind == "" || out.Action == "" || out.Object == "" {
		return ManualRecord{}, fmt.Errorf("decision %s of %s %w (kind %q, action %q, object %q, %d reasons)",
			d.ID, d.Path, ErrRecordShape, out.Kind, out.Action, out.Object, len(out.Reasons))
	}
	out.DecisionID, out.Revision = d.ID, d.Revision
	return out, nil
}
