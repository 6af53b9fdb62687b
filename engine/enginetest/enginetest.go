// Package enginetest is a policy engine for the actors' tests. It answers as
// the real engine it wraps does, except for the inputs a test picks, for
// which it answers what the test says: an error, no decision, or a decision
// the real engine would refuse to pass on. The tests of the approvers, the
// webhook and the issuer use it to show what each does when the bundle
// answers something odd, against the real API server.
package enginetest

import (
	"context"
	"errors"
	"sync"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
)

// ErrPass is what an override returns to let the real engine decide.
var ErrPass = errors.New("enginetest: let the real engine decide")

// Engine is the real engine with per-decision overrides.
type Engine struct {
	*engine.Engine

	KubeletServingFunc          func(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error)
	KubeletServingRejectionFunc func(context.Context, csrinput.KubeletServing) (engine.CSRDecision, error)
	KubeletClientFunc           func(context.Context, csrinput.KubeletClient) (engine.CSRDecision, error)
	AdmissionFunc               func(context.Context, engine.CredentialAdmissionInput) (engine.CredentialAdmission, error)
	IssuanceFunc                func(context.Context, engine.CredentialIssuanceInput) (engine.CredentialIssuance, error)
	KubeletServingAuditFunc     func(context.Context, servingcert.Audit) (engine.AuditDecision, error)
	// RevisionFunc, when set, says which bundle is active instead of the
	// real engine: a test changes it to show what another bundle's
	// activation does, with the rules of the one it runs.
	RevisionFunc func() string
}

// Revision is the active bundle's revision.
func (e *Engine) Revision() string {
	if e.RevisionFunc != nil {
		return e.RevisionFunc()
	}
	return e.Engine.Revision()
}

// KubeletServing decides a kubelet-serving CSR.
func (e *Engine) KubeletServing(ctx context.Context, in csrinput.KubeletServing) (engine.CSRDecision, error) {
	if e.KubeletServingFunc != nil {
		if d, err := e.KubeletServingFunc(ctx, in); !errors.Is(err, ErrPass) {
			return d, err
		}
	}
	return e.Engine.KubeletServing(ctx, in)
}

// KubeletServingRejection is the kubelet-serving rejection, asked before the
// node is read.
func (e *Engine) KubeletServingRejection(ctx context.Context, in csrinput.KubeletServing) (engine.CSRDecision, error) {
	if e.KubeletServingRejectionFunc != nil {
		if d, err := e.KubeletServingRejectionFunc(ctx, in); !errors.Is(err, ErrPass) {
			return d, err
		}
	}
	return e.Engine.KubeletServingRejection(ctx, in)
}

// KubeletClient decides a kubelet client CSR.
func (e *Engine) KubeletClient(ctx context.Context, in csrinput.KubeletClient) (engine.CSRDecision, error) {
	if e.KubeletClientFunc != nil {
		if d, err := e.KubeletClientFunc(ctx, in); !errors.Is(err, ErrPass) {
			return d, err
		}
	}
	return e.Engine.KubeletClient(ctx, in)
}

// Admission decides a TalosCredentialRequest at admission.
func (e *Engine) Admission(ctx context.Context, in engine.CredentialAdmissionInput) (engine.CredentialAdmission, error) {
	if e.AdmissionFunc != nil {
		if d, err := e.AdmissionFunc(ctx, in); !errors.Is(err, ErrPass) {
			return d, err
		}
	}
	return e.Engine.Admission(ctx, in)
}

// Issuance decides whether a credential may be signed.
func (e *Engine) Issuance(ctx context.Context, in engine.CredentialIssuanceInput) (engine.CredentialIssuance, error) {
	if e.IssuanceFunc != nil {
		if d, err := e.IssuanceFunc(ctx, in); !errors.Is(err, ErrPass) {
			return d, err
		}
	}
	return e.Engine.Issuance(ctx, in)
}

// KubeletServingAudit judges a kubelet serving certificate in service.
func (e *Engine) KubeletServingAudit(ctx context.Context, in servingcert.Audit) (engine.AuditDecision, error) {
	if e.KubeletServingAuditFunc != nil {
		if d, err := e.KubeletServingAuditFunc(ctx, in); !errors.Is(err, ErrPass) {
			return d, err
		}
	}
	return e.Engine.KubeletServingAudit(ctx, in)
}

// Answers are the odd answers of type D for the keys a test picks (a node
// name, a request name), with how often each key was asked. Safe for
// concurrent use: the actors decide from their own goroutines.
type Answers[D any] struct {
	mu      sync.Mutex
	answers map[string]func() (D, error)
	asked   map[string]int
}

// Set makes answer the answer for key; nil lets the real engine decide again.
func (a *Answers[D]) Set(key string, answer func() (D, error)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.answers == nil {
		a.answers, a.asked = map[string]func() (D, error){}, map[string]int{}
	}
	if answer == nil {
		delete(a.answers, key)
		return
	}
	a.answers[key] = answer
}

// Answer is key's answer, counted; ErrPass when the test set none.
func (a *Answers[D]) Answer(key string) (D, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	answer, ok := a.answers[key]
	if !ok {
		var zero D
		return zero, ErrPass
	}
	a.asked[key]++
	return answer()
}

// Asked is how often key was answered with its odd answer.
func (a *Answers[D]) Asked(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked[key]
}

// AllowedAdmission is a person's (alice's) talosconfig-reader request for
// key, as the webhook gathers it once the requirements' grant is allowed:
// an admission the shipped rules allow, for the benchmarks and the tests
// that time or probe one.
func AllowedAdmission(key engine.PublicKeyFacts, grant engine.CredentialAuthorization) engine.CredentialAdmissionInput {
	return engine.CredentialAdmissionInput{
		Operation: "CREATE",
		User:      engine.CredentialUser{Username: "alice", UID: "1000", Groups: []string{"ops", "system:authenticated"}},
		Request: engine.CredentialRequestFacts{
			Name: "alice-1", Namespace: "demo", Cluster: "demo", Purpose: "talosconfig-reader", PublicKey: key,
		},
		Authorization: &engine.AuthorizationFacts{
			User: "alice", UID: "1000", Groups: []string{"ops", "system:authenticated"},
			Verb: grant.Verb, Group: grant.Group, Resource: grant.Resource, Subresource: grant.Subresource,
			Namespace: "demo", Name: "demo", Allowed: true,
		},
		Requester: &engine.CredentialUser{Username: "alice", UID: "1000", Groups: []string{"system:authenticated", "ops"}},
		Cluster:   engine.ClusterFacts{Exists: true},
	}
}
