package manager

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/ichor-dev/ichor-policy/engine"
)

// OPA tells of every poll of a URL or registry that found the bundle
// unchanged as it tells of an activation: only another revision is an
// Event BundleActivated, and each refusal is one, while the revision in
// service is polled again in between. (Before: an Event "activated" every
// 30 s for a bundle that had served for days.)
func TestOnlyAnotherRevisionIsAnActivationEvent(t *testing.T) {
	rec := events.NewFakeRecorder(16)
	notify := bundleEventsTo(rec, &corev1.Pod{}, "r1")
	drain := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	notify(engine.BundleStatus{ActiveRevision: "r1"})
	notify(engine.BundleStatus{ActiveRevision: "r1"})
	assert.Empty(t, drain(), "the bundle in service, polled again")

	notify(engine.BundleStatus{ActiveRevision: "r2"})
	notify(engine.BundleStatus{ActiveRevision: "r2"})
	assert.Equal(t, []string{"Normal BundleActivated policy bundle revision r2 active"}, drain())

	notify(engine.BundleStatus{ActiveRevision: "r2", Err: errors.New("signature")})
	notify(engine.BundleStatus{ActiveRevision: "r2"})
	got := drain()
	if assert.Len(t, got, 1, "a refusal, then the bundle in service polled again") {
		assert.Contains(t, got[0], "Warning BundleRefused policy bundle refused: signature; revision r2 keeps serving")
	}
	notify(engine.BundleStatus{ActiveRevision: "r1"})
	assert.Equal(t, []string{"Normal BundleActivated policy bundle revision r1 active"}, drain(), "back to r1 is another activation")
}
