package manualact

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/ichor-dev/ichor-policy/engine"
)

type staticKey []byte

func (k staticKey) Key(context.Context) ([]byte, error) { return k, nil }

func attemptRecorder(t *testing.T) *Recorder {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	return &Recorder{Reader: c, Client: c, Keys: staticKey("0123456789abcdef0123456789abcdef"), Instance: "test"}
}

// approvalByHand is a request at version 4242 and the write that approves
// it by hand.
func approvalByHand() (old, csr *certificatesv1.CertificateSigningRequest) {
	old = request()
	old.UID, old.ResourceVersion = "c5b1e0c2-0000-4000-8000-000000000001", "4242"
	csr = request(approved("by hand"))
	csr.UID = old.UID
	return old, csr
}

// A CSR's attempt Event shows nowhere the version it is kept at: whoever may
// read Events but not the request would learn what a forged review must
// name to be kept (review 240 F4). It is read back all the same, and a
// repeated attempt takes its own place again.
func TestACSRsAttemptDoesNotShowItsVersion(t *testing.T) {
	ctx := t.Context()
	r := attemptRecorder(t)
	old, csr := approvalByHand()
	for range 2 {
		_, err := r.Attempt(ctx, csr, old, &authenticationv1.UserInfo{Username: "bob", UID: "u-bob"})
		require.NoError(t, err)
	}
	var ev corev1.Event
	require.NoError(t, r.Reader.Get(ctx, objectKey(AttemptEventName([]byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion, 0)), &ev))
	raw, err := json.Marshal(&ev)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "4242")
	got, incomplete, err := r.attempts(ctx, []byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion)
	require.NoError(t, err)
	assert.Equal(t, []engine.ManualAttempt{{Verdict: "Approved", ConditionSHA256: ConditionDigest(approved("by hand")), Username: "bob", UID: "u-bob"}}, got)
	assert.False(t, incomplete)
	require.True(t, apierrors.IsNotFound(r.Reader.Get(ctx, objectKey(AttemptEventName([]byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion, 1)), &corev1.Event{})),
		"Bob's second attempt took another place")
}

// TestAnAttemptIsKeptOnlyAsTheWebhookMadeIt: the webhook's attempt is read
// back; an Event in an attempt's place that the manager did not sign is no
// attempt, and places all taken say the attempts may be incomplete.
func TestAnAttemptIsKeptOnlyAsTheWebhookMadeIt(t *testing.T) {
	ctx := t.Context()
	r := attemptRecorder(t)
	old, csr := approvalByHand()

	// Someone who may create Events takes place 0 first, claiming Ada denied.
	forged := r.attemptEvent([]byte("not the key"), CSRReference(old), old.ResourceVersion, old.ResourceVersion, 0, "deny", "forged", engine.ManualAttempt{Verdict: "Denied", Username: "ada"})
	// At the place's true name, which takes the key to know: the MAC is
	// what is checked here.
	forged.Name = AttemptEventName([]byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion, 0)
	require.NoError(t, r.Client.Create(ctx, forged))

	a, err := r.Attempt(ctx, csr, old, &authenticationv1.UserInfo{Username: "bob", UID: "u-bob"})
	require.NoError(t, err)
	assert.Equal(t, &engine.ManualAttempt{Verdict: "Approved", ConditionSHA256: ConditionDigest(approved("by hand")), Username: "bob", UID: "u-bob"}, a)
	got, incomplete, err := r.attempts(ctx, []byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion)
	require.NoError(t, err)
	assert.Equal(t, []engine.ManualAttempt{{Verdict: "Approved", ConditionSHA256: ConditionDigest(approved("by hand")), Username: "bob", UID: "u-bob"}}, got, "the forged place is skipped, Bob's kept in the next")
	// What was at the forged place before it (an attempt deleted, or
	// edited) is not known: the rule names nobody (review of 2026-12-06).
	assert.True(t, incomplete, "a place that does not verify was taken to hide nothing")

	// An Event edited after the webhook wrote it no longer verifies.
	var ev corev1.Event
	require.NoError(t, r.Reader.Get(ctx, objectKey(AttemptEventName([]byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion, 1)), &ev))
	ev.Annotations[AnnotationUsername] = "ada"
	require.NoError(t, r.Client.Update(ctx, &ev))
	got, _, err = r.attempts(ctx, []byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion)
	require.NoError(t, err)
	assert.Empty(t, got)

	// One person's same write, sent again and again (several at once from
	// one version, which the API server stores once): one place, so that
	// they cannot fill the places and be named by nobody (review of
	// 2026-12-06).
	for range MaxAttempts {
		_, err := r.Attempt(ctx, csr, old, &authenticationv1.UserInfo{Username: "cy", UID: "u-cy"})
		require.NoError(t, err)
	}
	got, incomplete, err = r.attempts(ctx, []byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion)
	require.NoError(t, err)
	assert.Len(t, got, 1, "cy's repeated write took more than one place")
	assert.True(t, incomplete, "the forged and the edited places were taken to hide nothing")

	// Every place taken: more attempts may have been made than are read.
	_, err = r.Attempt(ctx, csr, old, &authenticationv1.UserInfo{Username: "cy-2"})
	require.NoError(t, err)
	_, err = r.Attempt(ctx, csr, old, &authenticationv1.UserInfo{Username: "dee"})
	require.ErrorContains(t, err, "this attempt is not kept")
	got, incomplete, err = r.attempts(ctx, []byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion)
	require.NoError(t, err)
	assert.Len(t, got, MaxAttempts-2)
	assert.True(t, incomplete)

	// A write that adds no verdict is no attempt.
	a, err = r.Attempt(ctx, csr, csr, &authenticationv1.UserInfo{Username: "bob"})
	assert.NoError(t, err)
	assert.Nil(t, a)
}

// TestLongUsernamesStayApart: a username is cut for the attempt's Event, and
// two that share their first bytes remain two people.
func TestLongUsernamesStayApart(t *testing.T) {
	long := strings.Repeat("é", 600)
	a, b := boundUser(long+"a"), boundUser(long+"b")
	assert.LessOrEqual(t, len(a), maxAttemptUser)
	assert.NotEqual(t, a, b)
	assert.Equal(t, "ada", boundUser("ada"))
	assert.True(t, strings.HasPrefix(a, "é"), "cut at a rune's start")
}

// TestAttemptNamesAreTheKeys: an attempt's place is named with the key, so
// that nobody without it can take the places first (review 4, R2); any
// version makes a valid Event name.
func TestAttemptNamesAreTheKeys(t *testing.T) {
	name := AttemptEventName([]byte("k1"), "u-1", "Not/A Version", 3)
	assert.Regexp(t, `^ichor-attempt-[0-9a-f]{40}$`, name)
	assert.NotEqual(t, name, AttemptEventName([]byte("k2"), "u-1", "Not/A Version", 3), "another key, another name")
	assert.NotEqual(t, name, AttemptEventName([]byte("k1"), "u-1", "Not/A Version", 2), "another place, another name")
	assert.NotEqual(t, AttemptEventName([]byte("k1"), "u-1", "42", 0), AttemptEventName([]byte("k1"), "u-14", "2", 0), "fields cannot run into each other")
}

func objectKey(name string) client.ObjectKey {
	return client.ObjectKey{Namespace: EventNamespace, Name: name}
}

// Review 4, R2: Events at the names places had before (the request's UID
// and its readable resourceVersion), which anyone who may create Events in
// default could write, take no place: a lone approver is read back alone,
// and the attempts complete.
func TestSquattersTakeNoPlace(t *testing.T) {
	ctx := t.Context()
	r := attemptRecorder(t)
	old, csr := approvalByHand()
	for slot := range MaxAttempts {
		junk := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: EventNamespace, Name: fmt.Sprintf("ichor-attempt-%s-%s-%d", old.UID, old.ResourceVersion, slot)}}
		require.NoError(t, r.Client.Create(ctx, junk))
	}
	_, err := r.Attempt(ctx, csr, old, &authenticationv1.UserInfo{Username: "ada", UID: "u-ada"})
	require.NoError(t, err)
	got, incomplete, err := r.attempts(ctx, []byte(r.Keys.(staticKey)), old.UID, old.ResourceVersion)
	require.NoError(t, err)
	assert.Equal(t, []engine.ManualAttempt{{Verdict: "Approved", ConditionSHA256: ConditionDigest(approved("by hand")), Username: "ada", UID: "u-ada"}}, got)
	assert.False(t, incomplete)
}

// A DELETE's attempt counts only for a deletion seen within RevocationWindow
// of it: one refused an hour before must not name its sender as the revoker
// of a deletion the webhook did not see (review of 2026-12-06). One person's
// DELETE sent again takes its place again, with the later time; the Event
// does not tell the binding's resourceVersion; an attempt whose time was
// edited does not verify.
func TestARevocationAttemptCountsOnlyNearTheDeletion(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC))
	r := attemptRecorder(t)
	r.Clock = clk
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ichor-admin:u:frank:0123456789", UID: "b-frank", ResourceVersion: "77"}}
	ada := &authenticationv1.UserInfo{Username: "ada", UID: "u-ada"}

	_, err := r.AttemptRevocation(ctx, b, ada)
	require.NoError(t, err)
	got, incomplete, err := r.RevocationAttempts(ctx, b.UID, clk.Now().Add(-RevocationWindow))
	require.NoError(t, err)
	assert.Equal(t, []engine.ManualAttempt{{Verdict: engine.ActionRevoke, Username: "ada", UID: "u-ada"}}, got)
	assert.False(t, incomplete)

	// An hour later: refused then, it does not count now.
	clk.Step(time.Hour)
	got, _, err = r.RevocationAttempts(ctx, b.UID, clk.Now().Add(-RevocationWindow))
	require.NoError(t, err)
	assert.Empty(t, got, "an attempt of an hour before counted")

	// Ada asks again: her place, at the new time.
	_, err = r.AttemptRevocation(ctx, b, ada)
	require.NoError(t, err)
	got, _, err = r.RevocationAttempts(ctx, b.UID, clk.Now().Add(-RevocationWindow))
	require.NoError(t, err)
	assert.Len(t, got, 1)
	var ev corev1.Event
	require.NoError(t, r.Reader.Get(ctx, objectKey(AttemptEventName([]byte(r.Keys.(staticKey)), b.UID, DeletionVersion, 0)), &ev))
	assert.Empty(t, ev.InvolvedObject.ResourceVersion, "the Event tells the version a forged review must name")
	require.True(t, apierrors.IsNotFound(r.Reader.Get(ctx, objectKey(AttemptEventName([]byte(r.Keys.(staticKey)), b.UID, DeletionVersion, 1)), &corev1.Event{})),
		"Ada's second DELETE took another place")

	// Whoever may update Events moves an old attempt's time forward: it no
	// longer verifies, and the attempts read may miss one (an attempt of
	// another person, edited so that the one left is named).
	clk.Step(time.Hour)
	ev.Annotations[AnnotationOldResourceVersion] = fmt.Sprintf("%s@%d", DeletionVersion, clk.Now().Unix())
	require.NoError(t, r.Client.Update(ctx, &ev))
	got, incomplete, err = r.RevocationAttempts(ctx, b.UID, clk.Now().Add(-RevocationWindow))
	require.NoError(t, err)
	assert.Empty(t, got)
	assert.True(t, incomplete, "an edited attempt is not said to be missing")
}
