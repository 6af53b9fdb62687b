package manualact

import (
	"context"
	"errors"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ichor-dev/ichor-policy/engine"
)

// decisionKey names one decision by hand to record: the request's UID and
// the verdict it holds. The watch's queue is keyed by it, so that one act is
// one item of the queue however often the watch sees it.
type decisionKey struct {
	UID     types.UID
	Verdict string
}

// pendingDecision is a decision the queue has yet to record: the request as
// the watch saw it decided and the version the write replaced (old; nil for
// a request found decided as the watch started), and how far its record
// got. Once the rule's record is logged it is kept here, so that a try again
// writes only what is missing (the mark, the Event) and never logs one act
// twice.
type pendingDecision struct {
	old, csr *certificatesv1.CertificateSigningRequest
	rec      *engine.ManualRecord
	marked   bool
	evented  bool
}

// recordDecision does what is left of p's record: look for its mark, read
// the attempts kept from the version the write replaced, ask the rule for
// the record (which the engine logs), mark it recorded, write its Event.
// The mark and the Event are written independently (review 5, F1): a mark
// that fails does not hold back the Event, which is also a mark until
// --event-ttl; each one written is not written again. The mark is tried
// first, so that an Event seen means its mark was tried.
// requests are the requests still in the API server (the watch's cache),
// whose marks are kept.
// An error leaves p as far as it got, for the queue to try again.
func (r *Recorder) recordDecision(ctx context.Context, p *pendingDecision, requests client.Reader) error {
	regarding := CSRReference(p.csr)
	if regarding.UID == "" {
		return reconcile.TerminalError(errors.New("the request has no UID to record the act under"))
	}
	in := CSRDecision(p.csr, p.old, nil)
	if p.old == nil {
		// Nothing tells which version the write replaced, so no attempt
		// is read: the rule names nobody.
		in.SeenBy = engine.SeenByWatchStart
	}
	act := AddedVerdict(in.CertificateRequest)
	var key []byte
	if r.Keys != nil {
		var err error
		if key, err = r.Keys.Key(ctx); err != nil {
			return fmt.Errorf("the records' key: %w", err)
		}
	}
	if p.rec == nil {
		if key != nil {
			done, err := r.alreadyRecorded(ctx, key, regarding, act, requests)
			if err != nil || done {
				return err
			}
			if p.old != nil {
				if in.Attempts, in.AttemptsIncomplete, err = r.attempts(ctx, key, p.old.UID, p.old.ResourceVersion); err != nil {
					return err
				}
			}
		}
		rec, err := r.evaluate(ctx, &in)
		if err != nil || rec == nil {
			return err
		}
		p.rec = rec
		Log(ctx, "csr", p.csr.Name)(rec, nil)
	}
	var markErr, eventErr error
	if !p.marked && key != nil {
		markErr = r.mark(ctx, key, regarding, act, p.rec.DecisionID, requests)
	}
	p.marked = p.marked || markErr == nil
	if !p.evented {
		if eventErr = r.event(ctx, key, regarding, act, *p.rec); eventErr != nil {
			eventErr = fmt.Errorf("the record's Event: %w", eventErr)
		}
		p.evented = eventErr == nil
	}
	return errors.Join(markErr, eventErr)
}

// alreadyRecorded reports whether the act has a verified mark; or a
// verified record Event, as a manager before the marks made (which expires
// with --event-ttl, so the act is marked now, to last as long as the
// request).
func (r *Recorder) alreadyRecorded(ctx context.Context, key []byte, regarding corev1.ObjectReference, act string, requests client.Reader) (bool, error) {
	id, err := r.marked(ctx, key, regarding.UID, act)
	if err != nil || id != "" {
		return id != "", err
	}
	if id, err = r.recorded(ctx, key, regarding.UID, act); err != nil || id == "" {
		return false, err
	}
	if err := r.mark(ctx, key, regarding, act, id, requests); err != nil {
		return false, err
	}
	return true, nil
}
