// Package decisionlog reads the decision log the engine writes, selects
// decisions from it, and replays the logged inputs against a candidate
// bundle to show which decisions a policy change would change.
//
// A log is read as it reaches an operator: from `kubectl logs` (or the
// manager pods' logs read directly, see Cluster), where the decisions in
// OPA's console shape (standard output) are interleaved with the
// controllers' and OPA's own logs (standard error); or from a decision-log
// service, which stores OPA's events as the engine uploads them (gzipped
// JSON arrays). Lines that are not decision-log entries are skipped and
// counted, never an error.
package decisionlog

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ichor-dev/ichor-policy/engine"
)

// Message is the msg of every decision-log entry OPA's console sink writes.
const Message = "Decision Log"

// The decision paths of the rules the manager, the webhook and the CLI ask.
const (
	PathKubeletServing = engine.PathKubeletServing
	PathKubeletClient  = engine.PathKubeletClient
	PathAdmission      = engine.PathCredentialAdmission
	PathIssuance       = engine.PathCredentialIssuance
	// PathRequirements is the row of a credential purpose the webhook reads
	// before admission (which SubjectAccessReview, which Event): it answers
	// no action, and is listed all the same, because replay replays it
	// (result-changed) and a list that hid what replay reports would not
	// add up.
	PathRequirements = engine.PathCredentialRequirements
	// PathCredentialCheck is a credential's checks without who asks, which
	// `ichor cluster` asks before it sends a request and the manager for
	// its own Talos identity.
	PathCredentialCheck = engine.PathCredentialCheck
	// PathKubeletServingRejection is the flood guard's question asked before
	// any Talos read; PathKubeletServingLimits the limits Go counts with.
	PathKubeletServingRejection = engine.PathKubeletServingRejection
	PathKubeletServingLimits    = engine.PathKubeletServingLimits
	// PathKubeletServingAudit is the audit of a certificate in service.
	PathKubeletServingAudit = engine.PathKubeletServingAudit
	// PathManual is the record of a person's act (a CSR decided by hand, an
	// admin binding revoked): listed, never replayed (Ichor decided
	// nothing in it).
	PathManual = engine.PathManualRecord
)

// Policies maps the short names of the decision rules to their paths: every
// entrypoint that is logged has one, so a listing's POLICY column is short.
var Policies = map[string]string{
	"kubelet-serving":           PathKubeletServing,
	"kubelet-client":            PathKubeletClient,
	"admission":                 PathAdmission,
	"issuance":                  PathIssuance,
	"requirements":              PathRequirements,
	"credential-check":          PathCredentialCheck,
	"kubelet-serving-rejection": PathKubeletServingRejection,
	"kubelet-serving-limits":    PathKubeletServingLimits,
	"kubelet-serving-audit":     PathKubeletServingAudit,
	"kubeconfig":                engine.PathKubeconfig,
	"manual":                    PathManual,
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
	// The audit's statuses, which an audit decision lists as its action.
	ActionCurrent = engine.AuditCurrent
	ActionDrifted = engine.AuditDrifted
	ActionUnknown = engine.AuditUnknown
	// ActionRevoke is a person's revocation of an admin binding (PathManual).
	ActionRevoke = engine.ActionRevoke
)

// Actions are the action words, in the order they are listed.
var Actions = []string{
	ActionApprove, ActionDeny, ActionPending, ActionAllowed, ActionRefused,
	ActionCurrent, ActionDrifted, ActionUnknown, ActionRevoke, ActionNone, ActionError,
}

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
	Msg        *string                    `json:"msg"`
	DecisionID json.RawMessage            `json:"decision_id"`
	Path       string                     `json:"path"`
	Input      json.RawMessage            `json:"input"`
	Result     json.RawMessage            `json:"result"`
	Error      json.RawMessage            `json:"error"`
	Bundles    map[string]json.RawMessage `json:"bundles"`
	Timestamp  string                     `json:"timestamp"`
	Labels     json.RawMessage            `json:"labels"`
	Type       string                     `json:"type"`
}

// Skipped counts what Read left out because it is not a decision-log entry.
type Skipped struct {
	// Lines are lines of a log: the controllers' and OPA's own, and any
	// other text.
	Lines int
	// Items are values of a JSON document or array that are not events.
	Items int
	// Long are lines longer than Limits.MaxLine: skipped unread (the rest
	// of such a line is discarded as it streams past), whatever they hold.
	Long int
	// Damaged are lines that begin an entry and do not parse: JSON cut
	// short that names a decision_id (a line torn when the manager was
	// killed mid-write or its volume filled, or split by a log shipper).
	// A decision may be lost in each, which a line of another log is not.
	Damaged int
}

// Add adds o's counts to s.
func (s *Skipped) Add(o Skipped) {
	s.Lines += o.Lines
	s.Items += o.Items
	s.Long += o.Long
	s.Damaged += o.Damaged
}

// damaged reports whether a line that is no entry is one cut short: its
// JSON, from its first brace, does not parse and names a decision_id (the
// controllers' lines that name one are whole JSON).
func damaged(line []byte) bool {
	i := bytes.IndexByte(line, '{')
	return i >= 0 && bytes.Contains(line[i:], []byte(`"decision_id"`)) && !json.Valid(line[i:])
}

// The default bounds of a read: generous for a real log (the manager's
// entries are bounded by its own caps, a few hundred KiB at most), small
// enough that a log crafted to exhaust memory (a few KiB of gzip that
// decompress to a line of gigabytes, or to billions of entries) cannot.
const (
	DefaultMaxBytes   int64 = 1 << 30
	DefaultMaxLine    int   = 16 << 20
	DefaultMaxEntries int   = 2_000_000
)

// Limits bound what Read takes from one input. A zero field is its default.
type Limits struct {
	// MaxBytes bounds the bytes of the input after decompression: a log
	// that is longer is refused (ErrTooLarge), as is a JSON document.
	MaxBytes int64
	// MaxLine bounds the bytes of one line (without its newline): a longer
	// line is skipped and counted (Skipped.Long), never held whole.
	MaxLine int
	// MaxEntries bounds the decisions read: a log of more is refused
	// (ErrTooLarge). Each entry read is held with its fields, some hundred
	// bytes more than its text, so a gigabyte of the smallest entries
	// (tens of millions) would take ten times the bytes bound in memory; a
	// month of a busy manager's decisions is under a million.
	MaxEntries int

	// held is how many decisions earlier inputs read together with this
	// one hold already (After): MaxEntries bounds them all.
	held int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxLine <= 0 {
		l.MaxLine = DefaultMaxLine
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l
}

// After is l for the next of several logs read together (files, pods) once
// read decisions of the others are held: MaxEntries bounds them all, not
// each, as what is held is all of them. A log that takes the decisions
// past the bound is refused, naming the bound; one that holds none is
// read whatever the others held.
func (l Limits) After(read int) Limits {
	l.held = read
	return l
}

// ErrTooManyDecisions is a log of more decisions than Limits.MaxEntries;
// it is an ErrTooLarge too.
var ErrTooManyDecisions = errors.New("more decisions than the bound")

// tooMany is the error of a log of more than max decisions.
func tooMany(max int) error {
	return tooManyDecisions(max)
}

// tooManyDecisions is ErrTooManyDecisions, saying the bound.
type tooManyDecisions int

func (max tooManyDecisions) Error() string {
	return fmt.Sprintf("%v: more than %d decisions", ErrTooLarge, int(max))
}

func (tooManyDecisions) Is(target error) bool {
	return target == ErrTooLarge || target == ErrTooManyDecisions
}

// ErrTooLarge is an input longer than Limits.MaxBytes after decompression.
var ErrTooLarge = errors.New("the decision log is larger than the bound")

// ErrFormat is an input that announces a shape it does not keep: a gzip
// stream that does not decompress, a JSON document that does not parse. It
// is the input that is wrong, not the reading.
var ErrFormat = errors.New("not a readable decision log")

// gzipMagic starts every gzip stream (RFC 1952).
var gzipMagic = []byte{0x1f, 0x8b}

// Read reads decision-log entries in the order they appear. It reads every
// shape a decision log reaches an operator in, detected per input:
//
//   - Lines: one JSON object a line, among other lines, which are skipped
//     and counted (blank lines are neither). An entry is OPA's console
//     shape (msg "Decision Log", what the manager writes to standard
//     output) or OPA's event (logs.EventV1, what a decision-log service
//     receives, stored one a line); see parse. A line may carry a prefix
//     before its object, as `kubectl logs --timestamps` or `--prefix`
//     writes, and a line that is a JSON array is read as the events in it
//     (an upload's body a line).
//   - A JSON document: an input whose first value is an array of objects
//     (an upload's body as the service received it, or several one after
//     the other, laid out in any way, such as jq's indented output).
//   - Either, gzip-compressed (an upload's Content-Encoding, a rotated log
//     file), detected by gzip's magic bytes rather than a file name, so
//     that standard input works too.
//
// The error is the reader's, or ErrFormat for an input that starts as gzip
// or a JSON document and then is not one.
//
// Read bounds what it takes by the default Limits; see ReadLimited.
func Read(r io.Reader) ([]Entry, Skipped, error) {
	return ReadLimited(r, Limits{})
}

// ReadLimited is Read within limits: the input, decompressed, is read up to
// limits.MaxBytes, past which it fails with ErrTooLarge (a log cut at the
// bound would be read as if it were whole); a line longer than
// limits.MaxLine is skipped and counted in Skipped.Long. So a log, however
// crafted, takes memory in proportion to the bounds, not to what it claims.
func ReadLimited(r io.Reader, limits Limits) ([]Entry, Skipped, error) {
	limits = limits.withDefaults()
	br := bufio.NewReader(r)
	var plain io.Reader = br
	compressed := false
	if magic, _ := br.Peek(len(gzipMagic)); bytes.Equal(magic, gzipMagic) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, Skipped{}, fmt.Errorf("%w: gzip: %w", ErrFormat, err)
		}
		defer zr.Close()
		plain, compressed = gzipErrors{zr}, true
	}
	bounded := &boundedReader{r: plain, left: limits.MaxBytes, max: limits.MaxBytes, compressed: compressed}
	return readPlain(bufio.NewReader(bounded), limits)
}

// boundedReader reads up to max bytes, then fails with ErrTooLarge if there
// are more (io.LimitReader would end quietly, and a log cut short would be
// read as if it were whole).
type boundedReader struct {
	r          io.Reader
	left, max  int64
	compressed bool
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.err()
	}
	// One byte past the bound tells a log of exactly max bytes from a
	// longer one.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n + int(b.left), b.err()
	}
	return n, err
}

func (b *boundedReader) err() error {
	what := ""
	if b.compressed {
		what = " once decompressed"
	}
	return fmt.Errorf("%w: more than %d bytes%s", ErrTooLarge, b.max, what)
}

// gzipErrors marks the errors of a decompression as the input's: a stream
// cut short or corrupt. (The reader under it fails rarely, and such an
// error is marked too.)
type gzipErrors struct{ r io.Reader }

func (g gzipErrors) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: gzip: %w", ErrFormat, err)
	}
	return n, err
}

func readPlain(br *bufio.Reader, limits Limits) ([]Entry, Skipped, error) {
	var entries []Entry
	var skipped Skipped
	var err error
	if isDocument(br) {
		// A document's values are bounded by the input's bound (the
		// decoder holds one value whole, and no more than the input).
		entries, skipped, err = readDocument(br, limits.MaxLine, limits.held, limits.MaxEntries)
	} else {
		entries, skipped, err = readLines(br, limits.MaxLine, limits.held, limits.MaxEntries)
	}
	if limits.held > 0 && errors.Is(err, ErrTooManyDecisions) {
		err = fmt.Errorf("%w, over all the logs read together (%d before this one)", err, limits.held)
	}
	return entries, skipped, err
}

// isDocument reports whether the input starts with a JSON array of objects
// (or an empty one): "[" then "{" or "]". A kubectl --prefix line starts with
// "[" too, followed by "pod/".
func isDocument(br *bufio.Reader) bool {
	const window = 4096
	head, _ := br.Peek(window)
	head = bytes.TrimLeft(head, " \t\r\n")
	if len(head) == 0 || head[0] != '[' {
		return false
	}
	head = bytes.TrimLeft(head[1:], " \t\r\n")
	return len(head) > 0 && (head[0] == '{' || head[0] == ']')
}

// readDocument reads successive JSON values: arrays of events, or events.
// An array is read item by item, so that what is held at once is the
// entries and one item, not the array besides (a document of a gigabyte was
// held three times over: the review of 2026-12-05); an item longer than
// maxLine is skipped as a long line is, and one longer than twice that (and
// itemSlack) makes the document malformed (itemBound).
func readDocument(r io.Reader, maxLine, held, maxEntries int) ([]Entry, Skipped, error) {
	var entries []Entry
	var skipped Skipped
	// The decoder holds a value whole before add can look at its length:
	// the reader refuses to give it more than twice the line bound (and a
	// read-ahead's slack) past where the value started, so that an item of a
	// gigabyte is an error, not a gigabyte held.
	in := &itemBound{r: r, limit: 2*int64(maxLine) + itemSlack}
	dec := json.NewDecoder(in)
	fail := func(err error) ([]Entry, Skipped, error) {
		if errors.Is(err, io.EOF) {
			// Within a value or an array: the document is cut short.
			err = io.ErrUnexpectedEOF
		}
		if errors.Is(err, ErrFormat) || isReadError(err) {
			return entries, skipped, err
		}
		return entries, skipped, fmt.Errorf("%w: a JSON document (it starts with an array of objects) that does not parse after %d decisions: %w", ErrFormat, len(entries), err)
	}
	// add takes one event in: compacted, so that an entry of an indented
	// document is printed as one of a line is (list -o json: one object a
	// line).
	add := func(v json.RawMessage) {
		if len(v) > maxLine {
			skipped.Long++
			return
		}
		if bytes.ContainsAny(v, "\n\r") {
			var compact bytes.Buffer
			if err := json.Compact(&compact, v); err == nil {
				v = compact.Bytes()
			}
		}
		if e, ok := parse(bytes.TrimSpace(v)); ok {
			entries = append(entries, e)
		} else {
			skipped.Items++
		}
	}
	for {
		in.mark = dec.InputOffset()
		if !dec.More() {
			// The input's end, or a stray closing bracket.
			if _, err := dec.Token(); !errors.Is(err, io.EOF) {
				if err == nil {
					err = errors.New("a closing bracket that closes nothing")
				}
				return fail(err)
			}
			return entries, skipped, nil
		}
		// More has read up to the next value: its first byte is the
		// first of what the decoder holds.
		first := make([]byte, 1)
		if _, err := dec.Buffered().Read(first); err != nil {
			return fail(err)
		}
		if first[0] != '[' {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return fail(err)
			}
			add(v)
		} else {
			if _, err := dec.Token(); err != nil {
				return fail(err)
			}
			for in.mark = dec.InputOffset(); dec.More(); in.mark = dec.InputOffset() {
				var v json.RawMessage
				if err := dec.Decode(&v); err != nil {
					return fail(err)
				}
				add(v)
				if held+len(entries) > maxEntries {
					return nil, skipped, tooMany(maxEntries)
				}
			}
			if _, err := dec.Token(); err != nil {
				return fail(err)
			}
		}
		if held+len(entries) > maxEntries {
			return nil, skipped, tooMany(maxEntries)
		}
	}
}

// itemSlack is what the decoder may have read ahead of a value, beyond it.
const itemSlack = 1 << 20

// itemBound reads for a JSON decoder, refusing to read more than limit bytes
// past mark, the decoder's offset where the value it decodes starts.
type itemBound struct {
	r          io.Reader
	read, mark int64
	limit      int64
}

func (b *itemBound) Read(p []byte) (int, error) {
	room := b.limit - (b.read - b.mark)
	if room <= 0 {
		return 0, fmt.Errorf("%w: a JSON document holds an item of more than %d bytes, past any entry's bound; not read further", ErrFormat, b.limit-itemSlack)
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}

// isReadError reports whether a JSON decoder's error is its reader's rather
// than the JSON's.
func isReadError(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return !errors.As(err, &syntax) && !errors.As(err, &typ) && !errors.Is(err, io.ErrUnexpectedEOF)
}

// appendValue appends the entry a JSON value is, or the entries of an
// array of them, and returns how many values (the value, or items of the
// array) it skipped because they are not entries. It stops once entries
// holds more than max: one array of a document may hold millions.
func appendValue(entries *[]Entry, v json.RawMessage, max int) (skipped int) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || v[0] != '[' {
		if e, ok := parse(v); ok {
			*entries = append(*entries, e)
			return 0
		}
		return 1
	}
	var items []json.RawMessage
	if json.Unmarshal(v, &items) != nil {
		return 1
	}
	for _, item := range items {
		if e, ok := parse(bytes.TrimSpace(item)); ok {
			*entries = append(*entries, e)
		} else {
			skipped++
		}
		if len(*entries) > max {
			break
		}
	}
	return skipped
}

func readLines(br *bufio.Reader, maxLine, held, maxEntries int) ([]Entry, Skipped, error) {
	var entries []Entry
	var skipped Skipped
	var text []byte
	for {
		var long bool
		var err error
		text, long, err = nextLine(br, text[:0], maxLine)
		if long {
			skipped.Long++
		} else if t := bytes.TrimSpace(text); len(t) > 0 {
			switch {
			case readLine(&entries, &skipped, t):
			case damaged(t):
				skipped.Damaged++
			default:
				skipped.Lines++
			}
			if held+len(entries) > maxEntries {
				return nil, skipped, tooMany(maxEntries)
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

// nextLine reads the next line into buf (its newline included, when it has
// one) and returns it, or reports it long, when it has more than maxLine
// bytes before its newline: then it is read to its end in the buffer's
// slices and discarded, so that no more than maxLine bytes of it are held.
// (An entry keeps no part of buf: parse copies what it keeps.)
func nextLine(br *bufio.Reader, buf []byte, maxLine int) (line []byte, long bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		n := len(chunk)
		if err == nil {
			n-- // the newline
		}
		if !long && len(buf)+n > maxLine {
			long, buf = true, buf[:0]
		}
		if !long {
			buf = append(buf, chunk...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return buf, long, err
		}
	}
}

// readLine appends the entries of one line: one object, after any prefix,
// or the events of the JSON arrays the line holds (a service that stores
// each upload's body a line). It reports whether the line was one of those.
func readLine(entries *[]Entry, skipped *Skipped, text []byte) bool {
	if text[0] == '[' {
		// Several bodies may run together on a line ("[...][...]").
		dec := json.NewDecoder(bytes.NewReader(text))
		var found []Entry
		var items int
		for {
			var v json.RawMessage
			err := dec.Decode(&v)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil || bytes.TrimSpace(v)[0] != '[' {
				found = nil
				break
			}
			// A line is bounded (MaxLine); readLines checks the count.
			items += appendValue(&found, v, math.MaxInt)
		}
		if len(found) > 0 {
			*entries = append(*entries, found...)
			skipped.Items += items
			return true
		}
		// Not an array of events: a kubectl --prefix ("[pod/NAME/manager] ").
	}
	i := bytes.IndexByte(text, '{')
	if i < 0 {
		return false
	}
	e, ok := parse(text[i:])
	if ok {
		*entries = append(*entries, e)
	}
	return ok
}

// parse reads one decision-log entry: OPA's console shape, msg "Decision
// Log" and a decision_id; or OPA's event (logs.EventV1, which a decision-log
// service receives): no msg, and the fields an event always has, a
// decision_id, labels and an RFC 3339 timestamp. The controllers' log lines
// have a msg, and some a decision_id (the one they acted on): they are not
// entries.
func parse(text []byte) (Entry, bool) {
	if len(text) == 0 || text[0] != '{' {
		return Entry{}, false
	}
	var l line
	if err := json.Unmarshal(text, &l); err != nil {
		return Entry{}, false
	}
	var id string
	if err := json.Unmarshal(l.DecisionID, &id); err != nil || id == "" {
		return Entry{}, false
	}
	ts, tsErr := time.Parse(time.RFC3339Nano, l.Timestamp)
	switch {
	case l.Msg != nil && *l.Msg == Message:
	case l.Msg == nil && l.Labels != nil && tsErr == nil:
	default:
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
	if tsErr == nil {
		e.Timestamp = ts
	}
	var labels map[string]any
	if json.Unmarshal(l.Labels, &labels) == nil && len(labels) > 0 {
		e.Labels = make(map[string]string, len(labels))
		for k, v := range labels {
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

// Outcome is the entry's decision; for a record that a decision was carried
// out, which no rule made, the action it records.
func (e Entry) Outcome() Outcome {
	if e.Result == nil && e.Error != nil && !isUndefined(e.Error) {
		return Outcome{Outcome: engine.Outcome{Action: ActionError, Reasons: engine.Reasons{}}, Error: ErrorText(e.Error)}
	}
	if a, ok := e.Applied(); ok && e.Result == nil {
		return Outcome{Outcome: engine.Outcome{Action: a.Action, Reasons: engine.Reasons{}}}
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

// isUndefined is whether an entry's error is OPA's undefined decision: its
// code, not a message that quotes it (an evaluation error's text can hold
// anything an input held).
func isUndefined(raw json.RawMessage) bool {
	return strings.HasPrefix(ErrorText(raw), "opa_undefined_error: ")
}

// subject is the part of an input that names who or what a decision is about.
type subject struct {
	CSR *struct {
		Name string `json:"name"`
		// ObjectUID is the request object's UID (not uid, the
		// requesting user's); empty in logs before review 188.
		ObjectUID string `json:"object_uid"`
		Username  string `json:"username"`
		Request   struct {
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
	// Request is a credential request's facts (its name, namespace and
	// UID), which an issuance decision and its admission name.
	Request *struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"request"`
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

// Object is what a decision was about, as the applied records name it:
// "csr/NAME", or "taloscredentialrequest/NAMESPACE/NAME" for an issuance;
// empty for other decisions.
func (e Entry) Object() string {
	object, _ := e.objectAndUID()
	return object
}

// objectAndUID are Object and the UID of the object the entry decides (a
// CSR's metadata.uid, input.csr.object_uid; a credential request's), as its
// input holds it ("" when it holds none), from one read of the input.
func (e Entry) objectAndUID() (object, uid string) {
	s := e.subject()
	switch {
	case s.CSR != nil && s.CSR.Name != "":
		return "csr/" + s.CSR.Name, s.CSR.ObjectUID
	case e.Path == PathIssuance && s.Request != nil && s.Request.Name != "":
		// As the issuer's record names it. Only the issuance: the
		// webhook's admission of the same request is never applied (nor
		// superseded) by the issuer's record.
		return "taloscredentialrequest/" + s.Request.Namespace + "/" + s.Request.Name, s.Request.UID
	}
	return "", ""
}

// cutReasons is the mask's key, in input.log_truncated, of the result's
// reasons cut (a message longer, or more reasons, than the log keeps): a
// cut of the result, which leaves the input whole.
const cutReasons = "result.reasons"

// cuts are what the log kept only part of, by the mask's key
// (input.log_truncated).
func (e Entry) cuts() map[string]any {
	var marker struct {
		Truncated map[string]any `json:"log_truncated"`
	}
	if e.Input != nil {
		_ = json.Unmarshal(e.Input, &marker)
	}
	return marker.Truncated
}

// Redacted reports whether the log's mask replaced some of the entry's input
// (OPA lists each path the mask wrote under "masked") other than its note
// of what it cut and the words it cut that the rules only quote
// (messageCuts): an input cut is Truncated, so what is left is a value
// redacted, such as a user's extra attributes the mask does not list.
func (e Entry) Redacted() bool {
	var event struct {
		Masked []string `json:"masked"`
	}
	if json.Unmarshal(e.Raw, &event) != nil {
		return false
	}
	for _, p := range event.Masked {
		if strings.HasPrefix(p, "/input/") && p != "/input/log_truncated" && !slices.Contains(messageCuts, strings.ReplaceAll(strings.TrimPrefix(p, "/input/"), "/", ".")) {
			return true
		}
	}
	return false
}

// Truncated reports whether the log kept only part of the entry's input:
// then it is not the request, and is not replayed. The result's reasons cut
// alone leave it whole (review 187: such entries, a tenant's long name
// quoted in a reason's message, were left out of replays as cut).
func (e Entry) Truncated() bool {
	cut := e.cuts()
	for _, c := range messageCuts {
		delete(cut, c)
	}
	return len(cut) > 0
}

// messageCuts are the cuts that leave an input the request's: the result's
// reasons, and the authorizer's words, which the rules only quote in a
// refusal's message (review 257: cut, a long RBAC reason kept every
// credential decision of its user out of a replay).
var messageCuts = []string{cutReasons, "authorization.reason", "authorization.evaluation_error"}

// reasonsPartial reports whether the log kept only the first of the
// result's reasons (more of them than it keeps): their codes are not all
// there to compare. Messages cut leave the codes whole.
func (e Entry) reasonsPartial() bool {
	n, ok := e.cuts()[cutReasons].(float64)
	return ok && n > float64(len(e.Outcome().Reasons))
}

// keptReasonsSame reports whether codes agree with what an entry whose
// reasons the log cut (reasonsPartial) knows of its own: how many there
// were, and the first, which the request's condition or the refusal names.
// The others kept are not compared: a rule may order them otherwise.
func (e Entry) keptReasonsSame(codes []string) bool {
	n, _ := e.cuts()[cutReasons].(float64)
	kept := e.Codes()
	return float64(len(codes)) == n && len(kept) > 0 && len(codes) > 0 && codes[0] == kept[0]
}

// Manual reports whether the entry records a person's act (PathManual).
func (e Entry) Manual() bool { return e.Path == PathManual }

// manualRecord is what a listing reads of a person's act: who acted (the
// API server's user, or "unknown") and whom the act was about.
type manualRecord struct {
	Actor string `json:"actor"`
	Whom  string `json:"whom"`
}

func (e Entry) manual() manualRecord {
	var r manualRecord
	if e.Result != nil {
		_ = json.Unmarshal(e.Result, &r)
	}
	return r
}

// User is the requester: the CSR's spec.username, the admission request's
// user, or the requester an issuance decision re-authorized; for a person's
// act, the person who acted ("unknown" when the manager did not see them).
func (e Entry) User() string {
	if e.Manual() {
		return e.manual().Actor
	}
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
// decision about a node, else the requester; for a person's act, who acted
// and on whom ("ada→bob").
func (e Entry) Subject() string {
	if e.Manual() {
		r := e.manual()
		return r.Actor + "→" + r.Whom
	}
	if n := e.Node(); n != "" {
		return n
	}
	return e.User()
}
