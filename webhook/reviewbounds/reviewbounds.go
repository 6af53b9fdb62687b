// Package reviewbounds bounds what a webhook's port costs whoever reaches it.
//
// The webhook's port answers anyone who can connect to it, not only the API
// server (webhook.clientAuth and the chart's NetworkPolicy, both optional,
// narrow that). controller-runtime's server reads each review whole, up to 7
// MiB, and decodes it twice; it sets no read or write deadline beyond the
// headers', and nothing bounds how many reviews run at once: a pod sending
// eighty 7 MiB bodies at once, or a byte a second, took the manager past
// its memory limit on every replica (review 240 F2). Every handler
// registered through Server is held to a body, a deadline and a number of
// reviews at once, each far above what the API server sends: an
// AdmissionReview holds the object and its old version, each at most the
// 1.5 MiB etcd stores, and the API server waits at most 30 s for an answer.
//
// What it bounds is the manager's memory and CPU, not the port's
// availability: a sender other than the API server can still hold every
// slot, five seconds at a time, and have the API server's reviews refused
// (and counted, ichor_webhook_reviews_refused_total). Only the API server's
// client certificate (webhook.clientAuth) or a NetworkPolicy keeps the port
// the API server's (review 243 F1).
package reviewbounds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Limits are the bounds of every review.
type Limits struct {
	// MaxBody is the most bytes of a review's body.
	MaxBody int64
	// InFlight is the most reviews read and answered at once; Waiting the
	// most waiting for one of them, each until its own deadline. Past
	// both, a review is answered 429.
	InFlight, Waiting int
	// BodyDeadline bounds the read of a review's body, once it has a
	// slot: the API server sends it whole at once, and a sender that
	// trickles it holds a slot no longer (review 243 F1).
	BodyDeadline time.Duration
	// Deadline bounds a review, from its headers to its answer.
	Deadline time.Duration
	// Refused counts the reviews refused, by reason; nil counts none.
	Refused *prometheus.CounterVec
}

// Defaults are the bounds the manager serves with.
// Eight at once: a review takes milliseconds, and each holds its body
// twice (read here, read again by controller-runtime) and decoded, up to
// 16 MiB at the bound (review 244 F4).
var Defaults = Limits{MaxBody: 4 << 20, InFlight: 8, Waiting: 256, BodyDeadline: 5 * time.Second, Deadline: 30 * time.Second}

// Reasons a review is refused, the label of Limits.Refused.
const (
	ReasonBusy     = "busy"
	ReasonNoSlot   = "no_slot_in_time"
	ReasonTooLarge = "too_large"
	ReasonUnread   = "body_unread"
)

// NewRefused is the counter of refused reviews, registered in reg.
func NewRefused(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ichor_webhook_reviews_refused_total",
		Help: "Reviews on the webhook's port refused before any handler read them, by reason: busy (more than the reviews answered and waiting at once: 429), no_slot_in_time (none free before the review's deadline: 503), too_large (a body past the bound: 413), body_unread (a body not sent whole within its deadline: 400). The API server takes each for the webhook's failure; many mean a sender other than the API server reaches the port (webhook.clientAuth, networkPolicy).",
	}, []string{"reason"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	// Each at 0 from the start, so that an alert on its increase sees
	// the first refusals too.
	for _, reason := range []string{ReasonBusy, ReasonNoSlot, ReasonTooLarge, ReasonUnread} {
		c.WithLabelValues(reason)
	}
	return c, nil
}

// Server is srv with every handler registered on it held to l.
func Server(srv crwebhook.Server, l Limits) crwebhook.Server {
	return &server{Server: srv, limits: l, slots: make(chan struct{}, l.InFlight), queue: make(chan struct{}, l.InFlight+l.Waiting)}
}

type server struct {
	crwebhook.Server
	limits Limits
	// slots are the reviews being read and answered; queue those and the
	// ones waiting for a slot.
	slots, queue chan struct{}
}

func (s *server) Register(path string, hook http.Handler) {
	s.Server.Register(path, s.bound(hook))
}

// Unwrap is the server this one registers on: webhookcerts reads the
// certificate directory from it.
func (s *server) Unwrap() crwebhook.Server { return s.Server }

func (s *server) refuse(w http.ResponseWriter, reason string, code int, message string) {
	if s.limits.Refused != nil {
		s.limits.Refused.WithLabelValues(reason).Inc()
	}
	http.Error(w, message, code)
}

func (s *server) bound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.limits.Deadline)
		defer cancel()
		deadline, _ := ctx.Deadline()
		rc := http.NewResponseController(w)
		// A server that cannot set deadlines (none here) still has the
		// context's.
		_ = rc.SetWriteDeadline(deadline.Add(time.Second))

		select {
		case s.queue <- struct{}{}:
			defer func() { <-s.queue }()
		default:
			s.refuse(w, ReasonBusy, http.StatusTooManyRequests, fmt.Sprintf("more than %d reviews are being answered or waiting", s.limits.InFlight+s.limits.Waiting))
			return
		}
		select {
		case s.slots <- struct{}{}:
			defer func() { <-s.slots }()
		case <-ctx.Done():
			s.refuse(w, ReasonNoSlot, http.StatusServiceUnavailable, "no review could be answered before the deadline")
			return
		}
		tooLarge := func() {
			s.refuse(w, ReasonTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("a review's body is at most %d bytes", s.limits.MaxBody))
		}
		if r.ContentLength > s.limits.MaxBody {
			tooLarge()
			return
		}
		// The body is read here, within its own deadline, so that a
		// sender trickling it holds its slot no longer than that. The
		// connection stays on the review's deadline; the body's is a
		// timer that pulls it in, so that the read net/http starts once
		// the body ends (to see a client go) never runs on the shorter
		// one and cancels a review being answered (review 244 F3).
		_ = rc.SetReadDeadline(deadline)
		cut := time.AfterFunc(s.limits.BodyDeadline, func() { _ = rc.SetReadDeadline(time.Now()) })
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.limits.MaxBody))
		cutInTime := cut.Stop()
		var cutAtMax *http.MaxBytesError
		switch {
		case errors.As(err, &cutAtMax):
			tooLarge()
			return
		case err != nil, !cutInTime:
			// Past the body's deadline the connection reads no more,
			// whatever was read: the review is refused.
			s.refuse(w, ReasonUnread, http.StatusBadRequest, fmt.Sprintf("the review's body was not read whole within %s", s.limits.BodyDeadline))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
