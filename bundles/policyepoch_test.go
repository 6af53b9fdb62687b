package bundles_test

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

var updateEpochs = flag.Bool("update-epochs", false, "record the embedded policy's revision under its epoch in testdata/epochs.txt")

// epochsFile records, for each revision of the policy that has been built,
// the epoch it carries. A bundle of an equal epoch is accepted in place of
// the one in service, so each change to the rules must be weighed: does it
// close a hole (raise policy/EPOCH, so that every bundle before it is
// refused), or may the bundles before it still be served (record it under
// the same epoch)? This test makes that a decision someone took, in review,
// rather than something a policy change forgets.
const epochsFile = "testdata/epochs.txt"

func TestEveryPolicyRevisionIsWeighedForItsEpoch(t *testing.T) {
	b, err := bundles.Default()
	require.NoError(t, err)
	epoch, err := bundles.Epoch(b.Manifest)
	require.NoError(t, err)
	line := fmt.Sprintf("%d %s", epoch, b.Manifest.Revision)

	recorded := map[string]bool{}
	highest := int64(-1)
	f, err := os.Open(epochsFile)
	require.NoError(t, err)
	s := bufio.NewScanner(f)
	for s.Scan() {
		text, _, _ := strings.Cut(s.Text(), "#")
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		var e int64
		var rev string
		_, err := fmt.Sscanf(text, "%d %s", &e, &rev)
		require.NoError(t, err, "%s: %q is not EPOCH REVISION", epochsFile, text)
		recorded[fmt.Sprintf("%d %s", e, rev)] = true
		highest = max(highest, e)
	}
	require.NoError(t, s.Err())
	require.NoError(t, f.Close())

	if recorded[line] {
		return
	}
	if *updateEpochs {
		require.GreaterOrEqual(t, epoch, highest, "policy/EPOCH (%d) is below an epoch already recorded (%d): epochs only grow", epoch, highest)
		out, err := os.OpenFile(epochsFile, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fmt.Fprintln(out, line)
		require.NoError(t, err)
		require.NoError(t, out.Close())
		return
	}
	t.Fatalf("the policy changed (revision %s) and nobody has weighed its epoch (policy/EPOCH is %d).\n"+
		"If the change closes a hole, raise policy/EPOCH, so that managers refuse every signed bundle built before it.\n"+
		"Either way, record the revision: go test ./bundles -run TestEveryPolicyRevisionIsWeighedForItsEpoch -update-epochs\n"+
		"(docs/hardening.md, \"An older signed bundle does not come back\")", b.Manifest.Revision, epoch)
}
