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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName: name, ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		}
	}
	policy := func(name string) *admissionregistrationv1.ValidatingAdmissionPolicy {
		return &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	var failing, forbidden bool
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).
		WithObjects(binding("ichor-policy-verdicts"), policy("ichor-policy-verdicts"), policy("ichor-policy-admin-bindings")).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if failing {
				return errors.New("connection refused")
			}
			if _, ok := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy); ok && forbidden {
				return apierrors.NewForbidden(schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies"}, key.Name, errors.New("RBAC: access denied"))
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
	assert.Contains(t, err.Error(), "could not be read yet: connection refused")

	// A ClusterRole without the rule on the policies (RBAC applied apart
	// from the chart) is named, not left as "not read yet" (review 259 F5).
	failing, forbidden = false, true
	err = check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "could not be read yet")
	assert.Contains(t, err.Error(), "the manager needs get on validatingadmissionpolicies")

	forbidden = false
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

	// A binding that does not deny, that binds another policy, or whose
	// policy is gone holds nothing: the API server ignores a binding of a
	// policy that does not exist (review 258 F5).
	failing = false
	require.NoError(t, c.Get(t.Context(), client.ObjectKeyFromObject(held), held))
	held.Finalizers = nil
	require.NoError(t, c.Update(t.Context(), held), "the finalizer let go: the binding is gone")
	for name, tc := range map[string]struct {
		edit func(*admissionregistrationv1.ValidatingAdmissionPolicyBinding)
		want string
	}{
		"warns only": {func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			b.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn, admissionregistrationv1.Audit}
		}, "ValidatingAdmissionPolicyBinding ichor-policy-admin-bindings does not deny (validationActions [Warn Audit])"},
		"binds another policy": {func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			b.Spec.PolicyName = "ichor-policy-verdicts"
		}, `ValidatingAdmissionPolicyBinding ichor-policy-admin-bindings binds policy "ichor-policy-verdicts", not its own`},
	} {
		b := binding("ichor-policy-admin-bindings")
		tc.edit(b)
		require.NoError(t, c.Create(t.Context(), b), name)
		err = check()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.want, name)
		require.NoError(t, c.Delete(t.Context(), b), name)
	}
	require.NoError(t, c.Create(t.Context(), binding("ichor-policy-admin-bindings")))
	require.NoError(t, check())
	require.NoError(t, c.Delete(t.Context(), policy("ichor-policy-admin-bindings")))
	err = check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy ichor-policy-admin-bindings missing")
	assert.NotContains(t, err.Error(), "Binding")

	// A probe reads nothing: it answers from the last read.
	failing = true
	err = probe()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy ichor-policy-admin-bindings missing")

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
