package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicybindings,verbs=get
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies,verbs=get

// policyBindingsEvery is how often the bindings are read again: a read of
// the API server per binding, off the probes' path (the kubelet gives a
// probe a second; a slow API server must not make a replica unready).
const policyBindingsEvery = 10 * time.Second

// policyBindings is the readiness check of the ValidatingAdmissionPolicy
// bindings that hold the manager's own rights to their shape (the chart's:
// its ClusterRoleBindings, its status writes, its webhook configuration,
// its verdicts, the bundle's epoch; --admission-policy-bindings). Helm
// applies those policies after the manager's rights and Deployment, and an
// install or upgrade that fails on them alone left the manager issuing
// without them, unnoticed (review 256 F1). Each binding is named as the
// policy it binds (the chart's are), and holds only while it exists, binds
// that policy, denies (validationActions Deny: Warn or Audit alone refuses
// nothing), and the policy exists (a binding of a policy that does not is
// ignored by the API server); review 258 F5. Until each holds the manager
// is not ready: its webhook is out of its Service, so no new
// credential request is admitted (one admitted before is still answered,
// and the approvers still decide: readiness is the webhook's alone). The
// bindings are read by Start, on every replica, and the check answers from
// the last read; a read that fails keeps the last answer (none yet: not
// ready), so the API server's hiccup does not take every replica out.
type policyBindings struct {
	reader client.Reader
	names  []string
	log    logr.Logger

	mu      sync.Mutex
	known   bool
	missing []string
	// readErr is why the last read failed, said while nothing is known.
	readErr error
}

// Check is the readiness check: the last read's answer.
func (p *policyBindings) Check(*http.Request) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.known && p.readErr != nil:
		return fmt.Errorf("the admission policies that hold the manager's rights could not be read yet: %w", p.readErr)
	case !p.known:
		return errors.New("the admission policies that hold the manager's rights could not be read yet")
	case len(p.missing) > 0:
		return fmt.Errorf("%s: the manager's rights are not held to their shape, so its webhook admits no credential request (install or upgrade the chart again)", strings.Join(p.missing, "; "))
	}
	return nil
}

// Start reads the bindings until ctx ends.
func (p *policyBindings) Start(ctx context.Context) error {
	t := time.NewTicker(policyBindingsEvery)
	defer t.Stop()
	for {
		p.look(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection is false: every replica serves the webhook.
func (p *policyBindings) NeedLeaderElection() bool { return false }

func (p *policyBindings) look(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, policyBindingsEvery)
	defer cancel()
	var missing []string
	for _, name := range p.names {
		why, err := p.lookAt(ctx, name)
		if err != nil {
			if apierrors.IsForbidden(err) {
				// Not a hiccup: the manager's ClusterRole lacks the rule
				// (RBAC applied apart from the chart, or an older one).
				err = fmt.Errorf("%w (the manager needs get on validatingadmissionpolicies and validatingadmissionpolicybindings in admissionregistration.k8s.io, for these names: the chart's ClusterRole has it)", err)
			}
			p.log.Info("could not read an admission policy or its binding; the last answer stands", "binding", name, "error", err.Error())
			p.mu.Lock()
			p.readErr = err
			p.mu.Unlock()
			return
		}
		if why != "" {
			missing = append(missing, why)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(missing) > 0 && (!p.known || strings.Join(missing, ",") != strings.Join(p.missing, ",")) {
		p.log.Info("not ready: admission policies do not hold", "policies", missing)
	}
	p.known, p.missing = true, missing
}

// lookAt says why the binding name and its policy do not hold, or "" when
// they do; an error is a read that failed.
func (p *policyBindings) lookAt(ctx context.Context, name string) (string, error) {
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	switch ok, err := p.present(ctx, name, &b); {
	case err != nil:
		return "", err
	case !ok:
		return fmt.Sprintf("ValidatingAdmissionPolicyBinding %s missing", name), nil
	case b.Spec.PolicyName != name:
		return fmt.Sprintf("ValidatingAdmissionPolicyBinding %s binds policy %q, not its own", name, b.Spec.PolicyName), nil
	case !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny):
		return fmt.Sprintf("ValidatingAdmissionPolicyBinding %s does not deny (validationActions %v)", name, b.Spec.ValidationActions), nil
	}
	switch ok, err := p.present(ctx, name, &admissionregistrationv1.ValidatingAdmissionPolicy{}); {
	case err != nil:
		return "", err
	case !ok:
		return fmt.Sprintf("ValidatingAdmissionPolicy %s missing", name), nil
	}
	return "", nil
}

// present reads obj by name: false when it is absent or being deleted.
func (p *policyBindings) present(ctx context.Context, name string, obj client.Object) (bool, error) {
	switch err := p.reader.Get(ctx, client.ObjectKey{Name: name}, obj); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return obj.GetDeletionTimestamp() == nil, nil
}
