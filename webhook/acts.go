package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// The paths of the webhooks that record a person's acts
// (deploy/webhook/recorder names them too).
const (
	PathRecordCSRApproval        = "/record-certificates-k8s-io-v1-certificatesigningrequest-approval"
	PathRecordAdminBindingDelete = "/record-rbac-v1-clusterrolebinding-delete"
)

// ActRecorder is the admission webhook that sees what a person does with
// their own rights where Ichor does not decide: a CSR of a signer Ichor
// decides approved or denied (UPDATE of certificatesigningrequests/approval),
// an admin binding deleted (DELETE of a ClusterRoleBinding labelled
// ichor.dev/admin-binding). The API server tells a webhook, and only a
// webhook, who makes a write.
//
// A webhook is called before the write is stored, and the API server may
// then refuse it: of an approve and a deny sent at once on one request, both
// pass admission and one is stored. So a verdict is not recorded here: the
// webhook keeps the write as an attempt (manualact.Recorder.Attempt), and
// the manager's watch records the verdict stored, naming the person from
// the attempts (review 3, F2). A binding's DELETE is kept as an attempt the
// same way, and recorded once the binding is gone, by the watch and by this
// webhook's replica (review of 2026-12-06).
//
// It allows, whatever happens, with one exception: it is registered with
// failurePolicy Ignore and a short timeout, and answers allowed, so that
// neither a person's decision nor a revocation waits on the manager. The
// exception is a person's verdict whose message ends as an approver's
// ("(decision ID, policy revision R)"): the watch would take it for Ichor's
// and record no one's act, so it is refused (review 4, R1). It
// keeps nothing of a dry run (sideEffects NoneOnDryRun). The manager's own
// writes never reach it: the configuration's matchConditions leave out the
// manager's ServiceAccount.
type ActRecorder struct {
	Recorder *manualact.Recorder
	// Signers are the signers whose requests Ichor decides here; a request
	// of another is not recorded (the configuration's matchConditions leave
	// them out already).
	Signers []string
	// Reader reads the object a review names past the cache (nil: the
	// manager's API reader). The webhook's port answers whoever reaches it,
	// not the API server alone, and the user a review names is only the
	// sender's word: a review is kept only if it names the version of the
	// object the API server stores (stored), which the API server's own
	// reviews do and a sender who cannot read the object cannot.
	Reader client.Reader
	// Revocations records a binding's deletion once it is gone, and tries
	// a record that failed again (nil: one of its own, which
	// SetupWithManager runs on the manager). The manager gives the one
	// the admin bindings' watch records with, so that a revocation both
	// see is tried by one of them at a time.
	Revocations *manualact.Revocations

	// polling are the bindings (by UID) whose deletion this replica waits
	// for, to record it (recordOnceGone), each until its deadline, which
	// every review of the binding's deletion moves to revocationWait from
	// then: one wait a binding. waits counts the waits begun.
	mu      sync.Mutex
	polling map[types.UID]time.Time
	waits   atomic.Int64
}

// SetupWithManager registers the two paths on the manager's webhook server.
func (a *ActRecorder) SetupWithManager(mgr ctrl.Manager) error {
	if a.Recorder == nil || a.Recorder.Engine == nil {
		return errors.New("act recorder webhook: no recorder")
	}
	if a.Recorder.Reader == nil {
		a.Recorder.Reader = mgr.GetAPIReader()
	}
	if a.Recorder.Client == nil {
		a.Recorder.Client = mgr.GetClient()
	}
	if a.Reader == nil {
		a.Reader = mgr.GetAPIReader()
	}
	if a.Revocations == nil {
		a.Revocations = &manualact.Revocations{Recorder: a.Recorder}
		if err := mgr.Add(a.Revocations); err != nil {
			return fmt.Errorf("act recorder webhook: %w", err)
		}
	}
	srv := mgr.GetWebhookServer()
	srv.Register(PathRecordCSRApproval, &crwebhook.Admission{Handler: admission.HandlerFunc(a.csrApproval)})
	srv.Register(PathRecordAdminBindingDelete, &crwebhook.Admission{Handler: admission.HandlerFunc(a.bindingDeletion)})
	return nil
}

// allowed is every answer: the act is the API server's to authorize.
func allowed() admission.Response { return admission.Allowed("") }

func (a *ActRecorder) csrApproval(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Update || req.SubResource != "approval" || (req.DryRun != nil && *req.DryRun) {
		return allowed()
	}
	var csr, old certificatesv1.CertificateSigningRequest
	if err := json.Unmarshal(req.Object.Raw, &csr); err != nil {
		log.FromContext(ctx).Error(err, "decode the certificate signing request to record its decision")
		return allowed()
	}
	if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
		log.FromContext(ctx).Error(err, "decode the certificate signing request to record its decision")
		return allowed()
	}
	if !a.decides(csr.Spec.SignerName) {
		return allowed()
	}
	if c := addedVerdictReadingAsIchors(&csr, &old); c != nil {
		// The manager's own writes never reach this webhook (its match
		// conditions leave its ServiceAccount out); a person's verdict that
		// reads as an approver's would be taken for Ichor's and recorded
		// as no one's act. This webhook fails open; the chart's
		// <release>-approver-messages policy refuses the same in the API
		// server itself while it is down.
		return admission.Denied(fmt.Sprintf("the %s condition's message ends as an Ichor approver's does (\"(decision ID, policy revision R)\"), which only Ichor writes: a person's decision is recorded as theirs; write the message without that ending", c.Type))
	}
	if !a.stored(ctx, &certificatesv1.CertificateSigningRequest{}, &old) {
		return allowed()
	}
	attempt, err := a.Recorder.Attempt(ctx, &csr, &old, &req.UserInfo)
	manualact.LogAttempt(ctx, "csr", csr.Name, attempt, err)
	return allowed()
}

func (a *ActRecorder) bindingDeletion(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Delete || (req.DryRun != nil && *req.DryRun) {
		return allowed()
	}
	var b rbacv1.ClusterRoleBinding
	if err := json.Unmarshal(req.OldObject.Raw, &b); err != nil {
		log.FromContext(ctx).Error(err, "decode the ClusterRoleBinding to record its deletion")
		return allowed()
	}
	if !manualact.IsAdminBinding(&b) {
		manualact.LogIgnored(ctx, &b)
		return allowed()
	}
	// From here on the binding as the API server stores it, not as the
	// review's sender wrote it (only its UID and version are checked).
	live := &rbacv1.ClusterRoleBinding{}
	if !a.stored(ctx, live, &b) || !manualact.IsAdminBinding(live) {
		return allowed()
	}
	// Kept as an attempt, not recorded: admitted is not stored (another
	// webhook, a policy or a timeout may still refuse the DELETE), nor gone
	// (finalizers, its own or those its propagation adds, hold it while it
	// still grants cluster-admin: review of 2026-12-05). The watch records
	// the revocation once the binding is gone.
	attempt, err := a.Recorder.AttemptRevocation(ctx, live, &req.UserInfo)
	manualact.LogAttempt(ctx, "binding", live.Name, attempt, err)
	// The watch that records it runs on the leader only, and a deletion
	// made while the leader changes is not in the next one's list: this
	// replica records it too once the binding is gone (the record's mark
	// keeps it to one record, or two in a race, never none), whether this
	// attempt was kept or not (the record then names whoever else's attempt
	// counts, or nobody). One wait a binding, however many reviews name it
	// (a review can be sent again and again to the webhook's port); a
	// review during a wait moves its deadline, so that a DELETE admitted
	// near the end of another's wait is waited for too.
	if a.waitFor(live.UID) {
		a.waits.Add(1)
		// Not the request's end: the wait outlives it, with its logger.
		go a.recordOnceGone(context.WithoutCancel(ctx), live)
	}
	return allowed()
}

// waitFor sets the deadline of the wait for the deletion of the binding uid
// to revocationWait from now, and reports whether a wait is to begin.
func (a *ActRecorder) waitFor(uid types.UID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.polling == nil {
		a.polling = map[types.UID]time.Time{}
	}
	_, waiting := a.polling[uid]
	a.polling[uid] = time.Now().Add(revocationWait)
	return !waiting
}

// stillWaiting reports whether the wait for the binding uid is within its
// deadline, and ends it otherwise: a review after that begins another.
func (a *ActRecorder) stillWaiting(uid types.UID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Now().Before(a.polling[uid]) {
		return true
	}
	delete(a.polling, uid)
	return false
}

// doneWaiting ends the wait for the binding uid.
func (a *ActRecorder) doneWaiting(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.polling, uid)
}

// revocationWait bounds how long the webhook waits for an admitted DELETE to
// be stored: a deletion held longer (finalizers) or refused is the watch's.
const revocationWait = 30 * time.Second

// recordOnceGone records the revocation of b once the API server no longer
// stores it, if it is gone by the wait's deadline (waitFor), as it was last
// read: a revoked-by annotation written before the deletion is the record's
// claim, as the watch's final copy would have it. The binding is read once
// more after the deadline before the wait ends.
func (a *ActRecorder) recordOnceGone(ctx context.Context, b *rbacv1.ClusterRoleBinding) {
	// Read at 200 ms, then less often, to 5 s apart: forged reviews of
	// every admin binding cost the API server a read a binding every few
	// seconds, not five a second.
	delay := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 10, Cap: 5 * time.Second}.DelayFunc()
	last := b
	for {
		select {
		case <-ctx.Done():
			a.doneWaiting(b.UID)
			return
		case <-time.After(delay()):
		}
		read, cancel := context.WithTimeout(ctx, 10*time.Second)
		var live rbacv1.ClusterRoleBinding
		err := a.Reader.Get(read, client.ObjectKeyFromObject(b), &live)
		cancel()
		if err == nil && live.UID == b.UID {
			last = &live
		} else if apierrors.IsNotFound(err) || err == nil {
			// Gone, or gone and made again under its name.
			break
		}
		if !a.stillWaiting(b.UID) {
			return
		}
	}
	// Another review of the binding now begins a wait of its own, which
	// finds it gone and the record's mark there, or makes the record a
	// second time in a race: never none.
	a.doneWaiting(b.UID)
	// The leader's watch records it at once, usually: this record is for
	// when none did, so it waits a little first, and finds the watch's
	// mark then.
	select {
	case <-ctx.Done():
		return
	case <-time.After(revocationGrace):
	}
	record, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a.Revocations.Revoked(record, last)
}

// revocationGrace is how long the webhook leaves the leader's watch to
// record a revocation before it does.
const revocationGrace = 5 * time.Second

// stored reports whether old, the object a review names as it was before
// the write, is the version the API server stores now (its UID and
// resourceVersion): the API server sends a review of the version it holds,
// while a review sent by anyone else who reaches the webhook's port names
// whatever user it likes, and is kept only if its sender could read the
// object. Anything else (another version, the object gone, a read that
// failed: a write that raced this one) keeps nothing here; the watch then
// records what is stored, its actor unknown rather than a sender's claim.
func (a *ActRecorder) stored(ctx context.Context, live client.Object, old client.Object) bool {
	err := a.Reader.Get(ctx, client.ObjectKeyFromObject(old), live)
	if err == nil && live.GetUID() == old.GetUID() && live.GetResourceVersion() == old.GetResourceVersion() {
		return true
	}
	log.FromContext(ctx).Info("a review names a version the API server does not store (another sender than the API server, or a write that raced it): nothing kept of it",
		"name", logged(old.GetName()), "uid", logged(string(old.GetUID())), "resourceVersion", logged(old.GetResourceVersion()), "error", err)
	return false
}

// logged is a string a review's sender chose, as the log shows it: escaped
// and cut.
func logged(s string) string { return engine.Clip(termsafe.EscapeLine(s), "", 256) }

func (a *ActRecorder) decides(signer string) bool { return slices.Contains(a.Signers, signer) }

// addedVerdictReadingAsIchors is the Approved or Denied condition the write
// adds whose message reads as an approver's, or nil. The API server keeps
// at most one condition of each type, so the first of each is the one
// looked at: a forged review of 200,000 conditions against as many old ones
// was compared pair by pair, minutes of CPU a review, before it was known
// whether the API server stores that version (review 240 F1).
func addedVerdictReadingAsIchors(csr, old *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	for _, verdict := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied} {
		i := slices.IndexFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool { return c.Type == verdict })
		if i < 0 {
			continue
		}
		c := &csr.Status.Conditions[i]
		j := slices.IndexFunc(old.Status.Conditions, func(o certificatesv1.CertificateSigningRequestCondition) bool { return o.Type == verdict })
		if (j < 0 || old.Status.Conditions[j].Message != c.Message) && manualact.ReadsAsIchors(c.Message) {
			return c
		}
	}
	return nil
}
