package manager

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// TestReaderOptionsNoReaderCouldUseAreRefusedAtStart: a freshness bound that a
// watch could not keep (not longer than one read's timeout), a negative
// timeout or a lifetime above the reader's maximum is a flag error the
// manager refuses before it serves, rather than one every cluster's reader
// logs later.
func TestReaderOptionsNoReaderCouldUseAreRefusedAtStart(t *testing.T) {
	const lifetime = 10 * time.Minute
	for name, tc := range map[string]struct {
		o        Options
		lifetime time.Duration
		err      string
	}{
		"max age below the timeout":      {o: Options{TalosWatch: true, TalosWatchMaxAge: time.Second, TalosTimeout: 5 * time.Second}, err: "is not longer than the read timeout 5s"},
		"max age equal to the timeout":   {o: Options{TalosWatch: true, TalosWatchMaxAge: 10 * time.Second, TalosTimeout: 10 * time.Second}, err: "is not longer than the read timeout 10s"},
		"default max age, long timeout":  {o: Options{TalosWatch: true, TalosTimeout: 3 * time.Minute}, err: "is not longer than the read timeout 3m0s"},
		"credential too short to watch":  {o: Options{TalosWatch: true, TalosTimeout: 5 * time.Second}, lifetime: 20 * time.Second, err: "is not longer than the read timeout 5s"},
		"negative max age":               {o: Options{TalosWatchMaxAge: -time.Second}, err: "--talos-watch-max-age -1s is negative"},
		"negative max":                   {o: Options{TalosWatchMax: -1}, err: "--talos-watch-max -1 is negative"},
		"negative timeout":               {o: Options{TalosTimeout: -time.Second}, err: "--talos-timeout -1s is negative"},
		"lifetime above the maximum":     {lifetime: 16 * time.Minute, err: "the Talos reader lifetime 16m0s exceeds the reader's maximum of 15m0s"},
		"the defaults":                   {o: Options{TalosWatch: true}},
		"a bound above the timeout":      {o: Options{TalosWatch: true, TalosWatchMaxAge: 11 * time.Second, TalosTimeout: 10 * time.Second}},
		"a bad bound with the watch off": {o: Options{TalosWatchMaxAge: time.Second, TalosTimeout: 5 * time.Second}},
	} {
		t.Run(name, func(t *testing.T) {
			l := tc.lifetime
			if l == 0 {
				l = lifetime
			}
			err := checkTalosReader(tc.o, l)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
			require.True(t, usage.Is(err), "a flag error: %v", err)
		})
	}
}

// The manager's own Talos identity follows the bundle in service: each
// revision activated decides its lifetime again, once (OPA says every
// unchanged poll as an activation), and one that refuses the identity is
// said once, under the revision that decided, and changes nothing (review
// 197B F3: the lifetime was decided at start only, so a bundle that lowered
// the cap took effect at the next restart). An error that is no decision is
// not said as a refusal, and the revision is asked again (review 200 F5).
func TestTheReaderLifetimeFollowsTheBundleInService(t *testing.T) {
	var (
		answer  = 10 * time.Minute
		err     error
		decided int
		set     []time.Duration
		refused []string
	)
	follow := followReaderLifetime(func() (time.Duration, string, error) {
		decided++
		return answer, "decided-" + strconv.Itoa(decided), err
	}, func(d time.Duration) { set = append(set, d) }, func(revision string, err error) {
		refused = append(refused, revision+": "+err.Error())
	})

	follow("a")
	follow("a")
	answer = 5 * time.Minute
	follow("b")
	follow("b")
	err = errors.New("evaluate: context canceled")
	follow("c")
	err = usage.Errorf("the policy refuses the manager's Talos identity")
	follow("c")
	follow("c")
	require.Equal(t, 4, decided, "each revision decided once, and again after an error that is no decision")
	require.Equal(t, []time.Duration{10 * time.Minute, 5 * time.Minute}, set, "a refusal sets nothing")
	require.Equal(t, []string{"decided-4: the policy refuses the manager's Talos identity"}, refused)
}

// The decision asked at each activation checks the lifetime the bundle
// gives against the reader's flags, as the start does: a lifetime no watch
// could keep with the read timeout is refused, under the revision that
// decided it, as a flag error (review 201 F9: this check had no test).
func TestTheLifetimeOfEachActivationIsCheckedAgainstTheReadersFlags(t *testing.T) {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	lifetime, revision, err := decideReaderLifetime(ctx, e, Options{TalosWatch: true})()
	require.NoError(t, err)
	require.Positive(t, lifetime)
	require.Equal(t, e.Revision(), revision)

	// A read timeout as long as any lifetime the bundle gives: no watch
	// could keep its freshness bound.
	_, revision, err = decideReaderLifetime(ctx, e, Options{TalosWatch: true, TalosTimeout: time.Hour})()
	require.ErrorContains(t, err, "is not longer than the read timeout 1h0m0s")
	require.True(t, usage.Is(err), "a flag error, said as a refusal: %v", err)
	require.Equal(t, e.Revision(), revision)
}
