package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// DecisionLog is an in-memory decision log: the engine writes to it from its
// own goroutines, a test reads it.
type DecisionLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *DecisionLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String is everything written so far.
func (l *DecisionLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Decisions decodes the entries written so far as E, oldest first, keeping
// those keep accepts (every one when keep is nil). A line that does not
// decode as E is skipped: the log also holds OPA's own lines.
func Decisions[E any](l *DecisionLog, keep func(E) bool) []E {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []E
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<24)
	for sc.Scan() {
		var e E
		if json.Unmarshal(sc.Bytes(), &e) == nil && (keep == nil || keep(e)) {
			out = append(out, e)
		}
	}
	return out
}

// FindDecision waits, up to 5 s, for the entry with the decision id and
// decodes it as E. The engine hands entries to its sinks as it decides; a
// moment may pass before one is written.
func FindDecision[E any](t testing.TB, l *DecisionLog, id string) E {
	t.Helper()
	if id == "" {
		t.Fatal("no decision id to find")
	}
	withID := func(raw json.RawMessage) bool {
		var e struct {
			DecisionID string `json:"decision_id"`
		}
		return json.Unmarshal(raw, &e) == nil && e.DecisionID == id
	}
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if found := Decisions(l, withID); len(found) > 0 {
			var out E
			if err := json.Unmarshal(found[0], &out); err != nil {
				t.Fatalf("decision %s does not decode: %v", id, err)
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("decision %s is not in the log", id)
		}
		<-tick.C
	}
}

// AdmissionInput is the input of ichor/credentials/admission for user's
// request of a talosconfig-reader credential for cluster demo in namespace
// team-a, granted by RBAC, as policy/ichor/credentials/credentials_test.rego
// writes it: the rule admits it, or refuses it (ClusterNotFound) with
// clusterExists false.
func AdmissionInput(user string, clusterExists bool) map[string]any {
	return map[string]any{
		"operation": "CREATE", "dry_run": false,
		"user":      map[string]any{"username": user, "uid": "5b2c", "groups": []string{"ichor:operators", "system:authenticated"}, "extra": map[string]any{}},
		"requester": map[string]any{"username": user, "uid": "5b2c", "groups": []string{"ichor:operators", "system:authenticated"}, "extra": map[string]any{}},
		"request": map[string]any{
			"name": "talosconfig-x7k2p", "namespace": "team-a", "cluster": "demo", "purpose": "talosconfig-reader",
			"public_key": map[string]any{"parsed": true, "algorithm": "Ed25519", "bits": 256, "error": ""},
		},
		"authorization": map[string]any{
			"user": user, "groups": []string{"system:authenticated", "ichor:operators"},
			"verb": "download", "group": "ichor.dev", "resource": "talosclusters", "subresource": "talosconfig-reader",
			"namespace": "team-a", "name": "demo", "allowed": true, "reason": "RBAC: allowed", "evaluation_error": "",
		},
		"cluster": map[string]any{"exists": clusterExists, "kubeconfig_ref": false},
	}
}
