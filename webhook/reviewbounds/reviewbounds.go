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
package reviewbounds

import (
	"context"
	"fmt"
	"net/http"
	"time"

	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Limits are the bounds of every review.
type Limits struct {
	// MaxBody is the most bytes of a review's body.
	MaxBody int64
	// InFlight is the most reviews answered at once; Waiting the most
	// waiting for one of them, each until its own deadline. Past both, a
	// review is answered 429.
	InFlight, Waiting int
	// Deadline bounds a review, from its headers to its answer.
	Deadline time.Duration
}

// Defaults are the bounds the manager serves with.
var Defaults = Limits{MaxBody: 4 << 20, InFlight: 16, Waiting: 256, Deadline: 30 * time.Second}

// Server is srv with every handler registered on it held to l.
func Server(srv crwebhook.Server, l Limits) crwebhook.Server {
	return &server{Server: srv, limits: l, slots: make(chan struct{}, l.InFlight), queue: make(chan struct{}, l.InFlight+l.Waiting)}
}

type server struct {
	crwebhook.Server
	limits Limits
	// slots are the reviews being answered; queue those answered or
	// waiting for a slot.
	slots, queue chan struct{}
}

func (s *server) Register(path string, hook http.Handler) {
	s.Server.Register(path, s.bound(hook))
}

// Unwrap is the server this one registers on: webhookcerts reads the
// certificate directory from it.
func (s *server) Unwrap() crwebhook.Server { return s.Server }

func (s *server) bound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.limits.Deadline)
		defer cancel()
		// Deadlines on the connection too: a body sent a byte at a time
		// is cut, whatever the handler is waiting on. A server that
		// cannot set them (none here) still has the context's.
		rc := http.NewResponseController(w)
		deadline, _ := ctx.Deadline()
		_ = rc.SetReadDeadline(deadline)
		_ = rc.SetWriteDeadline(deadline.Add(time.Second))

		select {
		case s.queue <- struct{}{}:
			defer func() { <-s.queue }()
		default:
			http.Error(w, fmt.Sprintf("more than %d reviews are being answered or waiting", s.limits.InFlight+s.limits.Waiting), http.StatusTooManyRequests)
			return
		}
		select {
		case s.slots <- struct{}{}:
			defer func() { <-s.slots }()
		case <-ctx.Done():
			http.Error(w, "no review could be answered before the deadline", http.StatusServiceUnavailable)
			return
		}
		if r.ContentLength > s.limits.MaxBody {
			http.Error(w, fmt.Sprintf("a review's body is at most %d bytes", s.limits.MaxBody), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.limits.MaxBody)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
