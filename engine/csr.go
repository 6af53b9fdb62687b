package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// Entrypoints of the kubelet-serving rule.
const (
	PathKubeletServing = "ichor/kubelet_serving/decision"
	// PathKubeletServingRejection is the decision when it is a rejection no
	// node identity could change; undefined otherwise.
	PathKubeletServingRejection = "ichor/kubelet_serving/rejection"
	// PathKubeletServingLimits is what Go needs before it counts.
	PathKubeletServingLimits = "ichor/kubelet_serving/limits"
)

// KubeletServingLimits are the limits of the kubelet-serving rule that Go
// counts with.
type KubeletServingLimits struct {
	MaxUndecidedPerRequester int `json:"max_undecided_per_requester"`
	// NodeUserPrefix is what a node's username starts with, before its node
	// name (system:node:): Go counts apart the requests of a requester that
	// is not the node the request names.
	NodeUserPrefix string `json:"node_user_prefix"`
	// Revision is the bundle revision the limits are of.
	Revision string `json:"-"`
}

// KubeletServingLimits asks the rule for the limits Go counts with.
func (e *Engine) KubeletServingLimits(ctx context.Context) (KubeletServingLimits, error) {
	d, err := e.Decide(ctx, PathKubeletServingLimits, map[string]any{})
	if err != nil {
		return KubeletServingLimits{}, err
	}
	return parseLimits(d)
}

func parseLimits(d Decision) (KubeletServingLimits, error) {
	var out KubeletServingLimits
	if err := decodeInto(d, &out); err != nil {
		return KubeletServingLimits{}, err
	}
	if out.MaxUndecidedPerRequester < 1 {
		return KubeletServingLimits{}, fmt.Errorf("decision %s of %s gives no max_undecided_per_requester of at least 1: the bundle is broken", d.ID, d.Path)
	}
	if out.NodeUserPrefix == "" {
		return KubeletServingLimits{}, fmt.Errorf("decision %s of %s gives no node_user_prefix: the bundle is broken", d.ID, d.Path)
	}
	out.Revision = d.Revision
	return out, nil
}

// The actions a CSR rule answers with.
const (
	ActionApprove = "approve"
	ActionDeny    = "deny"
	ActionPending = "pending"
)

// Reason is one reason of a decision: a stable code (documented in the
// rule's METADATA) and a message for a person.
type Reason struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// CSRDecision is the decision of a CSR rule, with the decision id and the
// bundle revision that find it again in the decision log.
type CSRDecision struct {
	Action     string  `json:"action"`
	Reasons    Reasons `json:"reasons"`
	Node       string  `json:"node"`
	Kind       string  `json:"kind,omitempty"`
	DecisionID string  `json:"decision_id"`
	Revision   string  `json:"revision"`
}

// KubeletServing decides a kubelet-serving CSR. It returns ErrNoDecision for
// a request of another signer.
func (e *Engine) KubeletServing(ctx context.Context, in csrinput.KubeletServing) (CSRDecision, error) {
	d, err := e.Decide(ctx, PathKubeletServing, in)
	if err != nil {
		return CSRDecision{}, err
	}
	return parseCSR(d)
}

// KubeletServingRejection is the kubelet-serving decision when it is a
// rejection that no node identity could change (ichor/kubelet_serving/
// rejection), asked before the node is read. It returns ErrNoDecision when
// there is none: the request needs its node's identity to be decided.
func (e *Engine) KubeletServingRejection(ctx context.Context, in csrinput.KubeletServing) (CSRDecision, error) {
	d, err := e.Decide(ctx, PathKubeletServingRejection, in)
	if err != nil {
		return CSRDecision{}, err
	}
	return parseRejection(d)
}

func parseRejection(d Decision) (CSRDecision, error) {
	out, err := parseCSR(d)
	if err != nil {
		return CSRDecision{}, err
	}
	if out.Action != ActionDeny {
		return CSRDecision{}, fmt.Errorf("decision %s of %s answers %q, not deny: the bundle is broken", d.ID, d.Path, out.Action)
	}
	return out, nil
}

// parseCSR reads a CSR rule's decision.
func parseCSR(d Decision) (CSRDecision, error) {
	path := d.Path
	var out CSRDecision
	if err := decodeResult(d.Result, &out); err != nil {
		return CSRDecision{}, fmt.Errorf("decision %s of %s is not a CSR decision: %w", d.ID, path, err)
	}
	// A bundle whose rule answers anything else is broken; acting on it
	// would be guessing, so the caller gets an error and does nothing.
	switch out.Action {
	case ActionApprove, ActionDeny, ActionPending:
	default:
		return CSRDecision{}, fmt.Errorf("decision %s of %s has unknown action %q", d.ID, path, out.Action)
	}
	if len(out.Reasons) == 0 {
		return CSRDecision{}, fmt.Errorf("decision %s of %s gives no reason", d.ID, path)
	}
	out.DecisionID = d.ID
	out.Revision = d.Revision
	return out, nil
}

// Limits of what a decision writes on objects. A CSR condition's message is
// not limited by the API, but the whole object must fit in etcd; an Event's
// note is refused above 1 kB (events.k8s.io/v1).
const (
	MaxConditionMessage = 16 << 10
	MaxEventNote        = 1024
)

// ConditionMessage is what lands on the CSR's condition: the reasons, and
// the decision id and policy revision that find the decision again in the
// log, cut to MaxConditionMessage.
func (d CSRDecision) ConditionMessage() string {
	return Clip(d.Reasons.String(), fmt.Sprintf(" (decision %s, policy revision %s)", d.DecisionID, d.Revision), MaxConditionMessage)
}

// decisionTailStart is how the tail ConditionMessage writes begins.
const decisionTailStart = "(decision "

// decisionIDPattern is a decision id (a UUID, as uuid.NewRandom writes it).
var decisionIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// DecisionOfMessage is the decision id of a condition message that ends in
// the tail ConditionMessage writes, "(decision ID, policy revision R)" with
// no ")" in R; ok is false for any other message (a person's, another
// approver's). Only the tail is read: the reasons before it quote what a
// requester wrote (a node name), which may itself read "(decision ...". The
// one reader of that tail, for the approvers and for the watch and webhook
// that tell Ichor's verdicts from a person's.
func DecisionOfMessage(message string) (id string, ok bool) {
	i := strings.LastIndex(message, decisionTailStart)
	if i < 0 {
		return "", false
	}
	id, revision, found := strings.Cut(message[i+len(decisionTailStart):], ", policy revision ")
	if !found || !decisionIDPattern.MatchString(id) || !strings.HasSuffix(revision, ")") || strings.Count(revision, ")") != 1 {
		return "", false
	}
	return id, true
}

// EventNote is the reasons and the decision id, cut to what an Event takes.
func (d CSRDecision) EventNote() string {
	return Clip(d.Reasons.String(), fmt.Sprintf(" (decision %s)", d.DecisionID), MaxEventNote)
}

// EventAction is an Event's action: verb, and a digest of what tells this
// Event from another of the same reason on the same object (the reason
// codes of a decision, a bundle's revision). client-go's events broadcaster
// folds an Event into an earlier one of the same type, reason, action and
// objects, whatever its note says, and counts it there: a machine whose
// pending request was NodeUnreadable, and whose next one was held back as a
// flood, showed NodeUnreadable for both, with a count of 2, as long as
// Events came within 6 minutes of each other (review 203 F1). Events of the
// same parts still fold, as they should: a node unreadable at each look is
// one Event and a count.
func EventAction(verb string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return verb + "/" + hex.EncodeToString(sum[:4])
}

// Clip is text followed by tail, at most limit bytes: when text is too long
// it is cut on a character boundary and says how much is left out; the tail
// (which finds the whole decision in the log) is always kept. The text is
// escaped first (termsafe), newlines and tabs included: a reason quotes what
// a requester wrote (a subject's attribute may hold a line break), and a
// condition or an Event is read on a terminal, by kubectl describe and
// kubectl get -o yaml alike, where a line of its own would read as another
// Event or field; the decision log keeps the value as it was.
func Clip(text, tail string, limit int) string {
	text = termsafe.EscapeLine(text)
	if len(text)+len(tail) <= limit {
		return text + tail
	}
	cut := fmt.Sprintf("... [%d more bytes in the decision log]", len(text))
	keep := max(limit-len(tail)-len(cut), 0)
	for keep > 0 && !utf8.RuneStart(text[keep]) {
		keep--
	}
	return text[:keep] + fmt.Sprintf("... [%d more bytes in the decision log]", len(text)-keep) + tail
}
