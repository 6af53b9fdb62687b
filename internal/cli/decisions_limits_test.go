package cli

import (
	"bytes"
	"compress/gzip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gzipBomb is n copies of line, gzip-compressed: a few KiB for MiB.
func gzipBomb(t *testing.T, line string, n int) string {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	chunk := []byte(strings.Repeat(line, 1024))
	for range n / 1024 {
		_, err := zw.Write(chunk)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return b.String()
}

func TestDecisionsRefuseALogLargerThanTheBound(t *testing.T) {
	f := newDecisionsFixture(t)
	entry := strings.SplitN(f.log, "\n", 2)[0] + "\n"
	// 32 MiB and more of decisions, in KiB.
	bomb := gzipBomb(t, entry, 32<<20/len(entry)+1024)
	require.Less(t, len(bomb), 1<<20)
	for _, args := range [][]string{
		{"decisions", "list"},
		{"decisions", "show", f.approve},
		{"decisions", "replay", "--bundle", "../../policy"},
	} {
		t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
			code, stdout, stderr, _ := decisionsRun(t, bomb, append(args, "--max-log-bytes", "1048576")...)
			// The input's fault, not the command line's: exit 1.
			assert.Equal(t, ExitError, code, stderr)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, "read decision log standard input: the decision log is larger than the bound: more than 1048576 bytes once decompressed (--max-log-bytes raises the bound)")

			// Raised, the same log is read.
			code, _, stderr, _ = decisionsRun(t, bomb, append(args, "--max-log-bytes", "67108864")...)
			assert.NotEqual(t, ExitError, code, stderr)
			assert.NotContains(t, stderr, "bound")
		})
	}
}

// The bound on decisions is over everything read at once, not each file:
// what is held is all of them (review 62). Files are read one open at a
// time, so a store of thousands is no thousands of descriptors.
func TestDecisionsBoundTheirCountOverAllTheFiles(t *testing.T) {
	f := newDecisionsFixture(t)
	files := []string{f.file(t, f.log), f.file(t, f.log), f.file(t, f.log)}
	for bound, file := range map[string]string{"8": files[2], "6": files[1]} {
		code, _, stderr, _ := decisionsRun(t, "", append([]string{"decisions", "list", "--all", "--max-log-entries", bound}, files...)...)
		assert.Equal(t, ExitError, code, stderr)
		before := map[string]string{"8": "8", "6": "4"}[bound]
		assert.Contains(t, stderr, "read decision log "+file+": the decision log is larger than the bound: more than "+bound+
			" decisions, over all the logs read together ("+before+" before this one) (--max-log-entries raises the bound)")
	}

	// Exactly the bound, and a log with none after it.
	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", "--all", "--max-log-entries", "8", files[0], files[1], f.file(t, ""))
	assert.Equal(t, ExitOK, code, stderr)
	assert.Len(t, strings.Split(strings.TrimSpace(stdout), "\n"), 9, "a header and the 8 decisions")

	code, stdout, stderr, _ = decisionsRun(t, "", append([]string{"decisions", "list", "--all", "--max-log-entries", "12"}, files...)...)
	assert.Equal(t, ExitOK, code, stderr)
	assert.Len(t, strings.Split(strings.TrimSpace(stdout), "\n"), 13, "a header and the 12 decisions")
}

func TestDecisionsSkipALineLongerThanTheBoundAndSaySo(t *testing.T) {
	f := newDecisionsFixture(t)
	long := strings.Repeat("x", 1<<20) + "\n"
	code, stdout, stderr, _ := decisionsRun(t, long+f.kubectlLogs()+long, "decisions", "list", "--max-line-bytes", "65536")
	assert.Equal(t, ExitOK, code, stderr)
	assert.Len(t, strings.Split(strings.TrimSpace(stdout), "\n"), 5, "a header and the 4 decisions")
	assert.Contains(t, stderr, "ichor: read 4 decisions; skipped 3 lines that are not decision-log entries; skipped 2 lines longer than --max-line-bytes, unread (the flag raises the bound)")

	// Only long lines: no decision read, and why.
	code, _, stderr, _ = decisionsRun(t, long, "decisions", "list", "--max-line-bytes", "65536")
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "no decision read: skipped 1 line longer than --max-line-bytes, unread (the flag raises the bound)")
}

func TestDecisionsRefuseABoundBelowOne(t *testing.T) {
	for _, flag := range []string{"--max-log-bytes", "--max-line-bytes"} {
		code, _, stderr, _ := decisionsRun(t, "", "decisions", "list", flag, "0")
		assert.Equal(t, ExitUsage, code, stderr)
		assert.Contains(t, stderr, flag+" 0: give a number of bytes above 0")
	}
}
