package manualact

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// A request's decision by hand, once recorded, is marked so in one
// ConfigMap of the manager's namespace, MarksConfigMapName (review 4, R3).
//
// The mark must last as long as the request does: as the leader's watch
// starts (a restart, a rollout, a leader change) it lists every request, and
// records each one it finds decided by hand unless its mark is there. The
// record's Event, which was the mark before, is deleted after the API
// server's --event-ttl (an hour by default), while kube-controller-manager
// keeps a decided request an hour or two more, or for ever with its cleaner
// off: every start in that gap recorded the decision again. A ConfigMap has
// no TTL. The chart creates it empty, as it does the bundle epoch's, so the
// manager needs get and update on that one name: no right to create, list
// or delete anything. Each write of a mark drops the marks that do not
// verify and those of requests that are no longer in the API server (the
// watch's cache lists them), and at most MaxMarks, of MaxMarksBytes, are
// kept: a mark that does not fit, or that the API server refuses for good,
// is not written, and the decision may be recorded again at a restart,
// never lost.
//
// The places weighed and left: an annotation on the request itself needs
// update or patch on every CertificateSigningRequest in the cluster, any
// signer's (labels, annotations and finalizers: a finalizer keeps a request
// from being deleted), and changes the request's resourceVersion under
// everyone who watches it; a ConfigMap per mark needs create on ConfigMaps
// in the namespace, which cannot be limited to names and so would let the
// manager create the bundle epoch's ConfigMap, which it must never do;
// skipping requests found decided long ago would trust the condition's
// lastUpdateTime, which whoever decides writes.
//
// A mark's key is an HMAC of the request's UID and the verdict with the
// admission key (as the attempts' names, review 4, R2), and its value
// carries a MAC over the UID, the verdict and the record's decision id: a
// mark that does not verify marks nothing, so at worst an act is recorded
// twice, never not at all. Only the manager and whoever administers its
// namespace may write that ConfigMap. Whoever can read the key (its
// Secret) can write a mark that verifies, before a decision by hand, and
// so keep it from being recorded (review 5, F3), as with the Event before
// the marks: the key's readers are the manager's equals.

// MarksConfigMapName is the ConfigMap, in the manager's namespace, that
// holds the marks of the decisions by hand recorded.
const MarksConfigMapName = "ichor-policy-record-marks"

// +kubebuilder:rbac:groups="",namespace=ichor-system,resources=configmaps,resourceNames=ichor-policy-record-marks,verbs=get;update

// MaxMarks bounds the number of marks kept, and MaxMarksBytes their size
// (keys and values), well under the API server's 1 MiB for a ConfigMap's
// data (review 5, F1). A mark holds no name: a request's name is not
// validated (etcd's request size is its only bound), so one long name would
// fill the ConfigMap. Its key is 44 bytes and its value, four fields of
// bounded length (a UID, a verdict, a decision id, a MAC), about 200.
const (
	MaxMarks      = 2000
	MaxMarksBytes = 900 << 10
)

// errMarksFull is MaxMarks marks, or MaxMarksBytes, of requests still
// there.
var errMarksFull = errors.New("the marks are full")

// markEntry is a mark's value: the request's UID, the act, the record's
// decision id and the MAC. No name (review 5, F1): the UID finds the request.
type markEntry struct {
	UID        string `json:"uid"`
	Act        string `json:"act"`
	DecisionID string `json:"decision_id"`
	MAC        string `json:"mac"`
}

// MarkKey is the key, in the marks' ConfigMap, of the mark of the verdict
// (act) of the request with this UID: an HMAC of both with the records' key.
func MarkKey(key []byte, uid types.UID, act string) string {
	fields, _ := json.Marshal([]string{string(uid), act})
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ichor-act-mark\x00"))
	m.Write(fields)
	return "act-" + hex.EncodeToString(m.Sum(nil))[:40]
}

func (r *Recorder) marks() client.ObjectKey {
	return client.ObjectKey{Namespace: r.Namespace, Name: MarksConfigMapName}
}

// marked is the decision id of the verified mark of the act on the request
// with uid, or "" when there is none (or no ConfigMap to keep marks in).
func (r *Recorder) marked(ctx context.Context, key []byte, uid types.UID, act string) (string, error) {
	if r.Namespace == "" {
		return "", nil
	}
	var cm corev1.ConfigMap
	err := r.Reader.Get(ctx, r.marks(), &cm)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if apierrors.IsForbidden(err) {
		// Review 5, F2: a manager that may not read its marks (its Role
		// edited, rolled out after the Deployment, or bound in another
		// namespace) must still record, as without the ConfigMap: the
		// record's Event is looked for instead, and marks until
		// --event-ttl. At worst twice, never not at all.
		log.FromContext(ctx).Error(err, "the manager may not read its marks: the act's Event is looked for instead, and a restart may record it again once that has expired",
			"configmap", MarksConfigMapName, "namespace", r.Namespace)
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look for the act's mark: %w", err)
	}
	markKey := MarkKey(key, uid, act)
	raw, ok := cm.Data[markKey]
	if !ok {
		return "", nil
	}
	e, ok := verified(key, markKey, raw)
	if !ok || e.UID != string(uid) || e.Act != act {
		log.FromContext(ctx).Info("a mark by this act's key does not verify: the act is recorded", "configmap", MarksConfigMapName, "act", act)
		return "", nil
	}
	return e.DecisionID, nil
}

// verified is the mark stored under markKey with value raw, and whether
// it verifies with key: its key and its MAC are the ones key makes for its
// UID, act and decision id.
func verified(key []byte, markKey, raw string) (markEntry, bool) {
	var e markEntry
	if json.Unmarshal([]byte(raw), &e) != nil || e.DecisionID == "" || markKey != MarkKey(key, types.UID(e.UID), e.Act) {
		return e, false
	}
	return e, hmac.Equal([]byte(e.MAC), []byte(mac(key, types.UID(e.UID), e.Act, e.DecisionID)))
}

// mark adds the mark of the act on the request, recorded as decisionID,
// and drops the marks of requests no longer in requests (the watch's cache;
// nil drops none). Without the ConfigMap (a manager installed without the
// chart), or with MaxMarks marks of requests still there, it writes nothing
// and logs why: the act may then be recorded again at a restart.
func (r *Recorder) mark(ctx context.Context, key []byte, regarding corev1.ObjectReference, act, decisionID string, requests client.Reader) error {
	if r.Namespace == "" {
		return nil
	}
	value, err := json.Marshal(markEntry{
		UID: string(regarding.UID), Act: act, DecisionID: decisionID, MAC: mac(key, regarding.UID, act, decisionID),
	})
	if err != nil {
		return err
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cm corev1.ConfigMap
		if err := r.Reader.Get(ctx, r.marks(), &cm); err != nil {
			return err
		}
		if err := prune(ctx, key, &cm, requests); err != nil {
			return err
		}
		markKey := MarkKey(key, regarding.UID, act)
		if len(cm.Data) >= MaxMarks || dataBytes(cm.Data)+len(markKey)+len(value) > MaxMarksBytes {
			return errMarksFull
		}
		cm.Data[markKey] = string(value)
		return r.Client.Update(ctx, &cm)
	})
	switch {
	case apierrors.IsNotFound(err):
		log.FromContext(ctx).Info("no ConfigMap to mark the act recorded in (the chart creates it): a restart may record it again once its Event has expired",
			"configmap", MarksConfigMapName, "namespace", r.Namespace)
		return nil
	case apierrors.IsForbidden(err):
		// Review 5, F2: a manager without its rights on the ConfigMap
		// (a Role edited, rolled out after the Deployment, or in another
		// namespace) still records; the Event marks, as before the marks.
		log.FromContext(ctx).Error(err, "the manager may not read or write its marks: the act is marked by its Event only, and a restart may record it again once that has expired",
			"configmap", MarksConfigMapName, "namespace", r.Namespace)
		return nil
	case errors.Is(err, errMarksFull), apierrors.IsRequestEntityTooLargeError(err), apierrors.IsInvalid(err):
		// Full, or refused as too large or invalid (review 5, F1): a
		// permanent refusal, not tried again.
		log.FromContext(ctx).Error(err, "the act is not marked recorded (the marks are full): a restart may record it again once its Event has expired",
			"configmap", MarksConfigMapName, "max_marks", MaxMarks, "max_marks_bytes", MaxMarksBytes)
		return nil
	case err != nil:
		return fmt.Errorf("mark the act recorded: %w", err)
	}
	return nil
}

// dataBytes is the size of a ConfigMap's data, as the API server counts it
// against its limit.
func dataBytes(data map[string]string) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}

// prune drops, from the marks, those that do not verify with key (made
// with a key since replaced, edited, or junk: review 5, F6), which would
// count toward the bounds and mark nothing, and those of requests that are
// no longer there.
func prune(ctx context.Context, key []byte, cm *corev1.ConfigMap, requests client.Reader) error {
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	live := map[string]bool{}
	if requests != nil {
		var list certificatesv1.CertificateSigningRequestList
		// Read only: the cache's own objects, not a copy of every request.
		if err := requests.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("list the requests whose marks to keep: %w", err)
		}
		for _, csr := range list.Items {
			live[string(csr.UID)] = true
		}
	}
	for k, v := range cm.Data {
		if e, ok := verified(key, k, v); !ok || requests != nil && !live[e.UID] {
			delete(cm.Data, k)
		}
	}
	return nil
}
