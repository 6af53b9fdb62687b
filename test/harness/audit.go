package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

// auditPolicy records every request's metadata (user, verb, URI, status):
// enough to tell who did what, without bodies.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

// AuditEvent is what a test reads of an audit.k8s.io/v1 Event.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// AuditEvents reads the API server's audit log (Options.AuditLog) and
// returns the events keep accepts, in order.
func (e *Env) AuditEvents(keep func(AuditEvent) bool) ([]AuditEvent, error) {
	if e.AuditLogPath == "" {
		return nil, fmt.Errorf("harness: no audit log: start the environment with Options.AuditLog")
	}
	f, err := os.Open(e.AuditLogPath)
	if err != nil {
		return nil, fmt.Errorf("harness: audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // a line being written
		}
		if keep(ev) {
			out = append(out, ev)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("harness: audit log: %w", err)
	}
	return out, nil
}
