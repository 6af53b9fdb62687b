package harness

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
)

// LogService is a decision-log service for tests: it speaks OPA's
// decision-log API (POST /logs, a gzipped JSON array of entries) and keeps
// the decision ids it received, and the bodies as they came, which is what
// a decision-log service stores. While Down it answers 503; with a limit
// (SetMaxEntries) it answers 413 to a body of more entries, as a proxy's
// body size limit does; it answers 400 to a body holding a decision it
// refuses (RefuseDecision).
type LogService struct {
	mu         sync.Mutex
	ids        map[string]bool
	bodies     [][]byte
	down       bool
	posts      int
	limited    bool
	maxEntries int
	refused    map[string]bool
	refuseKey  string
	alternate  bool
	afterTake  func(ids []string)
}

// Alternate makes the service refuse (400) every other body, whatever it
// holds, as a balancer over a backend that takes bodies and one that
// refuses them all does.
func (l *LogService) Alternate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.alternate = true
}

// RefuseInput makes the service refuse (400) every body that holds an
// entry whose input has this key.
func (l *LogService) RefuseInput(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refuseKey = key
}

// AfterTake has f called with the decision ids of each body taken, before
// the service answers.
func (l *LogService) AfterTake(f func(ids []string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.afterTake = f
}

// SetMaxEntries makes the service refuse (413) a body of more than n
// entries; 0 refuses every body, and a negative n none.
func (l *LogService) SetMaxEntries(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limited, l.maxEntries = n >= 0, n
}

// RefuseDecision makes the service refuse (400) every body that holds the
// entry of this decision.
func (l *LogService) RefuseDecision(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refused == nil {
		l.refused = map[string]bool{}
	}
	l.refused[id] = true
}

// Posts is how many uploads were sent, taken or not.
func (l *LogService) Posts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.posts
}

// SetDown makes the service refuse uploads (true) or take them (false).
func (l *LogService) SetDown(down bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = down
}

func (l *LogService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	l.posts++
	down, limited, maxEntries := l.down, l.limited, l.maxEntries
	refuseThis := l.alternate && l.posts%2 == 1
	l.mu.Unlock()
	if refuseThis {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if down {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var events []struct {
		DecisionID string                     `json:"decision_id"`
		Input      map[string]json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(zr).Decode(&events); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if limited && len(events) > maxEntries {
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		return
	}
	l.mu.Lock()
	for _, e := range events {
		_, refusedInput := e.Input[l.refuseKey]
		if l.refused[e.DecisionID] || (l.refuseKey != "" && refusedInput) {
			l.mu.Unlock()
			w.WriteHeader(http.StatusBadRequest)
			return
		}
	}
	if l.ids == nil {
		l.ids = map[string]bool{}
	}
	for _, e := range events {
		l.ids[e.DecisionID] = true
	}
	l.bodies = append(l.bodies, body)
	after := l.afterTake
	l.mu.Unlock()
	if after != nil {
		ids := make([]string, 0, len(events))
		for _, e := range events {
			ids = append(ids, e.DecisionID)
		}
		after(ids)
	}
	w.WriteHeader(http.StatusNoContent)
}

// Has reports whether the entry with this decision id was received.
func (l *LogService) Has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ids[id]
}

// Received is how many distinct entries were received.
func (l *LogService) Received() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// Bodies are the bodies of the uploads taken, in order, gzipped as they came.
func (l *LogService) Bodies() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.bodies)
}
