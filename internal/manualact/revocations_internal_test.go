package manualact

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ichor-dev/ichor-policy/engine"
)

// adasBinding is Ada's admin binding, as the issuer names it.
func adasBinding() *rbacv1.ClusterRoleBinding {
	b := adminBinding("ichor-admin:u:ada:0123456789", "cluster-admin", "ada")
	b.UID = "uid-ada"
	return b
}

// erringRule is a bundle whose record rule errs: it counts how often it
// was asked.
type erringRule struct{ asked atomic.Int32 }

func (e *erringRule) RecordManual(context.Context, engine.ManualActInput) (engine.ManualRecord, error) {
	e.asked.Add(1)
	return engine.ManualRecord{}, errors.New("decision does not have the documented shape")
}

// TestARevocationTheRuleErrsOnIsNotAskedAgain (review 245, F2): the input
// does not change, and a rule that errs after its entry was logged would
// log one at every try, every five minutes for as long as the manager
// runs.
func TestARevocationTheRuleErrsOnIsNotAskedAgain(t *testing.T) {
	rule := &erringRule{}
	r := &Revocations{Recorder: &Recorder{Engine: rule}}
	r.Revoked(t.Context(), adasBinding())
	assert.Equal(t, int32(1), rule.asked.Load())
	assert.Empty(t, r.pending, "nothing left to try")
	assert.Zero(t, r.workQueue().Len(), "nothing queued")
	assert.Zero(t, r.workQueue().NumRequeues("uid-ada"))
}

// unreadableKey is a records' key that cannot be read: every try fails,
// and is to be tried again.
type unreadableKey struct{}

func (unreadableKey) Key(context.Context) ([]byte, error) {
	return nil, errors.New("injected: the Secret cannot be read")
}

// TestARevocationFailingAsTheManagerStopsIsSaidUnrecorded (review 245, F4):
// a try that fails once the worker has stopped (the webhook's, which
// outlives its review) is queued to no one, so the log says it is lost.
func TestARevocationFailingAsTheManagerStopsIsSaidUnrecorded(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	ctx := log.IntoContext(t.Context(), logger)

	r := &Revocations{Recorder: &Recorder{Engine: &erringRule{}, Keys: unreadableKey{}}}
	stop, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- r.Start(stop) }()
	cancel()
	require.NoError(t, <-done)

	r.Revoked(logr.NewContext(ctx, logger), adasBinding())
	assert.Empty(t, r.pending, "nothing left to try")
	mu.Lock()
	defer mu.Unlock()
	said := strings.Join(lines, "\n")
	assert.Contains(t, said, "the manager stops before it could record an admin binding's revocation")
	assert.Contains(t, said, `"identity"="ichor-admin:u:ada"`)
	assert.Contains(t, said, "injected: the Secret cannot be read")
}
