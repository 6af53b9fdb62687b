package engine

import (
	"context"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The epoch in service never goes down (review 180): a start's read of the
// store after an activation's would otherwise have let check accept, and the
// refresh write back, an epoch below the bundle in service.
func TestTheActiveEpochNeverGoesDown(t *testing.T) {
	g := &epochGuard{enforce: true}
	g.setActive(5)
	g.setActive(3)
	active, _ := g.toRestore(0, g.raisedCount())
	assert.Equal(t, int64(5), active)
}

// The refresh restores nothing from a read made before an activation's
// recording that ended since, nor during one (review 180): that recording
// raised the record itself, and the refresh's read was only older.
func TestARecordReadBeforeAnActivationsRaiseIsNotRestored(t *testing.T) {
	g := &epochGuard{enforce: true}
	g.setActive(4)
	before := g.raisedCount()
	done := g.raising()
	active, deferred := g.toRestore(0, before)
	assert.Zero(t, active, "restored during the activation's own raise")
	assert.True(t, deferred, "a read during a raise said the record is as read (review 188)")
	done()
	active, deferred = g.toRestore(0, before)
	assert.Zero(t, active, "restored from a read older than the activation's raise")
	assert.True(t, deferred, "a read before a raise said the record is as read (review 188)")
	active, deferred = g.toRestore(0, g.raisedCount())
	assert.Equal(t, int64(4), active, "a record read after it, and low, is restored")
	assert.False(t, deferred)
	active, deferred = g.toRestore(4, g.raisedCount())
	assert.Zero(t, active, "a record at the epoch in service is left")
	assert.False(t, deferred, "a record at the epoch in service was deferred")
	active, deferred = (&epochGuard{}).toRestore(0, 0)
	assert.Zero(t, active, "an unsigned source vouches for no epoch")
	assert.False(t, deferred)
}

// A poll's read says the record is fine only if no activation's raise began
// since the read: a raise that failed, and said so, is not followed by the
// older read's word (review 190).
func TestARecordReadBeforeARaiseDoesNotClearTheFailingGauge(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	e := &Engine{guard: &epochGuard{enforce: true}, metrics: m}
	before := e.guard.raisedCount()
	done := e.guard.raising()
	m.epochRecord(true) // the activation's raise failed
	e.recordFine(before)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.EpochRecordFailing()), "cleared during the raise")
	done()
	e.recordFine(before)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.EpochRecordFailing()), "cleared by a read older than the raise")
	e.recordFine(e.guard.raisedCount())
	assert.Zero(t, testutil.ToFloat64(m.EpochRecordFailing()), "a read after the raise, and fine, does not clear it")
}

// A write that puts modules in service is committed only with its compiled
// bundle checked: one that wrote modules and carries no compiled bundle to
// check (OPA's activations put it on the transaction's context; a way in
// that did not would pass unchecked) is refused and aborted, nothing of it
// kept and the store free for the next write; one whose compiled bundle
// reaches a refused builtin likewise. A write of no module with no compiler
// (OPA's deactivation of a bundle, whose failure OPA answers with a panic)
// commits. Nothing is kept of a transaction once it ends, committed or
// aborted.
func TestACommitIsRefusedUnlessItsCompiledBundleIsChecked(t *testing.T) {
	ctx := context.Background()
	s := &guardedStore{Store: inmem.New(), guard: &epochGuard{}}
	const module = "package ichor.probe\n\nx := 1\n"
	// within runs a write with a deadline: a refused commit that did not
	// abort holds the store's write lock, and the next write waits forever.
	within := func(write func() error) error {
		done := make(chan error, 1)
		go func() { done <- write() }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("the write did not end within 10s: an earlier transaction still holds the store")
			return nil
		}
	}
	write := func(compiled *ast.Compiler, modules ...string) error {
		return within(func() error {
			params := storage.WriteParams
			params.Context = storage.NewContext()
			if compiled != nil {
				plugins.SetCompilerOnContext(params.Context, compiled)
			}
			return storage.Txn(ctx, s, params, func(txn storage.Transaction) error {
				for _, m := range modules {
					if err := s.UpsertPolicy(ctx, txn, "probe.rego", []byte(m)); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	compile := func(src string) *ast.Compiler {
		c := ast.NewCompiler()
		c.Compile(map[string]*ast.Module{"probe.rego": ast.MustParseModule(src)})
		require.False(t, c.Failed(), "%v", c.Errors)
		return c
	}
	policies := func() []string {
		txn, err := s.NewTransaction(ctx)
		require.NoError(t, err)
		defer s.Abort(ctx, txn)
		ids, err := s.ListPolicies(ctx, txn)
		require.NoError(t, err)
		return ids
	}

	err := write(nil, module)
	require.ErrorIs(t, err, ErrBundleBuiltins)
	assert.ErrorContains(t, err, "modules were written with no compiled bundle to check")
	assert.Empty(t, policies(), "the refused write's module is not kept")

	err = write(compile("package ichor.probe\n\nx := opa.runtime()\n"), module)
	require.ErrorIs(t, err, ErrBundleBuiltins)
	assert.ErrorContains(t, err, "the compiled bundle calls opa.runtime")
	assert.Empty(t, policies(), "the refused write's module is not kept")

	// A module refused as it is written: OPA aborts the transaction.
	require.ErrorIs(t, write(nil, "package ichor.probe\n\nx := time.now_ns()\n"), ErrBundleBuiltins)

	require.NoError(t, write(nil), "a write of no module, with no compiler")
	require.NoError(t, write(compile(module), module))
	assert.Equal(t, []string{"probe.rego"}, policies())

	open := 0
	s.activations.Range(func(any, any) bool { open++; return true })
	assert.Zero(t, open, "the transactions ended are forgotten")
}
