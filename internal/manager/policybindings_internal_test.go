package manager

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// The manager is ready only while every admission policy binding that holds
// its rights exists (review 256 F1: Helm applies them last, and an install
// that failed on them left it issuing without them); a read that fails keeps
// the last answer, none at first. A pure unit test: the check's logic over
// a fake client.
func TestTheManagerIsNotReadyWithoutItsAdmissionPolicyBindings(t *testing.T) {
	binding := func(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	var failing bool
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(binding("ichor-policy-verdicts")).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if failing {
				return errors.New("connection refused")
			}
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	p := &policyBindings{reader: c, names: []string{"ichor-policy-verdicts", "ichor-policy-admin-bindings"}, log: logr.Discard()}
	probe := func() error { return p.Check(httptest.NewRequest("GET", "/readyz", nil)) }
	check := func() error {
		p.look(t.Context())
		return probe()
	}

	failing = true
	err := check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "could not be read yet")

	failing = false
	err = check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicyBinding ichor-policy-admin-bindings missing")
	assert.NotContains(t, err.Error(), "verdicts")

	require.NoError(t, c.Create(t.Context(), binding("ichor-policy-admin-bindings")))
	require.NoError(t, check())
	failing = true
	assert.NoError(t, check(), "a read that fails keeps the last answer")

	// One being deleted is as good as gone.
	failing = false
	held := binding("ichor-policy-admin-bindings")
	require.NoError(t, c.Get(t.Context(), client.ObjectKeyFromObject(held), held))
	held.Finalizers = []string{"example.com/hold"}
	require.NoError(t, c.Update(t.Context(), held))
	require.NoError(t, c.Delete(t.Context(), held))
	err = check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ichor-policy-admin-bindings missing")

	// A probe reads nothing: it answers from the last read.
	failing = true
	err = probe()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ichor-policy-admin-bindings missing")

	// Start reads at once, and until its context ends.
	failing = false
	started := &policyBindings{reader: c, names: []string{"ichor-policy-verdicts"}, log: logr.Discard()}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- started.Start(ctx) }()
	require.Eventually(t, func() bool { return started.Check(httptest.NewRequest("GET", "/readyz", nil)) == nil }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	assert.False(t, started.NeedLeaderElection(), "every replica serves the webhook")
}
