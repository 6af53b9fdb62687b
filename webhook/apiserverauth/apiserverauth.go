// Package apiserverauth keeps the webhook's answers to the API server. The
// webhook's port answers whoever reaches it, and a review says who made a
// write only in the sender's words: the act recorder would keep a forged
// review of a stored binding as anyone's revocation, the credential webhook
// would write an admission record for a request no API server sent. The API
// server proves itself to a webhook only when its admission configuration
// gives it a client certificate for it (AdmissionConfiguration's
// kubeConfigFile); with the CA of that certificate and the names it may carry,
// the webhook answers only requests made with it.
//
// The TLS handshake asks for a certificate and verifies one given (a client
// without one still connects, as the manager's readiness probe does, which
// sends nothing); every request is then refused, before its handler reads it,
// unless its connection's certificate verified against the CA and names one
// of the allowed common names. The names keep out other clients a CA signs
// for (a kubelet's certificate, if the operator gave the cluster's client
// CA); they cannot keep out one who may have that CA sign any name (the
// cluster's kube-apiserver-client signer), which is why the docs ask for a
// CA of the API server's webhook client alone.
package apiserverauth

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/internal/smallfile"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// maxCAFile bounds the CA file read at start: a bundle of a few CAs is a few
// KiB, and the file is whatever the mounted ConfigMap holds.
const maxCAFile = 1 << 20

// maxNameLog is as much of a refused request's path or certificate's common
// name as the log quotes.
const maxNameLog = 256

// noticeEvery is how often the log says that requests are being refused,
// however many are: a sender who posts without end must not fill the log.
const noticeEvery = time.Minute

// Refusal reasons, the label of ichor_webhook_requests_refused_total.
const (
	ReasonNoCertificate  = "no_certificate"
	ReasonNameNotAllowed = "name_not_allowed"
)

// refusals say what a refused request lacked, to the sender (who knows
// whether it sent a certificate) and in the API server's log.
var refusals = map[string]string{
	ReasonNoCertificate:  "the request came without a client certificate of the webhook's client CA",
	ReasonNameNotAllowed: "the client certificate's common name is not one of the API server's",
}

// Auth holds the CA and the names the API server's client certificate is
// checked against.
type Auth struct {
	// Log says, at most once per noticeEvery, that requests were refused
	// (logr.Discard() from Load).
	Log logr.Logger

	pool    *x509.CertPool
	names   []string
	refused *prometheus.CounterVec

	mu         sync.Mutex
	lastNotice time.Time
	unnoticed  int
	now        func() time.Time
}

// Load reads the PEM file of CAs that sign the API server's client
// certificate and takes the common names that certificate may carry. It
// refuses a file that is unreadable, larger than 1 MiB, holds no certificate
// or a PEM block that is not a CA certificate (a key pasted by mistake
// included; text between blocks, as bundles carry, is skipped), and names
// that are none, empty or padded with spaces (a "a, b" list): without a
// name, any certificate the CA signs would be taken for the API server's.
// A pin, not empty, is the hex SHA-256 the file must have.
func Load(caFile string, names []string, pin string) (*Auth, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("webhook client CA %s: no client names: name the common name of the API server's webhook client certificate, or any certificate its CA signs is taken for the API server's", caFile)
	}
	for _, n := range names {
		if n == "" || strings.TrimSpace(n) != n {
			return nil, fmt.Errorf("webhook client CA %s: client name %q is empty or has spaces around it", caFile, termsafe.Escape(truncate(n)))
		}
	}
	pool, err := readPool(caFile, pin)
	if err != nil {
		return nil, err
	}
	return &Auth{
		Log:   logr.Discard(),
		pool:  pool,
		names: slices.Clone(names),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ichor_webhook_requests_refused_total",
			Help: "Requests the webhook refused because they were not the API server's: reason=no_certificate (no client certificate of the webhook's client CA: a pod posting to the webhook, or an API server not configured to authenticate to it), reason=name_not_allowed (a certificate of that CA with another common name). Counted only with --webhook-client-ca.",
		}, []string{"reason"}),
		now: time.Now,
	}, nil
}

// Register adds the refusals' counter to reg.
func (a *Auth) Register(reg prometheus.Registerer) error {
	if err := reg.Register(a.refused); err != nil {
		return fmt.Errorf("register the webhook client metrics: %w", err)
	}
	return nil
}

func readPool(caFile, pin string) (*x509.CertPool, error) {
	// Not waiting on a FIFO, nor reading a device without end (review 168).
	data, err := smallfile.Read(caFile, maxCAFile)
	if err != nil {
		return nil, fmt.Errorf("webhook client CA: %w", err)
	}
	// The file's writers (a ConfigMap's) are not the Deployment's, which
	// pins its digest (review 166).
	if got := fmt.Sprintf("%x", sha256.Sum256(data)); pin != "" && got != strings.ToLower(pin) {
		return nil, fmt.Errorf("webhook client CA %s has SHA-256 %s, not the pinned %s: the CA was replaced", caFile, got, strings.ToLower(pin))
	}
	pool := x509.NewCertPool()
	count := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("webhook client CA %s: block %d is a %q, not a CERTIFICATE", caFile, count+1, termsafe.Escape(block.Type))
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("webhook client CA %s: certificate %d: %w", caFile, count+1, err)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("webhook client CA %s: certificate %d (%s) is not a CA", caFile, count+1, termsafe.Escape(cert.Subject.String()))
		}
		pool.AddCert(cert)
		count++
	}
	if count == 0 {
		return nil, fmt.Errorf("webhook client CA %s: no certificate", caFile)
	}
	return pool, nil
}

// TLS sets the server's TLS configuration to ask for a client certificate and
// verify one given against the CA (a webhook server's TLSOpts). A connection
// without one is let through the handshake, and its requests refused
// (Require).
func (a *Auth) TLS(cfg *tls.Config) {
	cfg.ClientCAs = a.pool
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
}

// Require refuses, with 403 and before next reads anything, a request whose
// connection has no certificate verified against the CA or whose certificate
// names none of the allowed common names.
func (a *Auth) Require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if reason, name := a.check(r); reason != "" {
			a.refuse(r, reason, name)
			http.Error(w, "this webhook answers only the API server: "+refusals[reason], http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *Auth) check(r *http.Request) (reason, name string) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return ReasonNoCertificate, ""
	}
	name = r.TLS.VerifiedChains[0][0].Subject.CommonName
	if !slices.Contains(a.names, name) {
		return ReasonNameNotAllowed, name
	}
	return "", ""
}

// refuse counts the refusal and logs it, at most once per noticeEvery with
// how many went unlogged before it.
func (a *Auth) refuse(r *http.Request, reason, name string) {
	a.refused.WithLabelValues(reason).Inc()
	a.mu.Lock()
	now := a.now()
	if !a.lastNotice.IsZero() && now.Sub(a.lastNotice) < noticeEvery {
		a.unnoticed++
		a.mu.Unlock()
		return
	}
	a.lastNotice = now
	unnoticed := a.unnoticed
	a.unnoticed = 0
	a.mu.Unlock()
	a.Log.Info("refused a webhook request that is not the API server's",
		"reason", reason, "remote", r.RemoteAddr, "path", termsafe.Escape(truncate(r.URL.Path)),
		"commonName", termsafe.Escape(truncate(name)), "refusedUnlogged", unnoticed, "allowed", a.names)
}

func truncate(s string) string {
	if len(s) > maxNameLog {
		return s[:maxNameLog]
	}
	return s
}

// Server is srv with every handler registered on it behind Require, so that
// no path of the webhook's is left open by a registration that forgets it.
// A handler added to its WebhookMux() directly is not: register through
// Register, as every webhook of the manager does.
func (a *Auth) Server(srv crwebhook.Server) crwebhook.Server {
	return &server{Server: srv, auth: a}
}

type server struct {
	crwebhook.Server
	auth *Auth
}

func (s *server) Register(path string, hook http.Handler) {
	s.Server.Register(path, s.auth.Require(hook))
}

// Unwrap is the server this one registers on: webhookcerts reads the
// certificate directory from it.
func (s *server) Unwrap() crwebhook.Server { return s.Server }
