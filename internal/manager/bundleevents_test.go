package manager

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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

// A bundle refused while the manager was being set up, before the Events'
// function was there, is its Event once it is (review 178: a file source
// refuses a file once, so that refusal was never an Event); one followed
// by an activation meanwhile is not, and every status after is handed on.
func TestARefusalBeforeTheManagerIsSetUpIsStillAnEvent(t *testing.T) {
	var got []engine.BundleStatus
	record := func(st engine.BundleStatus) { got = append(got, st) }

	var r statusRelay
	r.deliver(engine.BundleStatus{ActiveRevision: "r1", Err: errors.New("first")})
	r.deliver(engine.BundleStatus{ActiveRevision: "r1", Err: errors.New("signature")})
	r.set(record)
	if assert.Len(t, got, 1, "the last refusal before the set-up is handed on, once") {
		assert.EqualError(t, got[0].Err, "signature")
	}
	r.deliver(engine.BundleStatus{ActiveRevision: "r2"})
	assert.Len(t, got, 2, "a status after the set-up is handed on")

	var again statusRelay
	got = nil
	again.deliver(engine.BundleStatus{ActiveRevision: "r1", Err: errors.New("signature")})
	again.deliver(engine.BundleStatus{ActiveRevision: "r2"})
	again.set(record)
	assert.Empty(t, got, "a refusal a later activation put right is no Event")
}

// Each revision activated is an Event of its own on the Pod, as client-go's
// broadcaster writes them: it folds an Event into one of the same reason,
// action and object whatever its note says, so with one action a hotfix
// activated within minutes of the bundle before read as that bundle, twice
// (review 203 F1).
func TestEachRevisionActivatedIsAnEventOfItsOwn(t *testing.T) {
	cs := fake.NewClientset()
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	require.NoError(t, b.StartRecordingToSinkWithContext(t.Context()))
	t.Cleanup(b.Shutdown)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ichor-system", Name: "ichor-policy-0"}}
	notify := bundleEventsTo(b.NewRecorder(clientgoscheme.Scheme, "ichor-policy"), pod, "r0")

	notify(engine.BundleStatus{ActiveRevision: "r1"})
	notify(engine.BundleStatus{ActiveRevision: "r2"})

	notes := func() []string {
		list, err := cs.EventsV1().Events("ichor-system").List(t.Context(), metav1.ListOptions{})
		require.NoError(t, err)
		var out []string
		for _, e := range list.Items {
			out = append(out, e.Note)
		}
		slices.Sort(out)
		return out
	}
	require.Eventually(t, func() bool { return len(notes()) == 2 }, 10*time.Second, 20*time.Millisecond, "Events: %q", notes())
	assert.Equal(t, []string{"policy bundle revision r1 active", "policy bundle revision r2 active"}, notes())
}
