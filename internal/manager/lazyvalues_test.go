package manager

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// fixedTime keeps two loggers' lines comparable.
func fixedTime(_ time.Time, enc zapcore.PrimitiveArrayEncoder) { enc.AppendString("T") }

// logScript logs what the controllers log, from the same lines of code
// whichever logger it is given, so that the callers zap names match.
func logScript(log logr.Logger, malformed bool) {
	cluster := log.WithValues("taloscluster", types.NamespacedName{Namespace: "ns", Name: "c"}, "requester", "system:node:a")
	request := cluster.WithName("kubeletserving").WithValues("csr", "csr-1")
	request.Info("approved kubelet serving certificate", "node", "a", "codes", []string{"Approved"})
	request.V(1).Info("a detail")
	request.WithValues("decision_id", "d-1").Error(errors.New("conflict"), "not written", "attempt", 2)
	log.Info("no values")
	log.WithName("a").WithName("b").Info("names")
	if malformed {
		request.WithValues("dangling").Info("after a dangling key", "k", "v")
		request.WithValues(3, "x", "k", "v").Info("after a key that is no string", "k2", "v2")
	}
}

// TestLazyValuesWriteWhatZapWrites: the manager's logger, whose values wait
// for a line, writes byte for byte what zap's own With writes, callers and
// stack traces of development mode included.
func TestLazyValuesWriteWhatZapWrites(t *testing.T) {
	for _, tc := range []struct {
		name      string
		flags     *zap.Options
		malformed bool
	}{
		{"as shipped", &zap.Options{TimeEncoder: fixedTime}, true},
		{"debug", func() *zap.Options {
			o := flagOptions(t, "-zap-log-level=debug")
			o.TimeEncoder = fixedTime
			return o
		}(), true},
		// Development mode panics on a malformed call, whichever logger.
		{"development: callers and stacks", func() *zap.Options {
			o := flagOptions(t, "-zap-devel=true")
			o.TimeEncoder = fixedTime
			return o
		}(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lazy, eager bytes.Buffer
			o := *tc.flags
			o.DestWriter = &eager
			// One call site for both, which development mode's stack
			// traces name.
			for _, log := range []logr.Logger{newLogger(&lazy, tc.flags), zap.New(zap.UseFlagOptions(&o))} {
				logScript(log, tc.malformed)
			}
			require.NotEmpty(t, eager.String())
			assert.Equal(t, eager.String(), lazy.String())
		})
	}
}

// marshalCount counts how often the sink asked for the value's form.
type marshalCount struct{ n *int }

func (m marshalCount) MarshalLog() any { *m.n++; return "v" }

// TestLazyValuesAreReadOnlyForALineWritten: a logger's values cost nothing
// until a line is written with them (zap encodes them when given), and are
// read for each line.
func TestLazyValuesAreReadOnlyForALineWritten(t *testing.T) {
	var buf bytes.Buffer
	var n int
	log := newLogger(&buf, nil).WithValues("value", marshalCount{&n})
	log.V(1).Info("not written at info")
	assert.Zero(t, n, "read for a line not written")
	log.Info("written")
	log.Info("written again")
	assert.Equal(t, 2, n)
	assert.Contains(t, buf.String(), `"value":"v"`)
}

// BenchmarkDecisionLoggers is what a decision's loggers cost, as the
// kubelet-serving approver makes them, with the line the sampler drops.
func BenchmarkDecisionLoggers(b *testing.B) {
	for _, bc := range []struct {
		name string
		log  logr.Logger
	}{
		{"lazy", newLogger(&bytes.Buffer{}, nil)},
		{"zap", zap.New(zap.UseFlagOptions(&zap.Options{DestWriter: &bytes.Buffer{}}))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				requester := bc.log.WithValues("taloscluster", "ns/c", "requester", "system:node:a")
				request := requester.WithValues("csr", "csr-1")
				verdict := request.WithValues("node", "a", "action", "approve", "codes", []string{"Approved"}, "decision_id", "d-1", "revision", "sha256:0")
				verdict.V(1).Info("written")
			}
		})
	}
}
