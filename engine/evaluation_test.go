package engine_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// slowProbe is a module whose rule slow iterates the product of two long
// lists (minutes of evaluation), and whose rule quick decides at once.
const slowProbe = `package ichor.probe

slow if {
	some i in numbers.range(1, 100000)
	some j in numbers.range(1, 100000)
	i * j == -1
}

quick := true
`

// A rule that takes long (a mistake in a signed bundle: the product of two
// long lists iterated) is stopped at the bound on one evaluation, and the
// decision fails saying so, where every worker that asked it waited for as
// long as it ran (review 246, F4); a rule within the bound decides, and the
// engine goes on deciding after one was stopped.
func TestAnEvaluationIsStoppedAtItsBound(t *testing.T) {
	const bound = 300 * time.Millisecond
	b := policyWithProbe(t, slowProbe)
	e, err := engine.New(context.Background(), engine.Options{Bundle: b, DecisionLog: io.Discard, Log: io.Discard, EvaluationTimeout: bound})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	_, err = e.Decide(context.Background(), "ichor/probe/slow", map[string]any{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "evaluate ichor/probe/slow: not decided within the bound on one evaluation, and stopped (300ms)")
	assert.ErrorIs(t, err, engine.ErrEvaluationTimeout)
	// A caller takes a context's error for its own deadline or a server's
	// (a tenant's stall breaker counts those): the bound wraps none.
	assert.NotErrorIs(t, err, context.DeadlineExceeded)

	d, err := e.Decide(context.Background(), "ichor/probe/quick", map[string]any{})
	require.NoError(t, err)
	assert.JSONEq(t, "true", string(d.Result))

	// A caller's own cancellation is said as before, not as the bound.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.Decide(ctx, "ichor/probe/slow", map[string]any{})
	require.Error(t, err)
	assert.NotErrorIs(t, err, engine.ErrEvaluationTimeout)
}

// The shadow bundle is not asked when the active decision failed: there is
// nothing to compare, and its evaluation would add its own bound to an
// active one stopped at its bound (review 252 F3). It is asked otherwise.
func TestTheShadowIsNotAskedAfterTheActiveDecisionFailed(t *testing.T) {
	var shadowLog harness.DecisionLog
	shadow, err := engine.New(context.Background(), engine.Options{Bundle: policyWithProbe(t, "package ichor.probe\n\nslow := true\n\nquick := true\n"), DecisionLog: &shadowLog, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { shadow.Stop(context.Background()) })
	active := policyWithProbe(t, slowProbe)
	e, err := engine.New(context.Background(), engine.Options{Bundle: active, DecisionLog: io.Discard, Log: io.Discard, EvaluationTimeout: 200 * time.Millisecond, Shadow: shadow})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	_, err = e.Decide(context.Background(), "ichor/probe/slow", map[string]any{})
	require.ErrorIs(t, err, engine.ErrEvaluationTimeout)
	_, err = e.Decide(context.Background(), "ichor/probe/quick", map[string]any{})
	require.NoError(t, err)

	logged := shadowLog.String()
	assert.Equal(t, 1, strings.Count(logged, `"path":"ichor/probe/quick"`), "the shadow was not asked after a decision that succeeded: %s", logged)
	assert.NotContains(t, logged, `"path":"ichor/probe/slow"`, "the shadow was asked after the active decision failed")
}
