// Package decisionlog reads the decision log the engine writes (OPA's console
// decision log: one JSON object a line, msg "Decision Log"), selects
// decisions from it, and replays the logged inputs against a candidate
// bundle to show which decisions a policy change would change.
//
// A log is read as it reaches an operator: from `kubectl logs`, where the
// decisions (standard output) are interleaved with the controllers' and
// OPA's own logs (standard error). Lines that are not decision-log entries
// are skipped and counted, never an error.
package decisionlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ichor-dev/ichor-policy/engine"
)

// Message is the msg of every decision-log entry OPA's console sink writes.
const Message = "Decision Log"

// The decision paths of the rules the manager and the webhook ask.
const (
	PathKubeletServing = engine.PathKubeletServing
	PathKubeletClient  = engine.PathKubeletClient
	PathAdmission      = engine.PathCredentialAdmission
	PathIssuance       = engine.PathCredentialIssuance
)

// Policies maps the short names of the decision rules to their paths.
var Policies = map[string]string{
	"kubelet-serving": PathKubeletServing,
	"kubelet-client":  PathKubeletClient,
	"admission":       PathAdmission,
	"issuance":        PathIssuance,
}

// The actions a decision is listed and filtered by: a CSR rule's action as it
// answers it, an admission or issuance rule's "allowed" as allowed or
// refused, and two words for an entry without a result.
const (
	ActionApprove = engine.ActionApprove
	ActionDeny    = engine.ActionDeny
	ActionPending = engine.ActionPending
	ActionAllowed = engine.ActionAllowed
	ActionRefused = engine.ActionRefused
	// ActionNone is a rule that was undefined for the input: it does not
	// govern it (a CSR of another signer, say).
	ActionNone = engine.ActionNone
	// ActionError is an evaluation that failed.
	ActionError = engine.ActionError
)

// Actions are the action words, in the order they are listed.
var Actions = []string{ActionApprove, ActionDeny, ActionPending, ActionAllowed, ActionRefused, ActionNone, ActionError}

// Entry is one decision of the log, as OPA wrote it.
type Entry struct {
	DecisionID string `json:"decision_id"`
	Path       string `json:"path"`
	// Input is the rule's input after the mask in policy/system/log ran.
	Input json.RawMessage `json:"input,omitempty"`
	// Result is the rule's value; absent when the rule was undefined or the
	// evaluation failed, and Error says which.
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
	// Revision is the revision of the bundle the decision was made with
	// (bundles.ichor.revision).
	Revision  string            `json:"revision"`
	Timestamp time.Time         `json:"timestamp"`
	Labels    map[string]string `json:"labels,omitempty"`
	Type      string            `json:"type"`
	// Raw is the whole entry as logged.
	Raw json.RawMessage `json:"-"`
}

// line is the part of a log line Read looks at. Fields whose type a foreign
// log line might not share are kept raw, so such a line is skipped rather
// than mistaken.
type line struct {
	Msg        string                     `json:"msg"`
	DecisionID json.RawMessage            `json:"decision_id"`
	Path       string                     `json:"path"`
	Input      json.RawMessage            `json:"input"`
	Result     json.RawMessage            `json:"result"`
	Error      json.RawMessage            `json:"error"`
	Bundles    map[string]json.RawMessage `json:"bundles"`
	Timestamp  string                     `json:"timestamp"`
	Labels     map[string]any             `json:"labels"`
	Type       string                     `json:"type"`
}

// Read reads decision-log entries, one JSON object a line, in the order they
// appear. A line that is not a decision-log entry (not JSON, or JSON without
// msg "Decision Log" and a decision_id) is skipped and counted; blank lines
// are neither. A line may carry a prefix before its JSON object, as
// `kubectl logs --timestamps` or `--prefix` writes. The error is the
// reader's only.
func Read(r io.Reader) ([]Entry, int, error) {
	var entries []Entry
	skipped := 0
	br := bufio.NewReader(r)
	for {
		text, err := br.ReadBytes('\n')
		if t := bytes.TrimSpace(text); len(t) > 0 {
			if e, ok := parse(t); ok {
				entries = append(entries, e)
			} else {
				skipped++
			}
		}
		if errors.Is(err, io.EOF) {
			return entries, skipped, nil
		}
		if err != nil {
			return entries, skipped, err
		}
	}
}

func parse(text []byte) (Entry, bool) {
	if text[0] != '{' {
		i := bytes.IndexByte(text, '{')
		if i < 0 {
			return Entry{}, false
		}
		text = text[i:]
	}
	var l line
	if err := json.Unmarshal(text, &l); err != nil || l.Msg != Message {
		return Entry{}, false
	}
	var id string
	if err := json.Unmarshal(l.DecisionID, &id); err != nil || id == "" {
		return Entry{}, false
	}
	e := Entry{
		DecisionID: id,
		Path:       l.Path,
		Input:      nullToNil(l.Input),
		Result:     nullToNil(l.Result),
		Error:      nullToNil(l.Error),
		Type:       l.Type,
		Raw:        json.RawMessage(slices.Clone(text)),
	}
	if b, ok := l.Bundles[engine.BundleName]; ok {
		var info struct {
			Revision string `json:"revision"`
		}
		if json.Unmarshal(b, &info) == nil {
			e.Revision = info.Revision
		}
	}
	if ts, err := time.Parse(time.RFC3339Nano, l.Timestamp); err == nil {
		e.Timestamp = ts
	}
	if len(l.Labels) > 0 {
		e.Labels = make(map[string]string, len(l.Labels))
		for k, v := range l.Labels {
			e.Labels[k] = fmt.Sprint(v)
		}
	}
	return e, true
}

func nullToNil(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// Policy is the short name of the entry's rule, or its path when it has none.
func (e Entry) Policy() string {
	return PolicyName(e.Path)
}

// PolicyName is the short name of a decision path, or the path itself.
func PolicyName(path string) string {
	for name, p := range Policies {
		if p == path {
			return name
		}
	}
	return path
}

// ResolvePolicy turns a short name or a decision path (slash-separated, or
// dotted with or without "data.") into a decision path.
func ResolvePolicy(name string) (string, error) {
	if p, ok := Policies[name]; ok {
		return p, nil
	}
	switch {
	case strings.Contains(name, "/"):
		return strings.Trim(name, "/"), nil
	case strings.Contains(name, "."):
		return strings.ReplaceAll(strings.TrimPrefix(name, "data."), ".", "/"), nil
	}
	names := make([]string, 0, len(Policies))
	for n := range Policies {
		names = append(names, n)
	}
	sort.Strings(names)
	return "", fmt.Errorf("unknown policy %q: give a decision path such as %s, or one of %s",
		name, PathKubeletServing, strings.Join(names, ", "))
}

// Outcome is what a decision answered (engine.Outcome), with the
// evaluation's error and the rule's value.
type Outcome struct {
	engine.Outcome
	// Error is the evaluation's error, for ActionError.
	Error string `json:"error,omitempty"`
	// Result is the rule's value.
	Result json.RawMessage `json:"-"`
}

// OutcomeOf reads a rule's value. A nil result is no decision.
func OutcomeOf(result json.RawMessage) Outcome {
	return Outcome{Outcome: engine.OutcomeOf(result, nil), Result: result}
}

// Outcome is the entry's decision.
func (e Entry) Outcome() Outcome {
	if e.Result == nil && e.Error != nil && !isUndefined(e.Error) {
		return Outcome{Outcome: engine.Outcome{Action: ActionError, Reasons: engine.Reasons{}}, Error: ErrorText(e.Error)}
	}
	return OutcomeOf(e.Result)
}

// Action is the entry's action word (see Outcome.Action).
func (e Entry) Action() string { return e.Outcome().Action }

// Reasons are the entry's reasons.
func (e Entry) Reasons() engine.Reasons { return e.Outcome().Reasons }

// Codes are the entry's reason codes.
func (e Entry) Codes() []string { return e.Outcome().Reasons.Codes() }

// ErrorText is an entry's error as text: OPA writes it as a string or as an
// object with a code and a message.
func ErrorText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Message != "" {
		if o.Code != "" {
			return o.Code + ": " + o.Message
		}
		return o.Message
	}
	return string(raw)
}

func isUndefined(raw json.RawMessage) bool {
	return strings.Contains(ErrorText(raw), "opa_undefined_error")
}

// subject is the part of an input that names who or what a decision is about.
type subject struct {
	CSR *struct {
		Name     string `json:"name"`
		Username string `json:"username"`
		Request  struct {
			Subject []struct {
				Name  string `json:"name"`
				Value string `json:"value"`
			} `json:"subject"`
		} `json:"request"`
	} `json:"csr"`
	Node *struct {
		Nodename string `json:"nodename"`
	} `json:"node"`
	User *struct {
		Username string `json:"username"`
	} `json:"user"`
	// Requester is spec.requester of a credential request: the only user
	// an issuance decision names.
	Requester *struct {
		Username string `json:"username"`
	} `json:"requester"`
}

func (e Entry) subject() subject {
	var s subject
	if e.Input != nil {
		_ = json.Unmarshal(e.Input, &s)
	}
	return s
}

const nodeUserPrefix = "system:node:"

// Nodes are the node names the entry is about, most authoritative first:
// the result's node, the node the request's common name claims
// (system:node:NAME), the Nodename the Talos API reported. Duplicates and
// empty names are left out.
func (e Entry) Nodes() []string {
	var nodes []string
	add := func(n string) {
		if n != "" && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	add(e.Outcome().Node)
	s := e.subject()
	if s.CSR != nil {
		for _, a := range s.CSR.Request.Subject {
			if a.Name == "CN" && strings.HasPrefix(a.Value, nodeUserPrefix) {
				add(strings.TrimPrefix(a.Value, nodeUserPrefix))
			}
		}
	}
	if s.Node != nil {
		add(s.Node.Nodename)
	}
	return nodes
}

// Node is the first of Nodes, or "".
func (e Entry) Node() string {
	if nodes := e.Nodes(); len(nodes) > 0 {
		return nodes[0]
	}
	return ""
}

// Object is what a CSR decision was about, as the applied records name it:
// "csr/NAME"; empty for other decisions.
func (e Entry) Object() string {
	s := e.subject()
	if s.CSR == nil || s.CSR.Name == "" {
		return ""
	}
	return "csr/" + s.CSR.Name
}

// Truncated reports whether the log kept only part of the entry's input or
// result (the mask's input.log_truncated).
func (e Entry) Truncated() bool {
	var marker struct {
		Truncated map[string]any `json:"log_truncated"`
	}
	if e.Input != nil {
		_ = json.Unmarshal(e.Input, &marker)
	}
	return len(marker.Truncated) > 0
}

// User is the requester: the CSR's spec.username, the admission request's
// user, or the requester an issuance decision re-authorized.
func (e Entry) User() string {
	s := e.subject()
	switch {
	case s.CSR != nil && s.CSR.Username != "":
		return s.CSR.Username
	case s.User != nil:
		return s.User.Username
	case s.Requester != nil:
		return s.Requester.Username
	}
	return ""
}

// Subject is what a listing shows in its NODE/USER column: the node for a
// decision about a node, else the requester.
func (e Entry) Subject() string {
	if n := e.Node(); n != "" {
		return n
	}
	return e.User()
}
