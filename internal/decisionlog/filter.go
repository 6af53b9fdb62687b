package decisionlog

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ichor-dev/ichor-policy/engine"
)

// Criteria select decisions; a zero field selects every decision.
type Criteria struct {
	// Path is a decision path (see ResolvePolicy).
	Path string
	// Action is one of Actions.
	Action string
	// Node is any of the entry's Nodes.
	Node string
	// User is the entry's User.
	User string
	// Since keeps decisions made at or after it.
	Since time.Time
	// Revision is the bundle revision, or a prefix of it.
	Revision string
}

// Match reports whether an entry meets every criterion.
func (c Criteria) Match(e Entry) bool {
	switch {
	case c.Path != "" && e.Path != c.Path:
		return false
	case c.Action != "" && e.Action() != c.Action:
		return false
	case c.Node != "" && !slices.Contains(e.Nodes(), c.Node):
		return false
	case c.User != "" && e.User() != c.User:
		return false
	case !c.Since.IsZero() && e.Timestamp.Before(c.Since):
		return false
	case c.Revision != "" && !strings.HasPrefix(e.Revision, c.Revision):
		return false
	}
	return true
}

// Filter returns the entries that match, in their order.
func Filter(entries []Entry, c Criteria) []Entry {
	var out []Entry
	for _, e := range entries {
		if c.Match(e) {
			out = append(out, e)
		}
	}
	return out
}

// PathApplied is the path of the records that a decision was carried out
// (engine.RecordApplied).
const PathApplied = engine.PathApplied

// Applied is the record's facts when the entry is a record that a decision
// was carried out: which decision, on which object, by what action. Both
// shapes a record has had hold them in the entry's input: the plain entry
// the manager writes (no result; the object's uid and the write's outcome
// beside them), and the entry of the former record rule
// (policy/system/applied, whose result repeated them), which has no uid and
// no outcome: those are empty.
func (e Entry) Applied() (engine.Applied, bool) {
	var a engine.Applied
	if e.Path != PathApplied || json.Unmarshal(e.Input, &a) != nil {
		return engine.Applied{}, false
	}
	return a, true
}

// InEffect are the entries a reader wants by default: the decisions in
// effect, without the applied-verdict records. A verdict is left out when it
// was never applied while another verdict on the same object was: an
// approver that decided, met a conflict writing (someone else decided, the
// object changed) and decided again logged both; so did an issuer whose
// answer's write failed (review 187: its refusal never stored was listed
// beside the issuance stored), though only a refusal: an issuance never
// stored may have made its person's admin binding, which stays in effect
// (review 188). Logs without applied
// records (older managers) keep every verdict; a record that names no
// decision (an admin binding without its annotation) applies none.
func InEffect(entries []Entry) []Entry {
	applied := map[string]bool{}
	// The objects a record applied a verdict to, and the UIDs it named:
	// two requests whose long names are cut alike are told apart by their
	// UIDs. A record of an older shape names no UID, nor does a decision
	// whose input holds none: either applies by the name alone.
	objects := map[string]map[string]bool{}
	record := func(object, uid string) {
		if objects[object] == nil {
			objects[object] = map[string]bool{}
		}
		objects[object][uid] = true
	}
	// What each decision was about: a record applies the decision it names
	// only where that decision was about the record's object. A record made
	// when a replica takes a cluster over names the decision the request's
	// condition names, and whoever may write conditions on the request (a
	// tenant, on its own cluster's API server) chose that name: naming a
	// decision about another request made it read applied, and hid that
	// request's own verdicts (review 177 F2). Nor does such a record, made
	// at a take-over (Adopted), apply a decision the entries do not hold: a
	// name made up hid the request's verdicts as surely (review 188). A
	// record of the manager's own write names its own decision, and applies
	// it though the entries read do not hold it (the window began after
	// it, or its replica's log was not read: review 190).
	about := map[string][2]string{}
	for _, e := range entries {
		if e.Path == PathApplied {
			continue
		}
		if object, uid := e.objectAndUID(); object != "" {
			about[e.DecisionID] = [2]string{object, uid}
		}
	}
	for _, e := range entries {
		if a, ok := e.Applied(); ok && a.DecisionID != "" {
			if d, known := about[a.DecisionID]; (known && !recordNames(a, d[0], d[1])) || (!known && e.maybeAdopted(a)) {
				continue
			}
			applied[a.DecisionID] = true
			// As written (cut since records are), and cut as the
			// decision's input names it: a record written before
			// records were cut names a long name whole.
			record(a.Object, a.UID)
			record(engine.LoggedObject(a.Object), a.UID)
		}
	}
	superseded := func(e Entry) bool {
		object, uid := e.objectAndUID()
		uids := objects[object]
		if object == "" || len(uids) == 0 || applied[e.DecisionID] || !supersedable(e) {
			return false
		}
		return uid == "" || uids[uid] || uids[""]
	}
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if e.Path == PathApplied || superseded(e) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// maybeAdopted reports whether a record may have been made at a take-over:
// it says so, or it comes from a release before records said it (no
// adopted field) and says observed, as a take-over's does (review 192:
// such records, made by the release before during a rollout, would apply
// a decision named by a condition a tenant wrote).
func (e Entry) maybeAdopted(a engine.Applied) bool {
	if a.Adopted {
		return true
	}
	var said struct {
		Adopted *bool `json:"adopted"`
	}
	_ = json.Unmarshal(e.Input, &said)
	return said.Adopted == nil && a.Outcome == engine.AppliedObserved
}

// supersedable reports whether a verdict never applied is left out beside
// one applied on its object: a CSR's approval or denial, whose write
// conflicted; an issuance's refusal never stored. Not an issuance allowed
// and never stored: it may have made its person's admin binding, which the
// next one reused, and which stays in effect (review 188).
func supersedable(e Entry) bool {
	switch e.Action() {
	case ActionApprove, ActionDeny:
		return true
	case ActionRefused:
		return e.Path == PathIssuance
	}
	return false
}

// recordNames reports whether a record names the object a decision was
// about: by its name and, where both name one, its UID, each as written
// (cut, since records are) or cut as the decision's input has it (a record
// written before records were cut names them whole).
func recordNames(a engine.Applied, object, uid string) bool {
	if a.Object != object && engine.LoggedObject(a.Object) != object {
		return false
	}
	return a.UID == "" || uid == "" || a.UID == uid || engine.LoggedName(a.UID) == uid
}

// Verdicts are the rules' decisions, every verdict, applied or not, without
// the applied-verdict records (which decide nothing): what `list --all`
// shows of decisions and `replay --all` replays.
func Verdicts(entries []Entry) []Entry {
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if e.Path != PathApplied {
			out = append(out, e)
		}
	}
	return out
}

// Decisions are the entries Ichor's rules decided, which a replay replays:
// without the records of a person's acts (PathManual), which Ichor did not
// decide. (Verdicts and InEffect keep them, so that list shows them.)
func Decisions(entries []Entry) []Entry {
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if !e.Manual() {
			out = append(out, e)
		}
	}
	return out
}

// ValidAction reports whether a is an action word.
func ValidAction(a string) bool { return slices.Contains(Actions, a) }

// ParseSince reads a --since value: a duration before now (such as 90m or
// 1h, or in days, such as 30d or 1d12h), or an RFC 3339 time.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if d, err := parseDays(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("since %q: a duration before now must be positive", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("since %q is neither a duration (such as 30m or 24h) nor an RFC 3339 time (such as 2026-05-01T12:00:00Z)", s)
}

// maxSinceDays keeps a number of days within what a time.Duration holds
// (about 106000 days), with room for the hours after it.
const maxSinceDays = 100000

// parseDays is time.ParseDuration with days in front: 30d, 1d12h. A day is
// 24 hours, as kubectl's and Prometheus's durations count it.
func parseDays(s string) (time.Duration, error) {
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	n, err := strconv.Atoi(days)
	if err != nil || n < 0 || n > maxSinceDays || strings.HasPrefix(days, "+") {
		return 0, fmt.Errorf("%q: a number of days from 0 to %d before the d", s, maxSinceDays)
	}
	d := time.Duration(n) * 24 * time.Hour
	if rest == "" {
		return d, nil
	}
	more, err := time.ParseDuration(rest)
	if err != nil || more < 0 {
		return 0, fmt.Errorf("%q: after the days, a duration such as 12h", s)
	}
	return d + more, nil
}
