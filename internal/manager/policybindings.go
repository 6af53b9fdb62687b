package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicybindings,verbs=get

// policyBindingsEvery is how long a look at the bindings answers the
// readiness probes: the kubelet probes every few seconds, and each look is a
// read of the API server per binding.
const policyBindingsEvery = 10 * time.Second

// policyBindings is the readiness check of the ValidatingAdmissionPolicy
// bindings that hold the manager's own rights to their shape (the chart's:
// its ClusterRoleBindings, its status writes, its webhook configuration,
// its verdicts, the bundle's epoch; --admission-policy-bindings). Helm
// applies those policies after the manager's rights and Deployment, and an
// install or upgrade that fails on them alone left the manager issuing
// without them, unnoticed (review 256 F1). Until each binding exists the
// manager is not ready: its webhook is out of its Service, so no credential
// request is admitted, and nothing is issued. A read that fails keeps the
// last answer (none yet: not ready): the API server's hiccup does not take
// every replica out.
type policyBindings struct {
	reader client.Reader
	names  []string
	log    logr.Logger

	mu      sync.Mutex
	looked  time.Time
	known   bool
	missing []string
}

// Check is the readiness check.
func (p *policyBindings) Check(req *http.Request) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.looked) >= policyBindingsEvery {
		p.look(req.Context())
	}
	switch {
	case !p.known:
		return errors.New("the admission policy bindings that hold the manager's rights could not be read yet")
	case len(p.missing) > 0:
		return fmt.Errorf("ValidatingAdmissionPolicyBinding %s missing: the manager's rights are not held to their shape, so it admits and issues nothing (install or upgrade the chart again)", strings.Join(p.missing, ", "))
	}
	return nil
}

func (p *policyBindings) look(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var missing []string
	for _, name := range p.names {
		var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
		err := p.reader.Get(ctx, client.ObjectKey{Name: name}, &b)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && b.DeletionTimestamp != nil):
			missing = append(missing, name)
		case err != nil:
			p.log.Info("could not read an admission policy binding; the last answer stands", "binding", name, "error", err.Error())
			return
		}
	}
	if len(missing) > 0 && (!p.known || strings.Join(missing, ",") != strings.Join(p.missing, ",")) {
		p.log.Info("not ready: admission policy bindings missing", "bindings", missing)
	}
	p.looked, p.known, p.missing = time.Now(), true, missing
}
