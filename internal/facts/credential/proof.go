package credential

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// Proof of admission.
//
// Only the admission webhook checks who asks as the API server authenticated
// them, so the issuer must not sign a request the webhook never saw (one
// created while the webhook configuration was missing, deleted or narrowed).
// The webhook's record of an admission is the issuance Event it writes on the
// TalosCluster before it admits (ADR 0124): it names the Event after the
// request's UID, which the API server assigns before validating admission and
// nobody can choose, and annotates it with a MAC over the request's UID,
// namespace, name and spec (requester included), the TalosCluster's UID and
// the admission decision id, with a second MAC over all that and the
// lifetime admitted (the purpose's default when the spec asks none, which a
// bundle may change before the issuer signs) and a third over all that and
// the credential admitted (what the purpose maps to, which a bundle may
// change too), each made with a key only the manager holds. The issuer looks
// the Event up by the UID and verifies the MACs: a request is admitted only
// if all hold.
// Anyone who may create Events in the namespace can write such an Event, but
// not its MAC; anyone who may delete Events can delete it, which refuses the
// request, and Events expire with the API server's --event-ttl (1h by
// default), so a request not issued within that is refused too.

// Annotations of an admission record.
const (
	AnnotationDecisionID = "ichor.dev/decision-id"
	AnnotationRequest    = "ichor.dev/taloscredentialrequest"
	AnnotationRequestUID = "ichor.dev/taloscredentialrequest-uid"
	AnnotationMAC        = "ichor.dev/admission-mac"
	// AnnotationLifetime is the lifetime admitted, in whole seconds, and
	// AnnotationLifetimeMAC the MAC that covers it as well. A record of a
	// webhook older than them has neither: it verifies only where the
	// manager accepts unpinned records (AcceptUnpinned, for a rolling
	// upgrade). An issuer older than them reads AnnotationMAC alone. A
	// record with one and not the other never verifies.
	AnnotationLifetime    = "ichor.dev/lifetime-seconds"
	AnnotationLifetimeMAC = "ichor.dev/admission-mac-lifetime"
	// AnnotationCredential is the credential admitted, the JSON object
	// the admission decision names (the Talos role, or the certificate's
	// common name, groups and bound role), and AnnotationCredentialMAC the
	// MAC that covers it and all AnnotationMAC covers. Older records have
	// neither and verify, the credential not compared, only where the
	// manager accepts unpinned records.
	AnnotationCredential    = "ichor.dev/credential"               //nolint:gosec // G101: an annotation's name, not a credential
	AnnotationCredentialMAC = "ichor.dev/admission-mac-credential" //nolint:gosec // G101: an annotation's name, not a credential
)

// MaxCredential bounds the credential a record names: a role, a common
// name and a few groups are a few hundred bytes.
const MaxCredential = 4096

// KeySecretKey is the key of the admission key Secret's data that holds the
// MAC key.
const KeySecretKey = "hmac-sha256.key" //nolint:gosec // G101: the name of a data key, not a key

// DefaultKeySecretName is the Secret, in the manager's namespace, that holds
// the admission key; the chart creates it empty and the manager fills it.
const DefaultKeySecretName = "ichor-policy-admission-key" //nolint:gosec // G101: a Secret's name, not a secret

// keyRefresh is how long a key read from the Secret is used before it is read
// again, so that a key replaced by an operator (after a leak, say) is used,
// and the old one no longer accepted, by every replica within that time.
const keyRefresh = 10 * time.Second

// keyReloadMin is the least time between two reads of the Secret when a
// record does not verify.
const keyReloadMin = 2 * time.Second

// RecordName is the name of the admission record (an Event in the request's
// namespace) of the request with this UID.
func RecordName(uid types.UID) string {
	return "ichor-admission-" + string(uid)
}

// The key Secret is read and filled by name in the manager's namespace only
// (a namespaced Role; the placeholder namespace becomes the release namespace
// in the chart).

// +kubebuilder:rbac:groups="",namespace=ichor-system,resources=secrets,resourceNames=ichor-policy-admission-key,verbs=get;update

// Keys reads the admission key from its Secret, filling the Secret with a new
// random key when it is empty. Replicas that race to fill it are ordered by
// the API server's optimistic concurrency: one update wins, the others read
// the winner's key. The Secret is never created here, so the manager needs
// only get and update on that one name.
type Keys struct {
	// Client reads and updates the Secret; uncached.
	Client    client.Client
	Namespace string
	Name      string
	// Clock is the clock; the real one if nil.
	Clock clock.PassiveClock

	mu   sync.Mutex
	key  []byte
	read time.Time
}

func (k *Keys) now() time.Time {
	if k.Clock != nil {
		return k.Clock.Now()
	}
	return time.Now()
}

// Key returns the current key, reading the Secret again at most every
// keyRefresh.
func (k *Keys) Key(ctx context.Context) ([]byte, error) {
	return k.get(ctx, keyRefresh)
}

// Reload reads the Secret again unless it was read within keyReloadMin: a
// record that does not verify may have been made with a key that replaced
// the one held here, and a flood of such records costs one read per
// keyReloadMin.
func (k *Keys) Reload(ctx context.Context) ([]byte, error) {
	return k.get(ctx, keyReloadMin)
}

func (k *Keys) get(ctx context.Context, maxAge time.Duration) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key != nil && k.now().Sub(k.read) < maxAge {
		return k.key, nil
	}
	key, err := k.load(ctx)
	if err != nil {
		return nil, err
	}
	k.key, k.read = key, k.now()
	return key, nil
}

func (k *Keys) load(ctx context.Context) ([]byte, error) {
	ref := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
	for attempt := 0; attempt < 3; attempt++ {
		var secret corev1.Secret
		if err := k.Client.Get(ctx, ref, &secret); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("admission key: Secret %s does not exist: create it empty (the Helm chart does) so the manager can fill it", ref)
			}
			return nil, fmt.Errorf("admission key: get Secret %s: %w", ref, err)
		}
		if key := secret.Data[KeySecretKey]; len(key) > 0 {
			if len(key) < 32 {
				return nil, fmt.Errorf("admission key: Secret %s holds a key of %d bytes under %q; delete the key so the manager makes a new one of 32", ref, len(key), KeySecretKey)
			}
			return key, nil
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("admission key: %w", err)
		}
		if secret.Data == nil {
			secret.Data = map[string][]byte{}
		}
		secret.Data[KeySecretKey] = key
		err := k.Client.Update(ctx, &secret)
		switch {
		case err == nil:
			return key, nil
		case apierrors.IsConflict(err):
			continue // another replica filled it: read theirs
		default:
			return nil, fmt.Errorf("admission key: fill Secret %s: %w", ref, err)
		}
	}
	return nil, fmt.Errorf("admission key: Secret %s kept changing while it was filled", ref)
}

// MAC is the admission MAC of a request, the UID of the TalosCluster it was
// admitted for (so a cluster deleted and created again under the same name,
// with other CAs, does not inherit it) and its admission decision id.
func MAC(key []byte, tcr *ichorv1alpha1.TalosCredentialRequest, namespace string, clusterUID types.UID, decisionID string) (string, error) {
	return mac(key, admitted{2, tcr.UID, namespace, tcr.Name, tcr.Spec, clusterUID, decisionID})
}

// LifetimeMAC is the MAC of all that MAC covers and the lifetime admitted,
// in whole seconds.
func LifetimeMAC(key []byte, tcr *ichorv1alpha1.TalosCredentialRequest, namespace string, clusterUID types.UID, decisionID string, lifetimeSeconds int64) (string, error) {
	return mac(key, struct {
		admitted
		LifetimeSeconds int64 `json:"lifetime_seconds"`
	}{admitted{3, tcr.UID, namespace, tcr.Name, tcr.Spec, clusterUID, decisionID}, lifetimeSeconds})
}

// CredentialMAC is the MAC of all that MAC covers and the credential
// admitted, the compact JSON object the admission decision names.
func CredentialMAC(key []byte, tcr *ichorv1alpha1.TalosCredentialRequest, namespace string, clusterUID types.UID, decisionID, credential string) (string, error) {
	return mac(key, struct {
		admitted
		Credential string `json:"credential"`
	}{admitted{4, tcr.UID, namespace, tcr.Name, tcr.Spec, clusterUID, decisionID}, credential})
}

// admitted is what a MAC covers of an admission; Version tells the payloads
// apart.
type admitted struct {
	Version    int                                      `json:"v"`
	UID        types.UID                                `json:"uid"`
	Namespace  string                                   `json:"namespace"`
	Name       string                                   `json:"name"`
	Spec       ichorv1alpha1.TalosCredentialRequestSpec `json:"spec"`
	ClusterUID types.UID                                `json:"cluster_uid"`
	DecisionID string                                   `json:"decision_id"`
}

func mac(key []byte, payload any) (string, error) {
	// encoding/json writes struct fields in order and map keys sorted, so
	// the webhook and the issuer, each decoding the object into the same
	// type, serialize the same content to the same bytes.
	data, err := json.Marshal(payload)
	if err != nil {
		return "", fmt.Errorf("admission MAC: %w", err)
	}
	m := hmac.New(sha256.New, key)
	m.Write(data)
	return base64.StdEncoding.EncodeToString(m.Sum(nil)), nil
}

// Admitted is what a verified admission record says of the admission: its
// decision id, the lifetime admitted in whole seconds (0: a record of a
// webhook from before the lifetime was recorded) and the credential
// admitted (nil: a record from before the credential was recorded).
type Admitted struct {
	DecisionID      string
	LifetimeSeconds int64
	Credential      json.RawMessage
}

// Unpinned says whether Verify accepts a record without the pins: the
// lifetime and the credential admitted, each under its MAC.
type Unpinned bool

const (
	// RefuseUnpinned: a record must pin both. Whoever may edit Events in
	// the namespace can take the pins away from a record and leave its
	// first MAC valid; refused, that leaves the request unissued rather than
	// signed with a lifetime or a credential other than the one admitted.
	RefuseUnpinned Unpinned = false
	// AcceptUnpinned: a record without a pin verifies as an older webhook's
	// (or one of a bundle that names no credential), and that pin is not
	// compared: for a rolling upgrade from a release whose webhook wrote
	// none (--require-admission-pins=false).
	AcceptUnpinned Unpinned = true
)

// Verify reports whether the record proves the webhook admitted exactly
// this request for the cluster with clusterUID: its MAC, with the current
// key, covers the request's UID, namespace, name and spec, that cluster and
// the decision id it names, its lifetime MAC the lifetime it names as well,
// and its credential MAC the credential it names. A record that does not is
// described, never an error: it is a fact for the rule.
//
// A record without the lifetime and its MAC, or without the credential and
// its MAC, verifies only if unpinned is AcceptUnpinned, and then says no
// lifetime or no credential: whoever may edit Events can strip both from a
// new record and so have it read as an older webhook's, which leaves the
// issuer as it was before the pins were recorded (a default or a mapping
// changed between admission and signing goes unnoticed), never more.
func Verify(key []byte, tcr *ichorv1alpha1.TalosCredentialRequest, clusterUID types.UID, record *corev1.Event, unpinned Unpinned) (ok bool, got Admitted, why string) {
	got.DecisionID = record.Annotations[AnnotationDecisionID]
	recorded := record.Annotations[AnnotationMAC]
	if recorded == "" {
		return notOurs(record, got.DecisionID, "carries no "+AnnotationMAC+" annotation")
	}
	want, err := MAC(key, tcr, tcr.Namespace, clusterUID, got.DecisionID)
	if err != nil {
		return false, Admitted{DecisionID: got.DecisionID}, err.Error()
	}
	if !hmac.Equal([]byte(recorded), []byte(want)) {
		return false, Admitted{DecisionID: got.DecisionID}, fmt.Sprintf("the MAC of the Event %s/%s does not match this request's uid, spec and requester, its cluster and the manager's admission key", record.Namespace, record.Name)
	}
	text, hasLifetime := record.Annotations[AnnotationLifetime]
	lifetimeMAC, hasLifetimeMAC := record.Annotations[AnnotationLifetimeMAC]
	switch {
	case !hasLifetime && !hasLifetimeMAC && unpinned == AcceptUnpinned:
		return verifyCredential(key, tcr, clusterUID, record, got, unpinned)
	case !hasLifetime && !hasLifetimeMAC:
		return notOurs(record, got.DecisionID, unpinnedWhy(AnnotationLifetime))
	case !hasLifetime || !hasLifetimeMAC:
		return notOurs(record, got.DecisionID, "carries one of "+AnnotationLifetime+" and "+AnnotationLifetimeMAC+" without the other")
	}
	// Whole seconds, written as strconv writes them: anything else is not
	// a lifetime the webhook wrote.
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != text {
		return notOurs(record, got.DecisionID, "carries a "+AnnotationLifetime+" annotation that is not a lifetime in whole seconds")
	}
	want, err = LifetimeMAC(key, tcr, tcr.Namespace, clusterUID, got.DecisionID, n)
	if err != nil {
		return false, Admitted{DecisionID: got.DecisionID}, err.Error()
	}
	if !hmac.Equal([]byte(lifetimeMAC), []byte(want)) {
		return false, Admitted{DecisionID: got.DecisionID}, fmt.Sprintf("the lifetime MAC of the Event %s/%s does not match the lifetime it names, this request's uid, spec and requester, its cluster and the manager's admission key", record.Namespace, record.Name)
	}
	got.LifetimeSeconds = n
	return verifyCredential(key, tcr, clusterUID, record, got, unpinned)
}

// notOurs is the answer of Verify for a record the webhook did not write as
// it is: not verified, what it says of itself, and why.
func notOurs(record *corev1.Event, decisionID, what string) (bool, Admitted, string) {
	return false, Admitted{DecisionID: decisionID}, fmt.Sprintf("the Event %s/%s %s", record.Namespace, record.Name, what)
}

// unpinnedWhy says why a record without a pin does not verify.
func unpinnedWhy(annotation string) string {
	return "carries no " + annotation + " annotation nor its MAC: the record of a webhook from before the pins, or one whose pins were taken away, and the manager requires them (--require-admission-pins)"
}

// verifyCredential is Verify's last step: the credential a record names,
// if it names one, under its MAC.
func verifyCredential(key []byte, tcr *ichorv1alpha1.TalosCredentialRequest, clusterUID types.UID, record *corev1.Event, got Admitted, unpinned Unpinned) (bool, Admitted, string) {
	text, hasCredential := record.Annotations[AnnotationCredential]
	credentialMAC, hasCredentialMAC := record.Annotations[AnnotationCredentialMAC]
	switch {
	case !hasCredential && !hasCredentialMAC && unpinned == AcceptUnpinned:
		return true, got, ""
	case !hasCredential && !hasCredentialMAC:
		return notOurs(record, got.DecisionID, unpinnedWhy(AnnotationCredential))
	case !hasCredential || !hasCredentialMAC:
		return notOurs(record, got.DecisionID, "carries one of "+AnnotationCredential+" and "+AnnotationCredentialMAC+" without the other")
	case len(text) > MaxCredential:
		return notOurs(record, got.DecisionID, fmt.Sprintf("carries a %s annotation of %d bytes, more than the %d a record holds", AnnotationCredential, len(text), MaxCredential))
	}
	want, err := CredentialMAC(key, tcr, tcr.Namespace, clusterUID, got.DecisionID, text)
	if err != nil {
		return false, Admitted{DecisionID: got.DecisionID}, err.Error()
	}
	if !hmac.Equal([]byte(credentialMAC), []byte(want)) {
		return false, Admitted{DecisionID: got.DecisionID}, fmt.Sprintf("the credential MAC of the Event %s/%s does not match the credential it names, this request's uid, spec and requester, its cluster and the manager's admission key", record.Namespace, record.Name)
	}
	// Under the MAC, only the webhook wrote it, a JSON object; anything
	// else is not handed to the rule.
	var object map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &object); err != nil || object == nil {
		return notOurs(record, got.DecisionID, "carries a "+AnnotationCredential+" annotation that is not a JSON object")
	}
	got.Credential = json.RawMessage(text)
	return true, got, ""
}
