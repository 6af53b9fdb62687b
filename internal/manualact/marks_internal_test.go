package manualact

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestAMarkVerifiesAndTheMarksOfRequestsGoneAreDropped (review 4, R3): a
// mark is found only for its request and verdict, and only as the manager
// wrote it; each write drops the marks of requests no longer there and
// unreadable ones; and no more than MaxMarks are kept.
func TestAMarkVerifiesAndTheMarksOfRequestsGoneAreDropped(t *testing.T) {
	ctx := t.Context()
	live := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-live", UID: "u-live"}}
	requests := fake.NewClientBuilder().WithObjects(live).Build()
	marks := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ichor-system", Name: MarksConfigMapName}, Data: map[string]string{
		"act-gone":       `{"uid":"u-gone","act":"Approved","decision_id":"d-0","mac":"x"}`,
		"act-unreadable": "{",
	}}
	c := fake.NewClientBuilder().WithObjects(marks).Build()
	key := []byte("0123456789abcdef0123456789abcdef")
	r := &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
	ref := corev1.ObjectReference{Name: live.Name, UID: live.UID}

	id, err := r.marked(ctx, key, live.UID, "Approved")
	require.NoError(t, err)
	assert.Empty(t, id)
	require.NoError(t, r.mark(ctx, key, ref, "Approved", "d-1", requests))
	id, err = r.marked(ctx, key, live.UID, "Approved")
	require.NoError(t, err)
	assert.Equal(t, "d-1", id)
	id, _ = r.marked(ctx, key, live.UID, "Denied")
	assert.Empty(t, id, "a mark of one verdict is no mark of the other")
	id, _ = r.marked(ctx, []byte("another key, another manager"), live.UID, "Approved")
	assert.Empty(t, id)

	var got corev1.ConfigMap
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(marks), &got))
	assert.Len(t, got.Data, 1, "the marks of requests gone, and unreadable ones, are dropped: %v", got.Data)

	// A mark edited (the decision id of another record) does not verify.
	for k, v := range got.Data {
		got.Data[k] = v[:len(v)-1] + `,"decision_id":"d-forged"}`
	}
	require.NoError(t, c.Update(ctx, &got))
	id, _ = r.marked(ctx, key, live.UID, "Approved")
	assert.Empty(t, id)

	// Full: the mark is not written, and that is no error (the act was
	// recorded; a restart may record it again).
	full := map[string]string{}
	many := []client.Object{live}
	for i := range MaxMarks {
		uid := types.UID(fmt.Sprintf("u-%d", i))
		many = append(many, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: string(uid), UID: uid}})
		full[MarkKey(key, uid, "Approved")] = fmt.Sprintf(`{"uid":%q,"act":"Approved","decision_id":"d","mac":%q}`, uid, mac(key, uid, "Approved", "d"))
	}
	got.Data = full
	require.NoError(t, c.Update(ctx, &got))
	requests = fake.NewClientBuilder().WithObjects(many...).Build()
	require.NoError(t, r.mark(ctx, key, ref, "Approved", "d-2", requests))
	id, _ = r.marked(ctx, key, live.UID, "Approved")
	assert.Empty(t, id)
}

// TestTheMarksAreBoundedByBytesAndARefusedMarkIsNotTriedAgain (review 5,
// F1): the marks are bounded by their size as well as their number, and an
// update the API server refuses for good (too large, invalid, forbidden) is
// logged, not an error for the queue to try again for ever; one that may
// pass later (unavailable) is.
func TestTheMarksAreBoundedByBytesAndARefusedMarkIsNotTriedAgain(t *testing.T) {
	ctx := t.Context()
	live := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-live", UID: "u-live"}}
	big := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-big", UID: "u-big"}}
	requests := fake.NewClientBuilder().WithObjects(live, big).Build()
	key := []byte("0123456789abcdef0123456789abcdef")
	ref := corev1.ObjectReference{Name: strings.Repeat("<", 4096), UID: live.UID}
	newMarks := func(data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ichor-system", Name: MarksConfigMapName}, Data: data}
	}

	// A mark holds no name: its size does not grow with the request's.
	c := fake.NewClientBuilder().WithObjects(newMarks(nil)).Build()
	r := &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
	require.NoError(t, r.mark(ctx, key, ref, "Approved", "d-1", requests))
	var got corev1.ConfigMap
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(newMarks(nil)), &got))
	require.Len(t, got.Data, 1)
	assert.Less(t, dataBytes(got.Data), 300, "%v", got.Data)

	// Full by bytes, with one mark: nothing written, no error.
	bigID := strings.Repeat("d", MaxMarksBytes-200)
	filler := fmt.Sprintf(`{"uid":"u-big","act":"Approved","decision_id":%q,"mac":%q}`, bigID, mac(key, big.UID, "Approved", bigID))
	c = fake.NewClientBuilder().WithObjects(newMarks(map[string]string{MarkKey(key, big.UID, "Approved"): filler})).Build()
	r = &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
	require.NoError(t, r.mark(ctx, key, ref, "Approved", "d-1", requests))
	id, err := r.marked(ctx, key, live.UID, "Approved")
	require.NoError(t, err)
	assert.Empty(t, id, "no mark past MaxMarksBytes")

	for name, refusal := range map[string]error{
		"too large": apierrors.NewRequestEntityTooLargeError("limit is 1048576"),
		"invalid":   apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, MarksConfigMapName, nil),
		"forbidden": apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, MarksConfigMapName, errors.New("no update")),
	} {
		c = fake.NewClientBuilder().WithObjects(newMarks(nil)).WithInterceptorFuncs(interceptor.Funcs{
			Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error { return refusal },
		}).Build()
		r = &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
		assert.NoError(t, r.mark(ctx, key, ref, "Approved", "d-1", requests), "refused for good (%s): logged, not tried again", name)
	}
	c = fake.NewClientBuilder().WithObjects(newMarks(nil)).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error {
			return apierrors.NewServiceUnavailable("injected")
		},
	}).Build()
	r = &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
	assert.Error(t, r.mark(ctx, key, ref, "Approved", "d-1", requests), "unavailable: tried again")
}

// TestAForbiddenReadOfTheMarksIsNoMark (review 5, F2): a manager that may
// not read its marks looks for the record's Event instead, as without the
// ConfigMap; it does not stop recording.
func TestAForbiddenReadOfTheMarksIsNoMark(t *testing.T) {
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, MarksConfigMapName, errors.New("no get"))
		},
	}).Build()
	r := &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
	key := []byte("0123456789abcdef0123456789abcdef")
	id, err := r.marked(t.Context(), key, "u-1", "Approved")
	require.NoError(t, err)
	assert.Empty(t, id)
	require.NoError(t, r.mark(t.Context(), key, corev1.ObjectReference{Name: "csr-1", UID: "u-1"}, "Approved", "d-1", nil))
}

// TestMarksThatDoNotVerifyAreDropped (review 5, F6): a write of a mark
// drops the marks that no longer verify (made with a key since replaced,
// edited, or junk that reads as JSON) even of requests still there, so that
// they count toward no bound.
func TestMarksThatDoNotVerifyAreDropped(t *testing.T) {
	ctx := t.Context()
	live := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-live", UID: "u-live"}}
	other := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-other", UID: "u-other"}}
	requests := fake.NewClientBuilder().WithObjects(live, other).Build()
	oldKey := []byte("the key before it was replaced..")
	key := []byte("0123456789abcdef0123456789abcdef")
	kept := fmt.Sprintf(`{"uid":"u-other","act":"Approved","decision_id":"d-0","mac":%q}`, mac(key, other.UID, "Approved", "d-0"))
	marks := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ichor-system", Name: MarksConfigMapName}, Data: map[string]string{
		MarkKey(oldKey, live.UID, "Approved"): fmt.Sprintf(`{"uid":"u-live","act":"Approved","decision_id":"d-old","mac":%q}`, mac(oldKey, live.UID, "Approved", "d-old")),
		"act-junk":                            `{"uid":"u-live","act":"Approved","decision_id":"d-junk","mac":"x"}`,
		"act-moved":                           kept, // a verifying value under another key
		MarkKey(key, other.UID, "Approved"):   kept,
	}}
	c := fake.NewClientBuilder().WithObjects(marks).Build()
	r := &Recorder{Reader: c, Client: c, Namespace: "ichor-system"}
	require.NoError(t, r.mark(ctx, key, corev1.ObjectReference{Name: live.Name, UID: live.UID}, "Approved", "d-1", requests))

	var got corev1.ConfigMap
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(marks), &got))
	assert.ElementsMatch(t, []string{MarkKey(key, live.UID, "Approved"), MarkKey(key, other.UID, "Approved")}, slices.Collect(maps.Keys(got.Data)),
		"only the marks that verify with the key are kept")
}
