package manualact_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
)

// decisionsNoManagerWatchedAreRecorded: a request decided by hand while no
// manager runs (a leader change, a restart) is recorded once, by the next
// manager's watch, which finds it decided among the requests it lists first;
// a later start of the manager does not record it again (run by
// TestAPersonsActsAreRecordedWithWhoActed, which owns the manager).
func decisionsNoManagerWatchedAreRecorded(t *testing.T, re *recEnv) {
	unwatched := re.csr(t, "csr-unwatched")
	ownUnwatched := re.csr(t, "csr-own-unwatched")

	re.stopManager()
	// No manager: the webhook is not called (failurePolicy Ignore) and
	// nothing watches. Ada decides; so does an approver of Ichor's.
	re.ichor(t, 0, "deny", unwatched.Name, "--reason", "Unknown", "--message", "decided while nobody watched", "--kubeconfig", re.ada)
	re.managerApproves(t, ownUnwatched)
	assert.Empty(t, re.records("csr/"+unwatched.Name))

	re.startManager(t)
	r := re.waitRecord(t, "csr/"+unwatched.Name, engine.ActorUnknown)
	assert.Equal(t, engine.ActionDeny, r.Result.Action, "the verdict stored")
	assert.Equal(t, engine.SeenByWatchStart, r.Input.SeenBy)
	assert.Equal(t, engine.ActorSourceNotWatched, r.Result.ActorSource)
	require.Len(t, r.Result.Reasons, 1)
	assert.Equal(t, "ManualDenial", r.Result.Reasons[0].Code)
	assert.Contains(t, r.Result.Reasons[0].Message, "decided while nobody watched")
	assert.Contains(t, r.Result.Reasons[0].Message, "the API server's audit log names the user")
	ev := re.event(t, unwatched.UID)
	assert.Contains(t, ev.Message, r.DecisionID)

	// Started again, the manager lists the request decided again, and finds
	// its record. The flush's decision comes after it in the informer's
	// order: once that is recorded, the listed requests were all handled.
	re.stopManager()
	re.startManager(t)
	re.flush(t)
	assert.Len(t, re.records("csr/"+unwatched.Name), 1, "recorded once, whatever the restarts")
	assert.Empty(t, re.records("csr/"+ownUnwatched.Name), "the manager's own approval is no person's act")
}
