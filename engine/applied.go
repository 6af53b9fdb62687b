package engine

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
)

// PathApplied is the path of the record, in the decision log, that a
// decision was carried out. The path is the one the record had when a rule
// (policy/system/applied) wrote it, so that dashboards over
// ichor_policy_decisions_total and readers of older versions keep working.
const PathApplied = "system/applied/record"

// The outcomes of the write a record reports (Applied.Outcome).
const (
	// AppliedWritten: the manager's own write of the verdict succeeded.
	AppliedWritten = "written"
	// AppliedObserved: the manager did not see its own write succeed, and
	// the object, read again once decided, shows this decision: the write
	// was answered with an error that may have been applied all the same (a
	// timeout, a lost connection, a 5xx; not a refusal such as a conflict
	// or a 403), or its record had failed, or a replica that took the
	// cluster over found it written shortly before by one that may not have
	// recorded it.
	AppliedObserved = "observed"
)

// Applied is what a record of an applied verdict says: which decision was
// carried out, on which object (as "csr/NAME",
// "taloscredentialrequest/NS/NAME" or "clusterrolebinding/NAME", and its
// uid), by what action, and how the manager knows (Outcome).
type Applied struct {
	DecisionID string `json:"decision_id"`
	Object     string `json:"object"`
	UID        string `json:"uid"`
	Action     string `json:"action"`
	Outcome    string `json:"outcome"`
	// Adopted marks a record made by a replica that took the cluster over:
	// it names the decision the request's condition names, which whoever
	// may write conditions there (a tenant, on its own API server) chose,
	// so a reader applies it only to a decision its log holds about that
	// request (review 190). The manager's records of its own writes name
	// its own decisions. Always written, false too: a reader takes a
	// record without it (of a release before) that says observed as
	// possibly a take-over's (review 192).
	Adopted bool `json:"adopted"`
}

// MaxLoggedValue is the mask's max_logged_value_length
// (policy/system/log/data.json): the longest string of the names a
// requester or a tenant's API server chooses that the decision log keeps
// whole.
const MaxLoggedValue = 512

// LoggedName is name as the decision log keeps it, cut as the mask cuts a
// capped string (its first MaxLoggedValue characters and its length in
// characters, as Rego's count and substring measure a string).
func LoggedName(name string) string {
	n := utf8.RuneCountInString(name)
	if n <= MaxLoggedValue {
		return name
	}
	return fmt.Sprintf("%s... (%d bytes)", string([]rune(name)[:MaxLoggedValue]), n)
}

// LoggedObject is an Applied.Object as the decision log keeps it: its last
// part, the name (a CSR's, which Kubernetes does not bound), cut as the
// mask cuts the name in the decision's input, so that a record names the
// object as its decision does.
func LoggedObject(object string) string {
	i := strings.LastIndexByte(object, '/')
	return object[:i+1] + LoggedName(object[i+1:])
}

// RecordApplied writes to the decision log that a decision was carried out.
//
// The record is a plain entry, not a decision: no rule is evaluated for it
// (it decides nothing, and a rule's evaluation cost as much again as a
// verdict's mask and entry). It is handed, like every entry, to the engine's
// sinks (the console, the file, the service), with its own id, the labels, the time
// and the active bundle's revision, and counted by
// ichor_policy_decisions_total with kind="record" unless the file refused it. The mask is not applied:
// the record holds none of what the mask hides, only the facts Go gives
// here, and cuts the object's name and UID as the mask cuts them in a
// decision (LoggedObject, LoggedName). An entry the file sink cannot take is an error, as for a
// decision.
func (e *Engine) RecordApplied(ctx context.Context, a Applied) error {
	start := time.Now()
	if a.Outcome != AppliedWritten && a.Outcome != AppliedObserved {
		return fmt.Errorf("record of decision %s on %s: outcome %q is not %q or %q", a.DecisionID, a.Object, a.Outcome, AppliedWritten, AppliedObserved)
	}
	id, err := uuid.NewRandom()
	if err != nil {
		return fmt.Errorf("record of decision %s on %s: entry id: %w", a.DecisionID, a.Object, err)
	}
	a.Object, a.UID = LoggedObject(a.Object), LoggedName(a.UID)
	var input any = a
	event := logs.EventV1{
		Labels:     e.mgr.Labels(),
		DecisionID: id.String(),
		Bundles:    map[string]logs.BundleInfoV1{BundleName: {Revision: e.Revision()}},
		Path:       PathApplied,
		Input:      &input,
		Timestamp:  start.UTC(),
	}
	if s, ok := e.mgr.Plugin(sinksName).(logs.Logger); ok {
		err = s.Log(ctx, event)
	}
	if err != nil {
		// Counted as dropped by the sink, and made again by its caller:
		// counted here once it is taken.
		return fmt.Errorf("record of decision %s on %s: %w", a.DecisionID, a.Object, err)
	}
	if e.metrics != nil {
		e.metrics.record(a.Action, time.Since(start))
	}
	return nil
}
