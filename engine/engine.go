// Package engine evaluates the policy bundle in-process with OPA's SDK and
// writes every decision, approve and deny alike, to OPA's decision log.
//
// It adds nothing to what the SDK does beyond choosing the configuration: the
// SDK loads and activates the bundle, prepares each query once and caches it
// until the bundle changes, is safe for concurrent use, and hands every
// decision (id, path, input, result, bundle revision, timestamp) to its
// decision-log plugin, which applies the mask in policy/system/log.
package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/sdk"
	"github.com/sirupsen/logrus"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// BundleName is the name the policy bundle is activated under; decision-log
// entries carry its revision under bundles.<BundleName>.revision.
const BundleName = "ichor"

// ErrNoDecision is returned when the rule at a path is undefined for an
// input: the rule does not govern it (another signer, say).
var ErrNoDecision = errors.New("no decision: the rule does not apply to this input")

// Options configures an Engine.
type Options struct {
	// Bundle is a bundle tarball to serve; nil serves the embedded default.
	Bundle *bundle.Bundle
	// DecisionLog receives the decision log as JSON lines; nil means stdout.
	DecisionLog io.Writer
	// Log receives OPA's own logs (bundle activation, errors) as JSON lines;
	// nil means stderr.
	Log io.Writer
	// LogLevel is the level of OPA's own logs; the zero value is Error.
	LogLevel logging.Level
	// ID names this instance in decision-log entries (labels.id).
	ID string
}

// Engine evaluates decisions against one active bundle.
type Engine struct {
	opa    *sdk.OPA
	tmpDir string
}

// New loads the bundle and returns when it is active.
func New(ctx context.Context, opts Options) (*Engine, error) {
	b := opts.Bundle
	if b == nil {
		var err error
		if b, err = bundles.Default(); err != nil {
			return nil, err
		}
	}
	// The SDK activates bundles through its bundle plugin, which reads a file
	// resource; the bundle is written to a private temporary directory that
	// Stop removes.
	tmpDir, err := os.MkdirTemp("", "ichor-bundle-")
	if err != nil {
		return nil, fmt.Errorf("bundle directory: %w", err)
	}
	path := filepath.Join(tmpDir, "bundle.tar.gz")
	f, err := os.Create(path)
	if err != nil {
		_ = os.RemoveAll(tmpDir)
		return nil, fmt.Errorf("write bundle: %w", err)
	}
	werr := bundles.Write(f, b)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.RemoveAll(tmpDir)
		return nil, werr
	}

	config, err := json.Marshal(map[string]any{
		"labels":  map[string]string{"app": "ichor-policy"},
		"bundles": map[string]any{BundleName: map[string]any{"resource": "file://" + path}},
		// Console is OPA's JSON-lines sink; the mask rule is OPA's default path
		// (system/log/mask), which the bundle provides.
		"decision_logs": map[string]any{"console": true},
	})
	if err != nil {
		_ = os.RemoveAll(tmpDir)
		return nil, fmt.Errorf("engine configuration: %w", err)
	}

	opa, err := sdk.New(ctx, sdk.Options{
		ID:            opts.ID,
		Config:        bytes.NewReader(config),
		Logger:        jsonLogger(orDefault(opts.Log, os.Stderr), opts.LogLevel),
		ConsoleLogger: jsonLogger(orDefault(opts.DecisionLog, os.Stdout), logging.Info),
	})
	if err != nil {
		_ = os.RemoveAll(tmpDir)
		return nil, fmt.Errorf("start the policy engine with bundle revision %s: %w", b.Manifest.Revision, err)
	}
	return &Engine{opa: opa, tmpDir: tmpDir}, nil
}

// Stop stops the SDK's plugins and removes the bundle file.
func (e *Engine) Stop(ctx context.Context) {
	e.opa.Stop(ctx)
	_ = os.RemoveAll(e.tmpDir)
}

// Decision is the raw outcome of one evaluation.
type Decision struct {
	ID       string
	Path     string
	Revision string
	// Result is the rule's value, in its JSON form.
	Result json.RawMessage
}

// Decide evaluates the rule at path (slash-separated, such as
// "ichor/kubelet_serving/decision") for input and logs the decision. It
// returns ErrNoDecision when the rule is undefined for the input; that is
// logged too.
func (e *Engine) Decide(ctx context.Context, path string, input any) (Decision, error) {
	res, err := e.opa.Decision(ctx, sdk.DecisionOptions{Path: path, Input: input})
	if err != nil {
		if sdk.IsUndefinedErr(err) {
			return Decision{Path: path}, fmt.Errorf("%s: %w", path, ErrNoDecision)
		}
		return Decision{Path: path}, fmt.Errorf("evaluate %s: %w", path, err)
	}
	raw, err := json.Marshal(res.Result)
	if err != nil {
		return Decision{}, fmt.Errorf("encode result of %s: %w", path, err)
	}
	d := Decision{ID: res.ID, Path: path, Result: raw}
	if info, ok := res.Provenance.Bundles[BundleName]; ok {
		d.Revision = info.Revision
	}
	return d, nil
}

func jsonLogger(w io.Writer, level logging.Level) *logging.StandardLogger {
	l := logging.New()
	l.SetOutput(w)
	l.SetFormatter(&logrus.JSONFormatter{})
	l.SetLevel(level)
	return l
}

func orDefault(w, def io.Writer) io.Writer {
	if w == nil {
		return def
	}
	return w
}
