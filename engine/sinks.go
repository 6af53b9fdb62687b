package engine

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"gopkg.in/natefinch/lumberjack.v2"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ichor-dev/ichor-policy/internal/jsonappend"
)

// sinksName is the decision-log plugin of the engine's own sinks: the
// console, a file and a decision-log service. OPA's decision-log plugin masks
// each entry and hands it here.
//
// The console is the engine's rather than OPA's console sink because OPA's
// converts each entry's input and result to generic values through JSON
// before its logger encodes the whole entry again: on the path of every
// decision, that cost about as much as the mask. The engine writes the same
// line, encoded once.
//
// The service upload is the engine's rather than OPA's own because the log is
// an audit trail and OPA's upload cannot say how many entries it lost at
// shutdown (it buffers compressed chunks of several entries, which it does
// not count), and drops an entry above its size limit under a generic
// encoding-failure counter. Here every entry is counted once: uploaded, or
// dropped with its cause (buffer_full, oversized, shutdown).
const sinksName = "ichor_decision_log_sinks"

// Upload timing: a batch at least every uploadInterval, at most
// uploadBatchEvents entries or about uploadBatchBytes of JSON in one POST, and
// after a failure a backoff from uploadInterval up to uploadMaxBackoff.
const (
	uploadInterval    = time.Second
	uploadMaxBackoff  = 30 * time.Second
	uploadBatchEvents = 1000
	uploadBatchBytes  = 4 << 20
	uploadTimeout     = 10 * time.Second
	// uploadRegrowAfter is how many uploads of batchLimit entries in a
	// row the service must take before a limit it lowered (413) is doubled
	// again towards uploadBatchEvents: a service with a body limit then
	// refuses one upload in that many, not every other one.
	uploadRegrowAfter = 64
)

// refusedStatus: the answers of a service that refuses the body it was sent
// rather than being away: 413 above its size limit, 400 or 422 for what it
// cannot take. A batch so refused is split in halves, sent at once, until
// the service takes them (a 413 also lowers the batch limit, batchLimit).
// The first entry, refused on its own, is held, and another is sent on its
// own (the newest, or in turn one of the oldest); if the service takes it,
// the first is sent on its own again and, refused twice in a row right
// then, dropped (cause refused): the service takes bodies and refuses that
// one, which would otherwise stop every upload after it. A service that
// refuses the other too refuses every body, as far as can be told (a
// proxy's 400 to plain http, a gateway's): the entries wait, as for any
// failure, and none is dropped when it comes back. Before review 202, every
// answer was a failure to retry with the same batch, and the buffer dropped
// the rest as buffer_full; reviews 204 to 209 found the ways a simpler
// scheme lost entries or stalled behind them.
func refusedStatus(code int) bool {
	return code == http.StatusRequestEntityTooLarge || code == http.StatusBadRequest || code == http.StatusUnprocessableEntity
}

// errRefusedBatch: the service refused a body (refusedStatus) that is sent
// again at once in a smaller or another shape: half of a batch, or the
// newest entry on its own to tell whether the service refuses the first or
// every body.
type errRefusedBatch struct {
	status  string
	entries int
}

func (e *errRefusedBatch) Error() string {
	if e.entries == 1 {
		return fmt.Sprintf("the decision-log service refused the first entry on its own (%s): the newest is sent on its own, to tell whether it refuses that entry or every body", e.status)
	}
	return fmt.Sprintf("the decision-log service refused a batch of %d entries (%s): it is sent again in halves", e.entries, e.status)
}

// errAgain: the upload's answer is followed by another at once, said
// already where it was decided (another taken on its own, the first refused
// once right after, or dropped as refused).
var errAgain = errors.New("another upload at once")

// The decision-log file's rotation by default: at 100 MiB the file is
// renamed with the time in its name and a new one begun, and the five newest
// rotated files are kept.
const (
	DefaultDecisionLogFileMaxMiB     = 100
	DefaultDecisionLogFileMaxBackups = 5
)

// MaxDecisionLogEntryBytes is the largest entry, as JSON, the upload sink
// takes; a larger one is dropped and counted (cause oversized). The mask
// (policy/system/log) keeps entries far below it.
const MaxDecisionLogEntryBytes = 1 << 20

// decisionLogBufferBytes bounds the JSON the upload buffer holds, whatever
// its entries: 10,000 entries of a megabyte would be 10 GiB. The entries of
// a busy manager are a few kilobytes, so BufferEvents binds first.
const decisionLogBufferBytes = 64 << 20

type sinksConfig struct {
	// Console, when set, writes every entry as one JSON line to the engine's
	// console writer (Options.DecisionLog), in the shape of OPA's console
	// sink.
	Console bool `json:"console,omitempty"`
	// File, when set, receives every entry as one JSON line.
	File string `json:"file,omitempty"`
	// FileMaxMiB is the size at which the file is rotated (renamed with the
	// time in its name, and a new one begun); FileMaxBackups is how many
	// rotated files are kept, the oldest removed beyond it.
	FileMaxMiB     int `json:"file_max_mib,omitempty"`
	FileMaxBackups int `json:"file_max_backups,omitempty"`
	// URL, when set, is a service speaking OPA's decision-log API
	// (POST {URL}/logs, a gzipped JSON array of entries).
	URL string `json:"url,omitempty"`
	// TokenFile, when set, holds the bearer token the service is sent,
	// read at each upload.
	TokenFile string `json:"token_file,omitempty"`
	// BufferEvents bounds the entries held for the service.
	BufferEvents int `json:"buffer_events,omitempty"`
}

type sinksFactory struct{ engine *Engine }

func (f *sinksFactory) Validate(_ *plugins.Manager, config []byte) (any, error) {
	var c sinksConfig
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fmt.Errorf("decision-log sinks: %w", err)
	}
	if !c.Console && c.File == "" && c.URL == "" {
		return nil, fmt.Errorf("decision-log sinks: neither the console, a file nor a URL")
	}
	if c.BufferEvents <= 0 {
		c.BufferEvents = DefaultDecisionLogBufferEvents
	}
	if c.FileMaxMiB <= 0 {
		c.FileMaxMiB = DefaultDecisionLogFileMaxMiB
	}
	if c.FileMaxBackups <= 0 {
		c.FileMaxBackups = DefaultDecisionLogFileMaxBackups
	}
	return c, nil
}

func (f *sinksFactory) New(m *plugins.Manager, config any) plugins.Plugin {
	return &sinks{manager: m, config: config.(sinksConfig), engine: f.engine, console: f.engine.console, wake: make(chan struct{}, 1), batchLimit: uploadBatchEvents}
}

type sinks struct {
	manager *plugins.Manager
	config  sinksConfig
	engine  *Engine
	client  *http.Client

	consoleMu sync.Mutex
	console   io.Writer

	fileMu sync.Mutex
	f      io.WriteCloser
	// torn: the file's last line was cut short (a write that failed part
	// way, a full volume; a process killed mid-write), so the next entry
	// begins on a line of its own rather than glued to it, unreadable
	// (review of 2026-12-06).
	torn bool

	mu      sync.Mutex
	pending [][]byte
	// pendingBytes is the JSON pending holds: bounded by
	// decisionLogBufferBytes as well as its entries by BufferEvents.
	pendingBytes int
	// inflight is how many entries at the front of pending an upload is
	// sending: a full buffer drops the oldest of the others.
	inflight int
	// batchLimit is the most entries one upload sends: uploadBatchEvents,
	// halved at a 413 and doubled back after uploadRegrowAfter uploads of
	// that many taken since (atLimit). split, when not 0, bounds the
	// uploads after a refused batch (refusedStatus): halved at each
	// refusal, doubled at each upload taken. held: the first pending entry
	// was refused on its own (refusedStatus); confirmed: the service took
	// another on its own just before (for the next upload only); probes:
	// the tries of another on its own that were refused too; cursor: the
	// next of the oldest to try so; strikes: the first's refusals right
	// after a taking (dropped at the second in a row). A full buffer does
	// not drop the entry held (unless it holds one entry only). Only
	// uploads change these, and Log the entry held that it drops.
	batchLimit int
	atLimit    int
	split      int
	held       bool
	confirmed  bool
	strikes    int
	probes     int
	cursor     int
	// closed: Stop has counted what was pending as dropped; an entry logged
	// after (a webhook's decision still running at shutdown) is counted
	// dropped at once rather than queued for an upload that is over.
	closed bool
	wake   chan struct{}
	stop   context.CancelFunc
	done   chan struct{}
}

var _ logs.Logger = (*sinks)(nil)

func (s *sinks) Start(context.Context) error {
	if s.config.File != "" {
		// Opened here once, so that a path that cannot be written fails the
		// start rather than the first decision; the rotating writer opens it
		// again on its first write.
		torn, err := endsTorn(s.config.File)
		if err != nil {
			s.manager.UpdatePluginStatus(sinksName, &plugins.Status{State: plugins.StateErr, Message: err.Error()})
			return fmt.Errorf("decision-log file: %w", err)
		}
		s.fileMu.Lock()
		s.f = &lumberjack.Logger{Filename: s.config.File, MaxSize: s.config.FileMaxMiB, MaxBackups: s.config.FileMaxBackups}
		s.torn = torn
		s.fileMu.Unlock()
	}
	if s.config.URL != "" {
		s.client = uploadClient()
		ctx, cancel := context.WithCancel(context.Background())
		s.stop, s.done = cancel, make(chan struct{})
		go s.uploadLoop(ctx)
	}
	s.manager.UpdatePluginStatus(sinksName, &plugins.Status{State: plugins.StateOK})
	return nil
}

// Stop closes the file and, within ctx's deadline, uploads what is pending;
// what is left is counted as dropped (cause shutdown).
func (s *sinks) Stop(ctx context.Context) {
	s.fileMu.Lock()
	if s.f != nil {
		_ = s.f.Close()
		s.f = nil
	}
	s.fileMu.Unlock()
	if s.stop == nil {
		return
	}
	s.stop()
	<-s.done
	if _, ok := ctx.Deadline(); ok {
		for s.pendingCount() > 0 && ctx.Err() == nil {
			var refused *errRefusedBatch
			if err := s.uploadBatch(ctx); err != nil && !errors.As(err, &refused) && !errors.Is(err, errAgain) {
				select {
				case <-ctx.Done():
				case <-time.After(uploadInterval):
				}
			}
		}
	}
	// Counted and cleared in one step, so that an entry logged meanwhile is
	// either among those counted here or counted by Log as closed.
	s.mu.Lock()
	n := len(s.pending)
	s.pending, s.pendingBytes, s.closed = nil, 0, true
	s.mu.Unlock()
	if n > 0 {
		s.drop("shutdown", n)
		s.engine.notes.WithFields(map[string]any{"entries": n, "url": redactedURL(s.config.URL)}).Error("Decision-log entries not uploaded at shutdown; they are lost.")
	}
}

func (s *sinks) Reconfigure(context.Context, any) {}

// Log writes one entry to the console and the file and queues it for the
// service. An entry the file cannot take is counted as dropped, and the
// error fails the decision: a decision that is not logged is not acted on.
// The console has it all the same, the last copy of a record the file
// refused until a later try is taken (so a record tried again may be on the
// console more than once: review 18 kept that over none). The upload is
// asynchronous; its drops are counted by cause.
func (s *sinks) Log(ctx context.Context, event logs.EventV1) error {
	if reached, ok := ctx.Value(entryReached{}).(*atomic.Bool); ok {
		reached.Store(true)
	}
	if s.config.Console {
		s.writeConsole(event)
	}
	if s.config.File != "" {
		if err := s.writeFile(event); err != nil {
			s.engine.metrics.dropped("file")
			return fmt.Errorf("decision-log file %s: %w", s.config.File, err)
		}
	}
	if s.config.URL == "" {
		return nil
	}
	b, err := json.Marshal(event)
	if err != nil || len(b) > MaxDecisionLogEntryBytes {
		s.drop("oversized", 1)
		return nil
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.drop("shutdown", 1)
		return nil
	}
	dropped := 0
	// The oldest not being sent go until this one fits: the newest say most
	// about now.
	keep := s.inflight
	if s.held && s.config.BufferEvents > 1 {
		keep = max(keep, 1)
	}
	for (len(s.pending)+1 > s.config.BufferEvents || s.pendingBytes+len(b) > decisionLogBufferBytes) && len(s.pending) > keep {
		if keep == 0 {
			s.releaseLocked()
		}
		s.pendingBytes -= len(s.pending[keep])
		s.pending = append(s.pending[:keep], s.pending[keep+1:]...)
		dropped++
	}
	if len(s.pending) < s.config.BufferEvents && s.pendingBytes+len(b) <= decisionLogBufferBytes {
		s.pending = append(s.pending, b)
		s.pendingBytes += len(b)
	} else {
		dropped++ // every slot is being sent: this one cannot wait
	}
	full := len(s.pending) >= uploadBatchEvents
	s.mu.Unlock()
	if dropped > 0 {
		s.drop("buffer_full", dropped)
	}
	if full {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

func (s *sinks) writeFile(event logs.EventV1) error {
	buf := lineBuffers.Get().(*[]byte)
	defer putLineBuffer(buf)
	line, err := jsonappend.Value((*buf)[:0], entryFields(event))
	*buf = line
	if err != nil {
		return err
	}
	line = append(line, '\n')
	*buf = line
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if s.f == nil {
		return fmt.Errorf("closed")
	}
	if s.torn {
		if _, err := s.f.Write(newline); err != nil {
			return fmt.Errorf("end the line an earlier write cut short: %w", err)
		}
		s.torn = false
	}
	n, err := s.f.Write(line)
	if err != nil && n > 0 {
		s.torn = true
	}
	return err
}

var newline = []byte{'\n'}

// endsTorn opens the decision-log file (made if absent: a path that cannot
// be written fails the start rather than the first decision; the rotating
// writer opens it again on its first write) and reports whether it ends
// within a line: the last write of a process killed or of a full volume.
func endsTorn(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_RDWR, 0o600)
	if err != nil {
		return false, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || info.Size() == 0 {
		return false, err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, info.Size()-1); err != nil {
		return false, fmt.Errorf("read the end of %s: %w", path, err)
	}
	return last[0] != '\n', nil
}

// lineBuffers hold the console's and the file's lines while they are
// written (the writers do not keep them): a logged decision's line is a few
// KiB, allocated anew and grown for each entry otherwise.
var lineBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, 4<<10)
	return &b
}}

// putLineBuffer returns a line's buffer, unless an unusually large entry grew
// it: the pool keeps no megabyte buffers for ordinary lines.
func putLineBuffer(b *[]byte) {
	if cap(*b) <= 64<<10 {
		lineBuffers.Put(b)
	}
}

// writeConsole writes the entry to the console, one line in one write. The
// container runtime keeps it; a write that fails is counted (sink stdout)
// and does not fail the decision, as OPA's console sink did not.
func (s *sinks) writeConsole(event logs.EventV1) {
	buf := lineBuffers.Get().(*[]byte)
	defer putLineBuffer(buf)
	line, err := consoleLine((*buf)[:0], event, time.Now())
	*buf = line
	if err == nil {
		line = append(line, '\n')
		*buf = line
		s.consoleMu.Lock()
		_, err = s.console.Write(line)
		s.consoleMu.Unlock()
	}
	if err != nil {
		s.engine.metrics.dropped("stdout")
	}
}

func (s *sinks) uploadLoop(ctx context.Context) {
	defer close(s.done)
	// After a failure: uploadInterval doubled at each further failure, at
	// most uploadMaxBackoff, and uploadInterval again after a success.
	failed := func() wait.Backoff {
		return wait.Backoff{Duration: 2 * uploadInterval, Factor: 2, Cap: uploadMaxBackoff, Steps: math.MaxInt32}
	}
	backoff, next := failed(), uploadInterval
	failing := false
	for {
		// While the service fails, only the backoff starts the next
		// attempt: a full buffer wakes the loop at every decision, and
		// each wake-up was an upload to a service that is away, a gzip of
		// megabytes each time (review 202 F1).
		wake := s.wake
		if failing {
			wake = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		case <-wake:
		}
		err := s.uploadBatch(ctx)
		var refused *errRefusedBatch
		switch {
		case err == nil:
			backoff, next, failing = failed(), uploadInterval, false
			if s.pendingCount() >= s.currentBatchLimit() {
				// A whole batch waits (a backlog, or a lowered limit):
				// the next goes at once.
				next = 0
			}
		case ctx.Err() != nil:
			return
		case errors.Is(err, errAgain):
			// The service took a body: the backoff starts afresh.
			backoff, next, failing = failed(), 0, false
		case errors.As(err, &refused):
			// The service is up and refused this body: a smaller one,
			// or another, goes at once.
			next, failing = 0, false
			s.engine.notes.WithFields(map[string]any{"url": redactedURL(s.config.URL), "error": err.Error(), "pending": s.pendingCount(), "batch_limit": s.currentBatchLimit()}).Warn("Decision-log upload refused; the entries are kept and sent again, in smaller batches or one at a time.")
		default:
			next, failing = backoff.Step(), true
			s.engine.notes.WithFields(map[string]any{"url": redactedURL(s.config.URL), "error": err.Error(), "pending": s.pendingCount(), "retry_in": next.String()}).Error("Decision-log upload failed; the entries are kept and sent again.")
		}
	}
}

// uploadBatch sends the oldest pending entries and, once the service took
// them, forgets them. Entries stay pending when it fails.
func (s *sinks) uploadBatch(ctx context.Context) error {
	s.mu.Lock()
	limit, start := s.limitLocked(), 0
	switch {
	case s.held && !s.confirmed && len(s.pending) > 1:
		// The first was refused on its own: another goes on its own, the
		// newest, and at every other try one of the oldest, walking up
		// from the second whatever is logged meanwhile. Tried alone, the
		// newest let entries the service refuses by their content, logged
		// one after another, stand for every body (reviews 207 F2, 208
		// F1). All before it are in flight, so a full buffer drops none
		// of them.
		i := len(s.pending) - 1
		if s.probes%2 == 1 {
			if s.cursor < 1 || s.cursor >= len(s.pending) {
				s.cursor = 1
			}
			i = s.cursor
			s.cursor++
		}
		limit, start = 1, i
	case s.held:
		// The first on its own again: the service took another on its
		// own just before, or only the first waits.
		limit = 1
	}
	// What the service took counts for this upload only: a failure
	// between the two (a 503, a cut) leaves a service that may refuse
	// every body when it comes back (review 207 F1).
	confirmed := s.confirmed
	s.confirmed = false
	if !confirmed {
		s.strikes = 0
	}
	n, size := 0, 0
	for start+n < len(s.pending) && n < limit && (n == 0 || size+len(s.pending[start+n]) <= uploadBatchBytes) {
		size += len(s.pending[start+n])
		n++
	}
	batch := s.pending[start : start+n : start+n]
	s.inflight = start + n
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight = 0
		s.mu.Unlock()
	}()
	if n == 0 {
		return nil
	}
	var body bytes.Buffer
	zw := gzip.NewWriter(&body)
	_, _ = zw.Write([]byte{'['})
	for i, b := range batch {
		if i > 0 {
			_, _ = zw.Write([]byte{','})
		}
		_, _ = zw.Write(b)
	}
	_, _ = zw.Write([]byte{']'})
	if err := zw.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, uploadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(s.config.URL, "/")+"/logs", &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	if s.config.TokenFile != "" {
		// Read at each upload: a rotated Secret's token is used at the
		// next. One that cannot be read fails the upload as the service's
		// refusal would, the entries kept.
		token, err := decisionLogToken(s.config.TokenFile)
		if err != nil {
			s.engine.metrics.uploadFailed()
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.engine.metrics.uploadFailed()
		return err
	}
	_ = resp.Body.Close()
	// The status line's text is the service's: cut, it is logged at each
	// retry.
	status := LoggedName(resp.Status)
	if resp.StatusCode/100 == 2 {
		return s.taken(start, n, size)
	}
	s.engine.metrics.uploadFailed()
	if !refusedStatus(resp.StatusCode) {
		return fmt.Errorf("the decision-log service answered %s", status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case n > 1:
		// Halves, at once, until the service takes them or the first is
		// refused on its own.
		if resp.StatusCode == http.StatusRequestEntityTooLarge {
			s.batchLimit, s.atLimit = max(1, min(s.batchLimit, n/2)), 0
		}
		s.split = max(1, n/2)
		return &errRefusedBatch{status: status, entries: n}
	case start > 0:
		// Another refused on its own too: the service refuses every
		// body, as far as can be told. Both wait; the next try sends an
		// older one.
		s.probes++
		return fmt.Errorf("the decision-log service refused the first entry and another, each on its own (%s): it refuses every body, not one entry; they are kept", status)
	case s.held && confirmed && s.strikes == 0:
		// Refused right after the service took another: once more at
		// once, so that a balancer alternating a backend that takes
		// bodies with one that refuses them all does not have a good
		// entry dropped (review 209 F2).
		s.strikes, s.confirmed = 1, true
		return errAgain
	case s.held && confirmed:
		// Refused on its own before, and twice right after the service
		// took another on its own: it would stop every upload after it
		// for good. The console holds it.
		id := entryDecisionID(batch[0])
		s.forgetLocked(0, 1, size)
		s.releaseLocked()
		s.drop("refused", 1)
		s.engine.notes.WithFields(map[string]any{"url": redactedURL(s.config.URL), "decision_id": id, "status": status}).Error("Decision-log entry refused by the service on its own, before and after it took another; it is dropped from the upload.")
		return errAgain
	case s.held || len(s.pending) == 1:
		s.held = true
		return fmt.Errorf("the decision-log service refused the only entry waiting, on its own (%s); it is kept until a newer one shows whether the service takes any", status)
	default:
		s.held = true
		return &errRefusedBatch{status: status, entries: 1}
	}
}

// taken forgets the n entries from start that the service took. The
// newest taken on its own, while the first is held, has the first sent on
// its own again (errAgain).
func (s *sinks) taken(start, n, size int) error {
	s.mu.Lock()
	s.forgetLocked(start, n, size)
	var again error
	switch {
	case start > 0:
		s.confirmed, again = true, errAgain
	case s.held:
		// The first taken after all: its refusal was not its own.
		s.releaseLocked()
	}
	if s.split > 0 {
		if s.split *= 2; s.split >= s.batchLimit {
			s.split = 0
		}
	}
	if n == s.batchLimit && s.batchLimit < uploadBatchEvents {
		if s.atLimit++; s.atLimit >= uploadRegrowAfter {
			s.batchLimit, s.atLimit = min(2*s.batchLimit, uploadBatchEvents), 0
		}
	}
	s.mu.Unlock()
	s.engine.metrics.uploaded(n)
	return again
}

// forgetLocked removes the n pending entries from start, of size bytes,
// once sent or dropped.
func (s *sinks) forgetLocked(start, n, size int) {
	// Cleared: the entries sent would stay referenced from the slice's
	// array, beyond the bytes bound, until it is reallocated.
	clear(s.pending[start : start+n])
	if start == 0 {
		s.pending = s.pending[n:]
	} else {
		end := len(s.pending)
		s.pending = append(s.pending[:start], s.pending[start+n:]...)
		clear(s.pending[len(s.pending):end])
	}
	s.pendingBytes -= size
}

// releaseLocked ends the hold of the first pending entry (dropped, taken,
// or gone from a full buffer) and what its tries counted.
func (s *sinks) releaseLocked() {
	s.held, s.confirmed, s.probes, s.cursor, s.strikes = false, false, 0, 0, 0
}

// limitLocked is the most entries the next upload sends.
func (s *sinks) limitLocked() int {
	if s.split > 0 {
		return min(s.batchLimit, s.split)
	}
	return s.batchLimit
}

func (s *sinks) currentBatchLimit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limitLocked()
}

// entryDecisionID is the decision id of a pending entry (its JSON), for the
// log line of its drop; empty if it cannot be read.
func entryDecisionID(entry []byte) string {
	var e struct {
		DecisionID string `json:"decision_id"`
	}
	_ = json.Unmarshal(entry, &e)
	return LoggedName(e.DecisionID)
}

func (s *sinks) pendingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

func (s *sinks) drop(cause string, n int) {
	s.engine.metrics.uploadDrop(cause, n)
}

// entryFields is an event in the console sink's shape.
func entryFields(e logs.EventV1) map[string]any {
	m := map[string]any{
		"msg":         "Decision Log",
		"type":        "openpolicyagent.org/decision_logs",
		"decision_id": e.DecisionID,
		"path":        e.Path,
		"labels":      e.Labels,
		"bundles":     e.Bundles,
		"timestamp":   e.Timestamp,
		"time":        e.Timestamp,
	}
	if e.Input != nil {
		m["input"] = *e.Input
	}
	if e.Result != nil {
		m["result"] = *e.Result
	}
	if e.Error != nil {
		m["error"] = e.Error
	}
	if len(e.Erased) > 0 {
		m["erased"] = e.Erased
	}
	if len(e.Masked) > 0 {
		m["masked"] = e.Masked
	}
	return m
}

// consoleLine is an entry as OPA's console sink writes it: the fields its
// plugin hands its logger (logs.eventToFields in OPA), and the logger's
// level, msg and time (logrus's JSON, the time to the second), with the keys
// in order, encoded once, appended to dst.
func consoleLine(dst []byte, e logs.EventV1, now time.Time) ([]byte, error) {
	m := map[string]any{
		"level": "info", "msg": "Decision Log", "time": now.Format(time.RFC3339),
		"type": logs.DecisionLogType, "timestamp": e.Timestamp.UTC().Format(time.RFC3339Nano), "decision_id": e.DecisionID,
	}
	put := func(key string, v any, present bool) {
		if present {
			m[key] = v
		}
	}
	put("batch_decision_id", e.BatchDecisionID, e.BatchDecisionID != "")
	put("trace_id", e.TraceID, e.TraceID != "")
	put("span_id", e.SpanID, e.SpanID != "")
	put("labels", e.Labels, len(e.Labels) > 0)
	put("revision", e.Revision, e.Revision != "")
	put("bundles", e.Bundles, len(e.Bundles) > 0)
	put("path", e.Path, e.Path != "")
	put("query", e.Query, e.Query != "")
	for key, v := range map[string]*any{"input": e.Input, "result": e.Result, "mapped_result": e.MappedResult, "nd_builtin_cache": e.NDBuiltinCache} {
		if v != nil {
			m[key] = *v
		}
	}
	put("intermediate_results", e.IntermediateResults, len(e.IntermediateResults) > 0)
	put("erased", e.Erased, len(e.Erased) > 0)
	put("masked", e.Masked, len(e.Masked) > 0)
	if e.Error != nil {
		m["error"] = e.Error.Error()
	}
	put("requested_by", e.RequestedBy, e.RequestedBy != "")
	put("metrics", e.Metrics, len(e.Metrics) > 0)
	put("req_id", e.RequestID, e.RequestID != 0)
	put("request_context", e.RequestContext, e.RequestContext != nil)
	put("rule_labels", e.RuleLabels, len(e.RuleLabels) > 0)
	put("custom", e.Custom, len(e.Custom) > 0)
	return jsonappend.Value(dst, m)
}

// uploadClient is the decision-log service's client. An upload sent over
// https is not sent again over plain http on a redirect, where anyone on the
// path could read every decision (and the URL's password) or drop it; nor is
// it followed as net/http follows a 301, 302 or 303, as a GET without its
// body, whose 2xx would have its entries taken for uploaded and lost.
func uploadClient() *http.Client {
	downgrade := noDowngrade("decision-log entries sent over https are not sent over plain http")
	// Go takes 10 MiB of headers an answer by default; a service's are a
	// few hundred bytes, and its status line is logged at each retry.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxResponseHeaderBytes = maxServiceHeaderBytes
	return &http.Client{Timeout: uploadTimeout, Transport: transport, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if err := downgrade(req, via); err != nil {
			return err
		}
		// Only to the service itself (another path of it): a redirect
		// elsewhere would send the decisions, and have them counted as
		// uploaded, wherever whoever answers for the service chooses.
		if req.URL.Scheme != via[0].URL.Scheme || req.URL.Host != via[0].URL.Host {
			return fmt.Errorf("%s redirects to another host (%s): the entries are not sent there", via[0].URL.Redacted(), LoggedName(req.URL.Host))
		}
		if req.Method != via[0].Method {
			return fmt.Errorf("%s redirects to %s as a %s: the entries are not sent there, and not taken for uploaded", via[0].URL.Redacted(), LoggedName(req.URL.Redacted()), req.Method)
		}
		return nil
	}}
}

// maxServiceHeaderBytes bounds the headers of the decision-log service's
// answer: an API server's are a few hundred bytes.
const maxServiceHeaderBytes = 64 << 10

// redactedURL is the service's URL as a log line may show it: a password in
// it (https://user:password@host, the one way to give the service a
// credential) is not.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}
