package manualact

import (
	"context"
	"errors"
	"fmt"
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

// erringRule is a bundle whose record rule errs with err: it counts how
// often it was asked.
type erringRule struct {
	err   error
	asked atomic.Int32
}

func (e *erringRule) RecordManual(context.Context, engine.ManualActInput) (engine.ManualRecord, error) {
	e.asked.Add(1)
	return engine.ManualRecord{}, e.err
}

// TestARevocationTheRuleCannotRecordIsNotAskedAgain (review 245, F2): the
// input does not change, and a record the rule makes without its shape, or
// whose entry the mask fails on, was logged before it was refused: tried
// again, it would be logged every five minutes for as long as the manager
// runs. A sink that failed (a full disk) is tried again (review 248).
func TestARevocationTheRuleCannotRecordIsNotAskedAgain(t *testing.T) {
	for name, tc := range map[string]struct {
		err   error
		again bool
	}{
		"without its documented shape":  {err: fmt.Errorf("decision d of ichor/manual/record %w (kind \"\")", engine.ErrRecordShape)},
		"the mask failing on its entry": {err: fmt.Errorf("decision d of ichor/manual/record: %w", engine.ErrEntryNotLogged)},
		"a decision log's sink failing": {err: errors.New("decision-log file: no space left on device"), again: true},
	} {
		t.Run(name, func(t *testing.T) {
			rule := &erringRule{err: tc.err}
			r := &Revocations{Recorder: &Recorder{Engine: rule}}
			r.Revoked(t.Context(), adasBinding())
			assert.Equal(t, int32(1), rule.asked.Load())
			if tc.again {
				assert.Len(t, r.pending, 1, "not left to try again")
				assert.Equal(t, 1, r.workQueue().NumRequeues("uid-ada"), "not queued again")
				return
			}
			assert.Empty(t, r.pending, "left to try again")
			assert.Zero(t, r.workQueue().Len(), "queued again")
			assert.Zero(t, r.workQueue().NumRequeues("uid-ada"))
		})
	}
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
