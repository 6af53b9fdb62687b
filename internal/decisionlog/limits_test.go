package decisionlog_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
)

// entryLine is a decision-log entry in OPA's console shape, one line.
func entryLine(id string) string {
	return `{"msg":"Decision Log","decision_id":"` + id + `","path":"ichor/kubelet_serving/decision","result":{"action":"approve"},"timestamp":"2026-05-01T12:00:00Z","labels":{"id":"x"}}`
}

// repeat is an endless stream of one byte string.
type repeat struct {
	s   []byte
	off int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.s[r.off:])
		n += c
		r.off = (r.off + c) % len(r.s)
	}
	return n, nil
}

// bomb is size bytes of the pattern, gzip-compressed: KiB for MiB.
func bomb(t *testing.T, pattern string, size int64) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	_, err = io.Copy(zw, io.LimitReader(&repeat{s: []byte(pattern)}, size))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// allocated is what read allocates in all (runtime.MemStats.TotalAlloc):
// what the heap could have had to hold, at most.
func allocated(read func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	read()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

const mib = 1 << 20

func TestReadRefusesAGzipBombAtTheBoundInBoundedMemory(t *testing.T) {
	for _, tc := range []struct{ name, pattern string }{
		{"zeros: one endless line", "\x00"},
		{"one entry repeated", entryLine("d") + "\n"},
		{"a JSON document", entryLine("d") + ","},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 128 * mib
			pattern := tc.pattern
			compressed := bomb(t, pattern, size)
			if tc.name == "a JSON document" {
				// "[" and then entries, never closed.
				compressed = append(bomb(t, "[", 1), compressed...)
			}
			require.Less(t, len(compressed), mib, "the bomb is small")
			var err error
			var entries []decisionlog.Entry
			alloc := allocated(func() {
				entries, _, err = decisionlog.ReadLimited(bytes.NewReader(compressed), decisionlog.Limits{MaxBytes: 2 * mib, MaxLine: 64 << 10})
			})
			require.ErrorIs(t, err, decisionlog.ErrTooLarge)
			assert.NotErrorIs(t, err, decisionlog.ErrFormat, "a bound is not a malformed log")
			assert.Contains(t, err.Error(), "more than 2097152 bytes once decompressed")
			// Unbounded, this reads 128 MiB (and holds it, or the entries of
			// it, about 16 bytes allocated a byte read); bounded, the
			// entries of the 2 MiB bound (a document's too, since it is
			// read item by item).
			assert.Less(t, alloc, uint64(48*mib), "allocated %d MiB", alloc/mib)
			runtime.KeepAlive(entries)
		})
	}
}

func TestReadSkipsALineLongerThanTheBoundWithoutHoldingIt(t *testing.T) {
	log := io.MultiReader(
		strings.NewReader(entryLine("before")+"\n"),
		io.LimitReader(&repeat{s: []byte("x")}, 64*mib),
		strings.NewReader("\n"+entryLine("after")+"\n"),
	)
	var entries []decisionlog.Entry
	var skipped decisionlog.Skipped
	var err error
	alloc := allocated(func() {
		entries, skipped, err = decisionlog.ReadLimited(log, decisionlog.Limits{MaxLine: 64 << 10})
	})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, "before", entries[0].DecisionID)
	assert.Equal(t, "after", entries[1].DecisionID)
	assert.Equal(t, decisionlog.Skipped{Long: 1}, skipped)
	assert.Less(t, alloc, uint64(8*mib), "allocated %d MiB", alloc/mib)
}

func TestReadRefusesAnEndlessLineAtTheBound(t *testing.T) {
	var err error
	alloc := allocated(func() {
		_, _, err = decisionlog.ReadLimited(&repeat{s: []byte("x")}, decisionlog.Limits{MaxBytes: 4 * mib, MaxLine: 64 << 10})
	})
	require.ErrorIs(t, err, decisionlog.ErrTooLarge)
	assert.Contains(t, err.Error(), "more than 4194304 bytes")
	assert.NotContains(t, err.Error(), "decompressed")
	assert.Less(t, alloc, uint64(8*mib), "allocated %d MiB", alloc/mib)
}

func TestReadReadsALogJustWithinTheBoundsWhole(t *testing.T) {
	line := entryLine("a")
	log := line + "\n" + entryLine("b")
	document := "[" + line + "," + entryLine("b") + "]"
	for _, tc := range []struct {
		name  string
		input []byte
		size  int
	}{
		{"lines", []byte(log), len(log)},
		{"lines, gzip", gzipBytes(t, []byte(log)), len(log)},
		{"a document", []byte(document), len(document)},
		{"a document, gzip", gzipBytes(t, []byte(document)), len(document)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exact := decisionlog.Limits{MaxBytes: int64(tc.size), MaxLine: max(len(line), len(document))}
			entries, skipped, err := decisionlog.ReadLimited(bytes.NewReader(tc.input), exact)
			require.NoError(t, err)
			require.Len(t, entries, 2)
			assert.Equal(t, "b", entries[1].DecisionID)
			assert.Zero(t, skipped)

			// A byte fewer, and the log is refused rather than cut.
			exact.MaxBytes--
			_, _, err = decisionlog.ReadLimited(bytes.NewReader(tc.input), exact)
			require.ErrorIs(t, err, decisionlog.ErrTooLarge)
		})
	}
	t.Run("a line of the bound's length", func(t *testing.T) {
		entries, skipped, err := decisionlog.ReadLimited(strings.NewReader(log), decisionlog.Limits{MaxLine: len(line)})
		require.NoError(t, err)
		assert.Len(t, entries, 2)
		assert.Zero(t, skipped)

		entries, skipped, err = decisionlog.ReadLimited(strings.NewReader(log), decisionlog.Limits{MaxLine: len(line) - 1})
		require.NoError(t, err)
		assert.Empty(t, entries)
		assert.Equal(t, decisionlog.Skipped{Long: 2}, skipped)
	})
	t.Run("defaults", func(t *testing.T) {
		entries, _, err := decisionlog.Read(strings.NewReader(log))
		require.NoError(t, err)
		assert.Len(t, entries, 2)
	})
}

// A log of tiny entries, well under the bytes bound, is refused past the
// entries bound: each entry read is held with its fields, some hundred bytes
// more than its text, so a gigabyte of the smallest (tens of millions of
// them) would have taken about ten times the bytes bound in memory (review
// of 2026-12-05).
func TestReadRefusesMoreDecisionsThanTheBound(t *testing.T) {
	tiny := `{"msg":"Decision Log","decision_id":"a"}`
	for name, log := range map[string]string{
		"lines":    strings.Repeat(tiny+"\n", 1001),
		"document": "[" + strings.Repeat(tiny+",", 1000) + tiny + "]",
	} {
		t.Run(name, func(t *testing.T) {
			compressed := bomb(t, log, int64(len(log)))
			_, _, err := decisionlog.ReadLimited(bytes.NewReader(compressed), decisionlog.Limits{MaxEntries: 1000})
			require.ErrorIs(t, err, decisionlog.ErrTooLarge)
			assert.ErrorContains(t, err, "more than 1000 decisions")

			entries, _, err := decisionlog.ReadLimited(bytes.NewReader(compressed), decisionlog.Limits{MaxEntries: 1001})
			require.NoError(t, err)
			assert.Len(t, entries, 1001)
		})
	}
}

// The hostile review of 2026-12-05: a JSON document (an array of events, as
// a decision-log service stores an upload) was read whole, then copied into
// its items and compacted: a gigabyte held three or four times over. It is
// now read item by item; an item longer than the line bound is skipped as a
// long line is, and the items around it are read.
func TestADocumentIsReadItemByItem(t *testing.T) {
	item := `"` + strings.Repeat("x", 1024) + `",`
	doc := io.MultiReader(
		strings.NewReader("["+entryLine("before")+","),
		io.LimitReader(&repeat{s: []byte(item)}, int64(32*mib/len(item)*len(item))),
		strings.NewReader(`"`+strings.Repeat("y", 128<<10)+`",`+entryLine("after")+"]"),
	)
	var entries []decisionlog.Entry
	var skipped decisionlog.Skipped
	var err error
	alloc := allocated(func() {
		entries, skipped, err = decisionlog.ReadLimited(doc, decisionlog.Limits{MaxLine: 64 << 10})
	})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, "before", entries[0].DecisionID)
	assert.Equal(t, "after", entries[1].DecisionID)
	assert.Equal(t, 1, skipped.Long, "the item over the line bound")
	// Each item is copied once; the whole document, held and copied as it
	// was, allocated over 100 MiB for these 32.
	assert.Less(t, alloc, uint64(64*mib), "allocated %d MiB", alloc/mib)
}

// A document cut short between its items, or within one, is
// a malformed log (exit 2), not a reader's failure.
func TestADocumentCutShortIsMalformed(t *testing.T) {
	for _, doc := range []string{"[" + entryLine("a"), "[" + entryLine("a") + ",", "[" + entryLine("a") + "," + entryLine("b")} {
		_, _, err := decisionlog.ReadLimited(strings.NewReader(doc), decisionlog.Limits{})
		require.ErrorIs(t, err, decisionlog.ErrFormat, doc)
		assert.Contains(t, err.Error(), "does not parse after", doc)
	}
}

// The hostile review of 2026-12-06: the decoder held an item whole before
// its length was looked at, so a document of one item of a gigabyte (a
// megabyte of gzip) took gigabytes. Reading stops at twice the line bound
// past an item's start, with an error: such an item is no entry.
func TestAnItemOfAGigabyteIsRefusedUnheld(t *testing.T) {
	doc := io.MultiReader(
		strings.NewReader("["+entryLine("before")+`,{"x":"`),
		io.LimitReader(&repeat{s: []byte("a")}, 1<<30),
		strings.NewReader(`"},`+entryLine("after")+"]"),
	)
	var err error
	alloc := allocated(func() {
		_, _, err = decisionlog.ReadLimited(doc, decisionlog.Limits{MaxLine: 64 << 10})
	})
	require.ErrorIs(t, err, decisionlog.ErrFormat)
	assert.Contains(t, err.Error(), "an item of more than 131072 bytes")
	assert.Less(t, alloc, uint64(16*mib), "allocated %d MiB", alloc/mib)
}

// Several logs read together (files, pods) share one bound on decisions:
// one that takes them past it is refused, naming the bound; one with none
// is read however many the others hold.
func TestTheBoundOnDecisionsIsSharedByTheLogsReadTogether(t *testing.T) {
	line := entryLine("d") + "\n"
	limits := decisionlog.Limits{MaxEntries: 3}
	got, _, err := decisionlog.ReadLimited(strings.NewReader(line), limits.After(2))
	require.NoError(t, err)
	assert.Len(t, got, 1, "the third of three")
	_, _, err = decisionlog.ReadLimited(strings.NewReader(line+line), limits.After(2))
	require.ErrorIs(t, err, decisionlog.ErrTooManyDecisions)
	require.ErrorIs(t, err, decisionlog.ErrTooLarge)
	assert.ErrorContains(t, err, "more than 3 decisions")
	_, _, err = decisionlog.ReadLimited(strings.NewReader(line), limits.After(3))
	require.ErrorIs(t, err, decisionlog.ErrTooManyDecisions, "none left")
	got, _, err = decisionlog.ReadLimited(strings.NewReader("not a decision\n"), limits.After(3))
	require.NoError(t, err, "a log of none, with none left")
	assert.Empty(t, got)
	// A document's items count the same way.
	_, _, err = decisionlog.ReadLimited(strings.NewReader("["+strings.TrimSpace(line)+"]"), limits.After(3))
	require.ErrorIs(t, err, decisionlog.ErrTooManyDecisions)
}
