package decisionlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
)

// Decider evaluates a rule; *engine.Engine is one.
type Decider interface {
	Decide(ctx context.Context, path string, input any) (engine.Decision, error)
}

// StateResult is the state, in a direction, of a result with neither an
// action nor an allowed.
const StateResult = "result"

// The changes with the same action word.
const (
	// NoteReasonsChanged is the same action and result for another first
	// reason code (the one a verdict is named by), or another set of
	// reason codes: information, which "any" does not include.
	NoteReasonsChanged = "reasons-changed"
	// NoteResultChanged is the same action with another result beside the
	// reasons and messages (engine.ResultChanges): another value of a rule
	// that answers no action, or another grant (a Talos role, groups, a
	// lifetime, an admin binding's role, the node approved). A candidate that
	// widens what a credential grants keeps its action and its reason code,
	// so "any" includes it.
	NoteResultChanged = "result-changed"
)

// Change is one logged decision the candidate decides otherwise.
type Change struct {
	Entry Entry   `json:"-"`
	Old   Outcome `json:"old"`
	New   Outcome `json:"new"`
	// Direction is "deny-to-approve" and the like when the action changed.
	Direction string `json:"direction,omitempty"`
	// Note is NoteReasonsChanged or NoteResultChanged when it did not.
	Note string `json:"note,omitempty"`
	// Changed are the result's fields that changed, for NoteResultChanged
	// (engine.ResultChanges).
	Changed []string `json:"changed,omitempty"`
}

// Report is what a replay found.
type Report struct {
	// Revision is the candidate bundle's revision, as its decisions
	// reported it ("" when it made none).
	Revision string
	// Replayed is the number of decisions replayed.
	Replayed int
	// Unchanged are those decided the same: same action, same reason codes,
	// and the same result but for its messages.
	Unchanged int
	// Directions counts the changes of action by direction.
	Directions map[string]int
	// Notes counts the informational changes.
	Notes map[string]int
	// Changes are every change, in the log's order.
	Changes []Change
	// Truncated are the decisions not replayed because the log kept only
	// part of their input (input.log_truncated): a shortened list of names
	// is not the request, and deciding it could read as a change.
	Truncated []Entry
	// Redacted are the decisions replayed on an input whose values the log
	// redacted (a user's extra attributes the mask does not list): a rule
	// that reads them may decide them otherwise than it did, the same
	// bundle too (review 255 F8). Counted among Replayed.
	Redacted []Entry
}

// Replay decides every entry's input again with d, at the entry's path, and
// reports what changed. It fails only when ctx ends; a candidate that cannot
// evaluate an input is a change to ActionError.
func Replay(ctx context.Context, d Decider, entries []Entry) (Report, error) {
	rep := Report{Directions: map[string]int{}, Notes: map[string]int{}}
	var kept int64
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		// Only a rule a manager decides on and logs: an entry names its
		// path, and any other path of the bundle (the RBAC invariant, whose
		// reasons multiply two lists of the input and are not capped)
		// would be evaluated on the forger's input (review 175).
		if !replayable[e.Path] {
			return rep, fmt.Errorf("decision %q: its path %q is no rule a manager decides on: not replayed, nor anything after it", e.DecisionID, e.Path)
		}
		if e.Truncated() {
			rep.Truncated = append(rep.Truncated, e)
			continue
		}
		if e.Redacted() {
			rep.Redacted = append(rep.Redacted, e)
		}
		var input any
		if e.Input != nil {
			// Numbers stay json.Number, so the candidate sees exactly the
			// numbers that were logged.
			dec := json.NewDecoder(bytes.NewReader(e.Input))
			dec.UseNumber()
			if err := dec.Decode(&input); err != nil {
				return rep, fmt.Errorf("decision %q: input: %w", e.DecisionID, err)
			}
			// The mask's note of what it cut is no part of the request
			// (here only the result's reasons were).
			if m, ok := input.(map[string]any); ok {
				delete(m, "log_truncated")
			}
			if n := longestList(input); n > MaxReplayedList {
				return rep, fmt.Errorf("decision %q: its input holds a list of %d items, more than any a manager logs (%d): not replayed, nor anything after it", e.DecisionID, n, MaxReplayedList)
			} else if int64(max(n, 1))*int64(len(e.Input)) > MaxReplayedWork {
				return rep, fmt.Errorf("decision %q: its input of %d bytes holds a list of %d items, more than any a manager logs together (a list's items times the input's bytes at most %d): not replayed, nor anything after it",
					e.DecisionID, len(e.Input), n, MaxReplayedWork)
			}
		}
		var now Outcome
		dec, err := d.Decide(ctx, e.Path, input)
		switch {
		case errors.Is(err, engine.ErrNoDecision):
			now = OutcomeOf(nil)
		case err != nil && ctx.Err() != nil:
			return rep, ctx.Err()
		case err != nil:
			now = Outcome{Outcome: engine.Outcome{Action: ActionError, Reasons: engine.Reasons{}}, Error: err.Error()}
		default:
			now = OutcomeOf(dec.Result)
			dec.Path = e.Path
			if err := engine.CheckDecision(dec); err != nil {
				// What the caller of the rule would refuse, as the
				// manager does: the candidate fails there.
				now = Outcome{Outcome: engine.Outcome{Action: ActionError, Reasons: engine.Reasons{}}, Error: err.Error()}
			}
			switch {
			case rep.Revision == "":
				rep.Revision = dec.Revision
			case dec.Revision != rep.Revision:
				// The candidate is one bundle: a file replaced while it
				// replays (the engine reads it again as it polls) is not.
				return rep, fmt.Errorf("decision %q was replayed against revision %s, the ones before it against %s: the candidate changed during the replay; replay it again", e.DecisionID, dec.Revision, rep.Revision)
			}
		}
		rep.Replayed++
		c := Change{Entry: e, Old: e.Outcome(), New: now}
		if c.Old.Result != nil {
			// The logged answer held to the same check: one the manager
			// refused was no verdict, and the same bundle replays it
			// unchanged (review 257).
			if err := engine.CheckDecision(engine.Decision{ID: e.DecisionID, Path: e.Path, Result: c.Old.Result}); err != nil {
				c.Old = Outcome{Outcome: engine.Outcome{Action: ActionError, Reasons: engine.Reasons{}}, Error: err.Error()}
			}
		}
		from, to := state(c.Old), state(c.New)
		changed := engine.ResultChanges(c.Old.Result, c.New.Result)
		switch {
		case from != to:
			c.Direction = Direction(from, to)
			rep.Directions[c.Direction]++
		case len(changed) > 0:
			// Before the codes: a widened grant keeps its code.
			c.Note, c.Changed = NoteResultChanged, changed
		case e.reasonsPartial() && !e.keptReasonsSame(c.New.Reasons.Codes()):
			// Where the log kept the first reasons only, what it knows
			// of them is compared (review 255 F3: a candidate that
			// changed the code named on the request was unchanged).
			c.Note = NoteReasonsChanged
		case !e.reasonsPartial() && !engine.SameCodes(c.Old.Reasons.Codes(), c.New.Reasons.Codes()):
			c.Note = NoteReasonsChanged
		default:
			rep.Unchanged++
			continue
		}
		if c.Note != "" {
			rep.Notes[c.Note]++
		}
		// Each change keeps its new result: entries within the bound each,
		// whose results a forger made large, would add up without one over
		// the replay (review 175).
		if kept += int64(len(dec.Result)); kept > MaxReplayedWork {
			return rep, fmt.Errorf("decision %q: the changes up to it hold %d bytes of results, more than a replay keeps (%d): not replayed, nor anything after it; replay fewer decisions at a time (--policy, --since)", e.DecisionID, kept, MaxReplayedWork)
		}
		rep.Changes = append(rep.Changes, c)
	}
	return rep, nil
}

func state(o Outcome) string {
	if o.Action == "" {
		return StateResult
	}
	return o.Action
}

// Direction names a change of action: "deny-to-approve".
func Direction(from, to string) string { return from + "-to-" + to }

// Arrow is a direction for a person: "deny → approve".
func Arrow(direction string) string {
	from, to, ok := strings.Cut(direction, "-to-")
	if !ok {
		return direction
	}
	return from + " → " + to
}

// directionOrder is the order directions are reported in: the CSR rules'
// first, the most consequential of each pair first, then admission's.
var directionOrder = []string{
	"deny-to-approve", "approve-to-deny",
	"pending-to-approve", "approve-to-pending",
	"deny-to-pending", "pending-to-deny",
	"refused-to-allowed", "allowed-to-refused",
}

// SortedDirections are the directions of a count, in report order: the known
// ones first, the others (to or from none, error, result) by name.
func SortedDirections(counts map[string]int) []string {
	out := make([]string, 0, len(counts))
	for d := range counts {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b string) int {
		ia, ib := slices.Index(directionOrder, a), slices.Index(directionOrder, b)
		switch {
		case ia >= 0 && ib >= 0:
			return ia - ib
		case ia >= 0:
			return -1
		case ib >= 0:
			return 1
		}
		return strings.Compare(a, b)
	})
	return out
}

// states are the words a direction is made of.
var states = append(slices.Clone(Actions), StateResult)

// FailOnValues are every value CheckFailOn takes, for the shell's completion.
func FailOnValues() []string {
	out := []string{"any", NoteReasonsChanged, NoteResultChanged, FailOnTruncated}
	for _, from := range states {
		out = append(out, "to-"+from, "from-"+from)
		for _, to := range states {
			if from != to {
				out = append(out, from+"-to-"+to)
			}
		}
	}
	return out
}

// CheckFailOn validates a --fail-on value: "any", a direction
// ("deny-to-approve"), "to-STATE", "from-STATE", "result-changed" or
// "reasons-changed".
func CheckFailOn(pattern string) error {
	switch {
	case pattern == "any" || pattern == NoteReasonsChanged || pattern == NoteResultChanged || pattern == FailOnTruncated:
		return nil
	case strings.HasPrefix(pattern, "to-") && slices.Contains(states, strings.TrimPrefix(pattern, "to-")):
		return nil
	case strings.HasPrefix(pattern, "from-") && slices.Contains(states, strings.TrimPrefix(pattern, "from-")):
		return nil
	}
	from, to, ok := strings.Cut(pattern, "-to-")
	if ok && from != to && slices.Contains(states, from) && slices.Contains(states, to) {
		return nil
	}
	return fmt.Errorf("%q is not a direction: give FROM-to-TO (such as deny-to-approve or allowed-to-refused), to-STATE, from-STATE, result-changed, any, reasons-changed or truncated, with STATE one of %s",
		pattern, strings.Join(states, ", "))
}

// FailOnTruncated, given to --fail-on, fails a replay that left decisions
// out because the log cut their input (Report.Truncated): whoever makes a
// request can have its input cut (a CSR with more names than the log keeps),
// so a gate that must see every decision says so. It is no change, so "any"
// does not include it.
const FailOnTruncated = "truncated"

// Matches reports whether a change is one a --fail-on pattern names. "any"
// is any change of action or of the result; a change of the reason codes
// alone matches only its own name.
func (c Change) Matches(pattern string) bool {
	if c.Direction == "" {
		return pattern == c.Note || (pattern == "any" && c.Note == NoteResultChanged)
	}
	from, to, _ := strings.Cut(c.Direction, "-to-")
	switch {
	case pattern == "any":
		return true
	case strings.HasPrefix(pattern, "to-"):
		return to == strings.TrimPrefix(pattern, "to-")
	case strings.HasPrefix(pattern, "from-"):
		return from == strings.TrimPrefix(pattern, "from-")
	}
	return pattern == c.Direction
}

// CheckReplayable refuses a candidate bundle that calls a builtin OPA marks
// non-deterministic (http.send, net.lookup_ip_addr, time.now_ns, rand.intn,
// uuid.rfc4122, opa.runtime, io.jwt.decode_verify, which reads the clock,
// ...): what such a call returns is not in the logged input, so a replay
// would decide on what it returns now, not on the facts the decision was
// made on, and a change it reports (or misses) would be the clock's or the
// network's. Every reference to one is refused, and then the bundle is
// compiled with OPA's capabilities less those builtins, as `opa build
// --capabilities` would, as a backstop; a bundle that does not compile at
// all is left to the engine, which reports it as it loads the bundle. Two
// builtins that OPA does not mark read the clock too (bundles.RefusedBuiltin),
// and are refused alike. The engine refuses such a bundle at activation as
// well (bundles.ErrBundleBuiltins); a candidate is checked here so that
// replay says why, rather than the engine that loads it.
func CheckReplayable(b *bundle.Bundle) error {
	caps := ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(caps.Builtins, func(bi *ast.Builtin) bool { return bundles.RefusedBuiltin(bi.Name) })
	modules := map[string]*ast.Module{}
	for _, m := range b.Modules {
		if m.Parsed != nil {
			modules[m.Path] = m.Parsed
		}
	}
	// Every reference to a refused builtin, wherever it is (bundles.RefusedCalls).
	var calls []string
	for _, m := range modules {
		calls = append(calls, bundles.RefusedCalls(m)...)
	}
	if len(calls) > 0 {
		slices.Sort(calls)
		return fmt.Errorf("the candidate calls %s, which OPA marks non-deterministic or which read the clock: what it returns is not in the logged input, so a replay would decide on what it returns now rather than on the facts logged; a rule must take every fact from its input", strings.Join(slices.Compact(calls), ", "))
	}
	// A backstop: a candidate that compiles with every builtin and not
	// without the refused ones reaches one in a way the walk above does not
	// see, and is refused too (a `with` whose target is a refused builtin
	// once ended OPA's compilation before its check of undefined functions,
	// hiding every other call: review of 2026-12-05). One that does not
	// compile at all is the engine's to report, as it loads it.
	full := ast.NewCompiler()
	full.Compile(copied(modules))
	if full.Failed() {
		return nil
	}
	reduced := ast.NewCompiler().WithCapabilities(caps)
	reduced.Compile(copied(modules))
	if reduced.Failed() {
		return fmt.Errorf("the candidate does not compile without the builtins that read the clock or the network, so it reaches one: %w", reduced.Errors)
	}
	return nil
}

// copied is a copy of modules for one compilation: a compiler rewrites
// what it is given.
func copied(modules map[string]*ast.Module) map[string]*ast.Module {
	out := make(map[string]*ast.Module, len(modules))
	for path, m := range modules {
		out[path] = m.Copy()
	}
	return out
}

// MaxReplayedList bounds the lists of an input replayed. A manager logs at
// most 100 of a request's names, addresses or attributes (the mask's
// max_logged_items, input.log_truncated saying what it cut) and builds none
// of its other lists longer; a forged entry of 20,000 addresses and as many
// addresses asked for has the kubelet-serving rule format the whole list
// into each refusal's message, gigabytes for a line of a megabyte (review of
// 2026-12-06).
const MaxReplayedList = 1000

// MaxReplayedWork bounds the longest list of an input replayed times the
// input's bytes: a rule formats one message a refused item, each of which
// may quote any other value of the input, a list whole, so a forged entry
// of 1,000 names and one address of 15 MB, or 1,000 addresses of 16 KB, or
// a number of 15 MB digits, made 15 GB of messages within the list bound
// (reviews 172, 174). The input's own bytes count every way of being
// large. A manager logs at most 100 items of a list and cuts its strings
// at 512 characters: a genuine entry of a megabyte (a request's extra of
// five keys of 100 values of 512 four-byte characters, review 173) is 100
// MB of work, under the bound; what passes it makes at most as many bytes
// of messages.
const MaxReplayedWork = 256 << 20

// longestList is the number of items of the longest list or object in a
// decoded JSON value.
func longestList(v any) int {
	longest := 0
	switch v := v.(type) {
	case []any:
		longest = len(v)
		for _, item := range v {
			longest = max(longest, longestList(item))
		}
	case map[string]any:
		// An object's values are a collection to a rule too (some x in
		// obj): counted as a list of its keys (review 175).
		longest = len(v)
		for _, item := range v {
			longest = max(longest, longestList(item))
		}
	}
	return longest
}

// replayable are the paths of the rules a manager decides on and logs, which
// a replay evaluates again; the records (applied, manual) are not decisions.
var replayable = func() map[string]bool {
	out := map[string]bool{engine.PathKubeconfig: true}
	for _, p := range Policies {
		out[p] = p != PathManual
	}
	return out
}()
