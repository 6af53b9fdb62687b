// Package engine evaluates the policy bundle in-process with OPA's SDK and
// writes every decision, approve and deny alike, to OPA's decision log.
//
// It adds little to what the SDK does beyond choosing the configuration: the
// SDK's bundle plugin loads, verifies (OPA's bundle signatures) and activates
// the bundle, keeps the last good one when a new one is refused, prepares each
// query once and caches it until the bundle changes, is safe for concurrent
// use, and hands every decision (id, path, input, result, bundle revision,
// timestamp) to its decision-log plugin, which applies the mask in
// policy/system/log and writes to the configured sinks.
package engine

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/open-policy-agent/opa/v1/sdk"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/sirupsen/logrus"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/heldtemp"
	"github.com/ichor-dev/ichor-policy/internal/opavalue"
	"github.com/ichor-dev/ichor-policy/internal/privatefile"
	"github.com/ichor-dev/ichor-policy/internal/version"
)

// BundleName is the name the policy bundle is activated under; decision-log
// entries carry its revision under bundles.<BundleName>.revision.
const BundleName = "ichor"

// DefaultDecisionLogBufferEvents bounds the upload buffer while the
// decision-log service is away: about 10 minutes of a busy manager, a few
// tens of megabytes once the mask has cut what a hostile request brings,
// and 64 MiB at most whatever the entries.
const DefaultDecisionLogBufferEvents = 10000

// MaxBundleFileBytes bounds each file of a bundle fetched over the network
// (a URL or a registry); the policy's largest is tens of kilobytes. `ichor
// bundle push` refuses what would exceed it.
const MaxBundleFileBytes = bundles.MaxFileBytes

// DefaultPollInterval is how often a bundle source is looked at again.
const DefaultPollInterval = 30 * time.Second

// ErrNoDecision is returned when the rule at a path is undefined for an
// input: the rule does not govern it (another signer, say).
var ErrNoDecision = errors.New("no decision: the rule does not apply to this input")

// ErrEntryNotLogged is a decision whose decision-log entry reached no sink:
// the bundle's mask (system/log/mask) failed on it, which OPA's logs plugin
// answers with an error line and nothing to the decision's caller. The
// decision is not acted on, as one whose entry the file cannot take is not:
// before, it was, with no entry, and only a count said so (review 152 L2).
var ErrEntryNotLogged = errors.New("its decision-log entry reached no sink: the bundle's mask failed on it; not acted on")

// Options configures an Engine.
type Options struct {
	// Bundle is a bundle to serve, fixed for the engine's life; nil (with no
	// Source) serves the embedded default.
	Bundle *bundle.Bundle
	// Source is where to load the bundle from instead, and reload it while
	// running: a bundle tarball path, or an http(s) URL polled by OPA.
	Source string
	// PollInterval is how often Source is looked at; DefaultPollInterval if 0.
	PollInterval time.Duration
	// VerificationKeys, when set, make a signature by one of them required:
	// an unsigned bundle or one signed by another key is refused.
	VerificationKeys []VerificationKey
	// AllowInsecureHTTP lets Source be a plain http:// URL. Without it such a
	// source is refused, signed or not: whoever sits on the path can replay
	// an old signed bundle (with a rule since fixed) or withhold new ones.
	AllowInsecureHTTP bool
	// RegistryCredentials is a Docker config file holding the credential
	// of an oci:// Source's registry (user name and password or token,
	// under "auths"), read at each pull; empty pulls anonymously.
	RegistryCredentials string
	// StartTimeout bounds the first activation; a source whose bundle is
	// refused at start makes New fail with the reason.
	StartTimeout time.Duration
	// EvaluationTimeout bounds one decision's evaluation;
	// DefaultEvaluationTimeout if 0.
	EvaluationTimeout time.Duration
	// Limits bound what a bundle from Source may cost (compressed, once
	// decompressed, in files) before OPA reads it; zero fields take
	// bundles.DefaultLimits.
	Limits bundles.Limits
	// Epochs, with VerificationKeys, keeps the highest bundle epoch
	// activated in the cluster: it is read at start (a bundle below it is
	// refused, as one below the binary's floor or the active one is),
	// raised after each activation and read again every PollInterval.
	Epochs EpochStore

	// DecisionLog receives the decision log as JSON lines (OPA's console
	// sink); nil means stdout, io.Discard turns the console sink off.
	DecisionLog io.Writer
	// DecisionLogFile appends the decision log, as JSON lines, to a file,
	// rotated at DecisionLogFileMaxMiB (DefaultDecisionLogFileMaxMiB when 0)
	// with DecisionLogFileMaxBackups rotated files kept
	// (DefaultDecisionLogFileMaxBackups when 0).
	DecisionLogFile           string
	DecisionLogFileMaxMiB     int
	DecisionLogFileMaxBackups int
	// DecisionLogURL uploads the decision log to a service speaking OPA's
	// decision-log API (POST {URL}/logs, gzipped JSON arrays).
	DecisionLogURL string
	// DecisionLogTokenFile holds a bearer token for DecisionLogURL, sent as
	// its Authorization header and read from the file at each upload (a
	// rotated Secret is used at the next); never sent over plain http off
	// this host's loopback, and exclusive with a password in the URL.
	DecisionLogTokenFile string
	// DecisionLogAllowInsecureHTTP lets DecisionLogURL be plain http://.
	// Without it such a URL is refused: anyone on the path could read every
	// decision (who asked for which credential, each node's names) and a
	// password in the URL, and drop entries, the audit trail.
	DecisionLogAllowInsecureHTTP bool
	// DecisionLogBufferEvents bounds the upload buffer, in entries;
	// DefaultDecisionLogBufferEvents when 0. When it is full the oldest
	// entries are dropped and counted (cause buffer_full).
	DecisionLogBufferEvents int64

	// Log receives OPA's own logs (bundle activation, errors) as JSON lines;
	// nil means stderr.
	Log io.Writer
	// LogLevel is the level of OPA's own logs; the zero value is Error.
	LogLevel logging.Level
	// ID names this instance in decision-log entries (labels.id).
	ID string

	// Metrics, when set, counts decisions, their latency, bundle loads and
	// shadow disagreements.
	Metrics *Metrics
	// Shadow, when set, is a candidate evaluated beside the active bundle on
	// every decision, never acted on; disagreements are logged and counted.
	Shadow *Engine
	// OnBundleStatus is called after every activation attempt of a Source.
	OnBundleStatus func(BundleStatus)
}

// VerificationKey is a public key bundles may be signed with.
type VerificationKey struct {
	ID string
	// PEM is the public key (or, for HS256, the shared secret).
	PEM string
	// Algorithm is the JWS algorithm, RS256 by default.
	Algorithm string
}

// BundleStatus is the outcome of one activation attempt.
type BundleStatus struct {
	// ActiveRevision is the revision serving decisions after the attempt.
	ActiveRevision string
	// Err is why a new bundle was refused; nil when it was activated.
	Err error
}

// Engine evaluates decisions against the active bundle.
type Engine struct {
	opa    *sdk.OPA
	tmpDir *heldtemp.Dir
	// secretQuery is the query of a URL source, scrubbed from the log and
	// from refusals (sourceQuery).
	secretQuery string
	metrics     *Metrics
	shadow      *Engine
	// log is OPA's own log, at the configured level; notes is the engine's
	// own operator-facing messages (a bundle refused, a shadow disagreement),
	// always written.
	log   *logging.StandardLogger
	notes *logging.StandardLogger
	// console is where the decision log's console sink writes (the
	// engine's, see sinks.go), nil when it is off.
	console io.Writer
	// evaluationTimeout bounds each decision's evaluation.
	evaluationTimeout time.Duration
	// logsEntries is whether the engine's sinks take the decision log
	// (logsEntries): each decision's entry must then reach them.
	logsEntries bool
	mgr         *plugins.Manager
	// guard refuses a signed bundle older than allowed; limits bound a
	// bundle before OPA reads it; epochs records the highest epoch.
	guard  *epochGuard
	limits bundles.Limits
	epochs EpochStore
	// source is the bundle file the engine watches, and private the copy of
	// it, bounded and scanned, that OPA reads; sourceDigest is the digest
	// of the content it was started on, from which the polls look for a
	// change (not a second read, which would take a change made meanwhile
	// as the starting point and never load it).
	source, private, sourceDigest string

	mu       sync.Mutex
	revision string
	lastErr  error

	stopPoll context.CancelFunc
	pollDone chan struct{}
	// stopRefresh stops the periodic read of the recorded epoch.
	stopRefresh context.CancelFunc
	refreshDone chan struct{}
}

// New loads the bundle and returns when it is active.
func New(ctx context.Context, opts Options) (*Engine, error) {
	if u, err := url.Parse(opts.DecisionLogURL); err == nil && u.Scheme == "http" && !opts.DecisionLogAllowInsecureHTTP {
		return nil, fmt.Errorf("decision-log service %s is plain http: anyone on the path could read every decision (and a password in the URL) and drop entries; use https://, or allow it explicitly (--decision-log-allow-insecure-http)", u.Redacted())
	}
	if err := checkDecisionLogCredential(opts); err != nil {
		return nil, err
	}
	for _, k := range opts.VerificationKeys {
		if err := CheckVerificationKey(k); err != nil {
			return nil, err
		}
	}
	logOut := orDefault(opts.Log, os.Stderr)
	// A signed URL keeps its signature in its query, which OPA's errors
	// quote with the URL: never in the log, nor in a refusal's status.
	secretQuery := sourceQuery(opts.Source)
	if secretQuery != "" {
		logOut = newScrubbing(logOut, secretQuery)
	}
	e := &Engine{
		secretQuery: secretQuery,
		metrics:     opts.Metrics, shadow: opts.Shadow, log: jsonLogger(logOut, opts.LogLevel), notes: jsonLogger(logOut, logging.Info),
		guard: &epochGuard{enforce: len(opts.VerificationKeys) > 0, floor: bundles.Floor()}, limits: opts.Limits,
		evaluationTimeout: cmp.Or(opts.EvaluationTimeout, DefaultEvaluationTimeout),
	}
	if e.guard.enforce && opts.Epochs != nil {
		// A manager that cannot learn the highest epoch would reopen the
		// window a newer bundle closed: it does not start.
		highest, err := opts.Epochs.Highest(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the highest bundle epoch recorded in the cluster: %w", err)
		}
		e.guard.setPersisted(highest)
		e.epochs = opts.Epochs
	}
	resource, service, err := e.resource(opts)
	if err != nil {
		e.cleanup()
		return nil, err
	}
	config, err := e.config(opts, resource, service)
	if err != nil {
		e.cleanup()
		return nil, err
	}

	if opts.DecisionLog != io.Discard {
		e.console = orDefault(opts.DecisionLog, os.Stdout)
	}
	e.logsEntries = logsEntries(opts)
	sdkOpts := sdk.Options{
		ID:          opts.ID,
		Config:      bytes.NewReader(config),
		Logger:      opaLogger{Logger: e.log, lost: func() { e.metrics.dropped(sinkMask) }, secret: secretQuery},
		Ready:       make(chan struct{}),
		Plugins:     map[string]plugins.Factory{sinksName: &sinksFactory{engine: e}, limitsPluginName: &limitsFactory{limits: opts.Limits, plainHTTP: opts.AllowInsecureHTTP, registryCredentials: opts.RegistryCredentials}},
		ManagerOpts: []func(*plugins.Manager){func(m *plugins.Manager) { e.mgr = m }},
		// The bundle's data (the tables of data.json) kept as OPA's values,
		// as OPA's own server keeps them: a rule reading a table, and the
		// mask reading its configuration on every entry, do not convert it
		// again on each evaluation. The store is only written by bundle
		// activation.
		Store: &guardedStore{
			Store: inmem.NewWithOpts(inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true)),
			guard: e.guard, manifest: bundle.ManifestStoragePath(BundleName),
		},
	}
	if e.console != nil {
		// The decision log's console is the engine's sink; OPA writes
		// nothing else there, but whatever it would goes to the same place.
		sdkOpts.ConsoleLogger = jsonLogger(e.console, logging.Info)
	}
	opa, err := sdk.New(ctx, sdkOpts)
	if err != nil {
		e.cleanup()
		return nil, fmt.Errorf("start the policy engine: %w", err)
	}
	e.opa = opa
	// A URL source that fails at start is retried by OPA; its status says
	// why, for the start-up error. (A file source was verified above.)
	e.mgr.RegisterPluginStatusListener("ichor-engine", e.pluginStatus)
	if bp := bundleplugin.Lookup(e.mgr); bp != nil {
		bp.Register("ichor-engine", func(s bundleplugin.Status) { e.bundleStatus(s, opts.OnBundleStatus) })
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	select {
	case <-sdkOpts.Ready:
	case <-time.After(timeout):
		e.Stop(context.WithoutCancel(ctx))
		err := fmt.Errorf("the policy bundle from %s was not activated within %s", describeSource(opts), timeout)
		if last := e.LastError(); last != nil {
			err = fmt.Errorf("%w: %w", err, last)
		}
		return nil, err
	case <-ctx.Done():
		e.Stop(context.WithoutCancel(ctx))
		return nil, ctx.Err()
	}
	e.observeRevision(ctx)
	if e.source != "" {
		e.pollFile(opts)
	}
	if e.epochs != nil {
		ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		e.stopRefresh, e.refreshDone = cancel, make(chan struct{})
		go func() {
			defer close(e.refreshDone)
			e.refreshEpochs(ctx, e.epochs, pollInterval(opts))
		}()
	}
	return e, nil
}

func describeSource(opts Options) string {
	if opts.Source != "" {
		return bundles.RedactedSource(opts.Source)
	}
	return "memory"
}

// resource is where the bundle plugin reads the bundle: a file (the
// in-memory bundle written to a private temporary directory, or the source
// path) or a service URL.
func (e *Engine) resource(opts Options) (resource, serviceURL string, err error) {
	switch {
	case opts.Source != "" && opts.Bundle != nil:
		return "", "", errors.New("engine: Bundle and Source are exclusive")
	case opts.RegistryCredentials != "" && !bundles.IsOCI(opts.Source):
		return "", "", fmt.Errorf("registry credentials are for a bundle in a registry (%s...), not %q", bundles.OCIScheme, bundles.RedactedSource(opts.Source))
	case bundles.IsOCI(opts.Source):
		return ociResource(opts)
	case isURL(opts.Source):
		// Whoever can answer for the URL would write the rules that approve
		// certificates: a bundle fetched over the network must be signed.
		if len(opts.VerificationKeys) == 0 {
			return "", "", fmt.Errorf("bundle source %s is a URL: give the key its bundles are signed with (--bundle-key)", bundles.RedactedSource(opts.Source))
		}
		if strings.HasPrefix(opts.Source, "http://") && !opts.AllowInsecureHTTP {
			return "", "", fmt.Errorf("bundle source %s is plain http: anyone on the path could serve an older signed bundle or none; use https://, or allow it explicitly (--bundle-allow-insecure-http)", bundles.RedactedSource(opts.Source))
		}
		u, path, err := splitURL(opts.Source)
		return path, u, err
	case opts.Source != "":
		abs, err := filepath.Abs(opts.Source)
		if err != nil {
			return "", "", fmt.Errorf("bundle source: %w", err)
		}
		// OPA reads a private copy, bounded and scanned, never the file
		// itself: what it reads is what was checked. Read and verify it
		// here too, so that a bad bundle at start fails at once with its
		// reason rather than after the start timeout.
		data, err := e.limits.ReadFile(abs)
		if err != nil {
			return "", "", err
		}
		b, err := bundles.ReadVerified(data, verificationConfig(opts.VerificationKeys))
		if err == nil {
			err = e.guard.check(b.Manifest)
		}
		if err != nil {
			err = fmt.Errorf("bundle %s refused: %w", abs, err)
			if len(err.Error()) > MaxLogText {
				// OPA's errors quote what the bundle holds (a module's
				// line): bounded, as a refusal while running is (review
				// 163).
				err = scrubbedError{error: err, msg: servingcert.Clip(err.Error(), MaxLogText)}
			}
			return "", "", err
		}
		e.source, e.sourceDigest = abs, digest(data, nil)
		if err := e.writePrivate(data); err != nil {
			return "", "", err
		}
		return "file://" + e.private, "", nil
	}
	b := opts.Bundle
	if b == nil {
		if len(opts.VerificationKeys) > 0 {
			return "", "", errors.New("engine: verification keys need a signed bundle source; the embedded bundle is not signed")
		}
		if b, err = bundles.Default(); err != nil {
			return "", "", err
		}
	}
	data, err := bundles.Bytes(b)
	if err != nil {
		return "", "", err
	}
	if err := e.writePrivate(data); err != nil {
		return "", "", err
	}
	return "file://" + e.private, "", nil
}

// privateDir is the engine's private temporary directory, made on first
// use and removed when the engine stops; one a process killed left behind
// is removed as another is made (heldtemp).
func (e *Engine) privateDir() (string, error) {
	if e.tmpDir == nil {
		dir, removed, err := heldtemp.Make("ichor-bundle-")
		if err != nil {
			return "", fmt.Errorf("bundle directory: %w", err)
		}
		if removed > 0 {
			e.notes.Info("Removed %d bundle directories left by processes that were killed.", removed)
		}
		e.tmpDir = dir
		e.private = filepath.Join(dir.Path(), "bundle.tar.gz")
	}
	return e.tmpDir.Path(), nil
}

// writePrivate writes the bundle OPA reads into a private temporary
// directory, replacing the file whole.
func (e *Engine) writePrivate(data []byte) error {
	if _, err := e.privateDir(); err != nil {
		return err
	}
	// OPA reads the file while a new bundle replaces it: it sees the old one
	// or the new one whole, never a part.
	if err := privatefile.Write(e.private, data); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}

// CheckVerificationKey refuses a public key given with an HMAC algorithm
// (HS256, HS384, HS512): OPA then takes the key's text as the shared
// secret, and whoever may read the public key (a ConfigMap, the release's
// files) could sign bundles it accepts (review 246, F3). A shared secret is
// not PEM.
func CheckVerificationKey(k VerificationKey) error {
	if !strings.HasPrefix(strings.ToUpper(k.Algorithm), "HS") {
		return nil
	}
	// Anywhere in the text, not only where pem.Decode looks (the start of
	// a line): an indented block, one after a byte-order mark or a damaged
	// one is a public key all the same.
	if block, _ := pem.Decode([]byte(k.PEM)); block != nil || strings.Contains(k.PEM, "-----BEGIN ") {
		what := "PEM block"
		if block != nil {
			what = "PEM " + block.Type
		}
		return fmt.Errorf("bundle verification key %q is a %s given with the HMAC algorithm %s, which would make its text the shared secret: whoever reads it could sign bundles; give the algorithm it was signed with (RS256, PS256, ES256, ...)", k.ID, what, k.Algorithm)
	}
	return nil
}

// verificationConfig is OPA's verification configuration for the keys; nil
// without keys.
func verificationConfig(keys []VerificationKey) *bundle.VerificationConfig {
	if len(keys) == 0 {
		return nil
	}
	m := map[string]*bundle.KeyConfig{}
	for _, k := range keys {
		alg := k.Algorithm
		if alg == "" {
			alg = "RS256"
		}
		m[k.ID] = &bundle.KeyConfig{Key: k.PEM, Algorithm: alg}
	}
	return bundle.NewVerificationConfig(m, "", "", nil)
}

func pollInterval(opts Options) time.Duration {
	if opts.PollInterval == 0 {
		return DefaultPollInterval
	}
	return opts.PollInterval
}

func (e *Engine) config(opts Options, resource, serviceURL string) ([]byte, error) {
	poll := pollInterval(opts)
	source := map[string]any{"resource": resource}
	services := map[string]any{}
	plugins := map[string]any{}
	persistence := ""
	if serviceURL != "" {
		// OPA's client, with every response bounded and a bundle scanned
		// before OPA reads it (limitsPlugin).
		service := map[string]any{"url": serviceURL, "credentials": map[string]any{"plugin": limitsPluginName}}
		plugins[limitsPluginName] = map[string]any{}
		if bundles.IsOCI(opts.Source) {
			service["type"] = "oci"
			// OPA's OCI store goes under the engine's private directory,
			// where the limits plugin prunes it (ocistore.go) and Stop
			// removes it.
			dir, err := e.privateDir()
			if err != nil {
				return nil, err
			}
			persistence = dir
		}
		services["bundle"] = service
		source["service"] = "bundle"
		// OPA reads each file of a downloaded bundle into memory before it
		// checks the signature, up to 1 GiB by default: a gzip bomb from
		// whoever may write to the source would cost every replica that.
		source["size_limit_bytes"] = MaxBundleFileBytes
		secs := int64(max(poll/time.Second, 1))
		source["polling"] = map[string]any{"min_delay_seconds": secs, "max_delay_seconds": secs}
	} else {
		// A file is read once at start; pollFile triggers a reload when it
		// changes.
		source["trigger"] = "manual"
	}
	config := map[string]any{
		// OPA adds labels.version, its own version, which reads like
		// Ichor's: ichor_version says which binary decided.
		"labels":   map[string]string{"app": "ichor-policy", "ichor_version": version.Get().Version},
		"services": services,
		"bundles":  map[string]any{BundleName: source},
	}
	if persistence != "" {
		config["persistence_directory"] = persistence
	}
	if len(opts.VerificationKeys) > 0 {
		keys := map[string]any{}
		for _, k := range opts.VerificationKeys {
			alg := k.Algorithm
			if alg == "" {
				alg = "RS256"
			}
			keys[k.ID] = map[string]any{"key": k.PEM, "algorithm": alg}
		}
		config["keys"] = keys
		// A signing block makes the signature required, not merely checked
		// when present.
		source["signing"] = map[string]any{}
	}
	// OPA's console sink stays off: the engine's writes the console (sinks.go).
	logs := map[string]any{"console": false}
	if logsEntries(opts) {
		plugins[sinksName] = sinksConfig{
			Console: opts.DecisionLog != io.Discard, File: opts.DecisionLogFile, FileMaxMiB: opts.DecisionLogFileMaxMiB, FileMaxBackups: opts.DecisionLogFileMaxBackups,
			URL: opts.DecisionLogURL, TokenFile: opts.DecisionLogTokenFile, BufferEvents: int(opts.DecisionLogBufferEvents),
		}
		logs["plugin"] = sinksName
	}
	if len(plugins) > 0 {
		config["plugins"] = plugins
	}
	// The mask rule is OPA's default path (system/log/mask), which the
	// bundle provides. The drop rule is a path outside the bundle's roots
	// (bundles.CheckManifest), which no bundle may define: every decision is
	// logged, and a bundle cannot take one out without a trace (review 227
	// F1; OPA's plugin drops an entry its drop rule names with a debug line).
	logs["drop_decision"] = dropDecisionPath
	config["decision_logs"] = logs
	b, err := json.Marshal(config)
	if err != nil {
		return nil, fmt.Errorf("engine configuration: %w", err)
	}
	return b, nil
}

// dropDecisionPath is the decision log's drop rule: one no bundle may
// define, since it is outside every root a bundle may declare (bundles.Roots).
const dropDecisionPath = "/system/ichor/drop"

// pluginStatus keeps the bundle plugin's last error, for the start-up
// failure message.
func (e *Engine) pluginStatus(status map[string]*plugins.Status) {
	s, ok := status[bundleplugin.Name]
	if !ok || s == nil || s.State != plugins.StateErr {
		return
	}
	e.mu.Lock()
	e.lastErr = e.scrub(fmt.Errorf("bundle plugin: %s", s.Message))
	e.mu.Unlock()
}

// scrub takes the source's query (a signed URL's signature) out of an
// error's text, and the query of any URL it names (redactURLs).
func (e *Engine) scrub(err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	scrubbed := text
	if e.secretQuery != "" {
		scrubbed = strings.ReplaceAll(scrubbed, e.secretQuery, "...")
	}
	if scrubbed = redactURLs(scrubbed); scrubbed == text {
		return err
	}
	return scrubbedError{error: err, msg: scrubbed}
}

// urlQuery is a URL's query, as an error or a log line names the URL. A
// registry may answer a blob's request with a redirect to its storage,
// signed in the query (as Docker Hub's and GHCR's do), and Go's HTTP client
// names the URL it failed on, the redirect's, in its error: OPA's log, the
// refusal's Event and the manager's log repeated a signature that was good
// for minutes (review 227 F4). (Go's client leaves a URL's password out of
// its errors itself.)
var urlQuery = regexp.MustCompile(`(?i)(\bhttps?://[^\s"'?#]*)\?[^\s"'#]*`)

// redactURLs is text with each URL's query replaced by "...", as
// bundles.RedactedURL writes one.
func redactURLs(text string) string {
	if !strings.Contains(text, "://") {
		return text
	}
	return urlQuery.ReplaceAllString(text, "${1}?...")
}

// bundleStatus records an activation attempt: the revision, or why the new
// bundle was refused while the last good one keeps serving.
func (e *Engine) bundleStatus(s bundleplugin.Status, notify func(BundleStatus)) {
	var err error
	if len(s.Errors) > 0 || s.Code != "" {
		err = fmt.Errorf("bundle refused (%s): %s%v", s.Code, s.Message, s.Errors)
	} else {
		// The revision first: the epoch's record in the cluster may take
		// seconds, and the approvers remember each verdict with the revision
		// it was reached under (Revision), which must not lag the bundle
		// deciding meanwhile.
		e.setRevision(s.ActiveRevision)
		e.observeEpoch(context.Background())
	}
	e.report(s.ActiveRevision, err, notify)
}

// report records an activation attempt's outcome: the revision in service,
// and why a bundle was refused.
func (e *Engine) report(activeRevision string, err error, notify func(BundleStatus)) {
	err = e.scrub(err)
	if err != nil && len(err.Error()) > MaxLogText {
		// OPA's errors quote what the bundle holds: bounded, as its log
		// lines are (review 162).
		err = scrubbedError{error: err, msg: servingcert.Clip(err.Error(), MaxLogText)}
	}
	e.setRevision(activeRevision)
	e.mu.Lock()
	e.lastErr = err
	rev := e.revision
	e.mu.Unlock()
	if e.metrics != nil {
		e.metrics.bundle(rev, err)
	}
	if err != nil {
		e.notes.WithFields(map[string]any{"active_revision": rev, "error": err.Error()}).Error("Policy bundle refused; the last good bundle keeps serving.")
	}
	if notify != nil {
		notify(BundleStatus{ActiveRevision: rev, Err: err})
	}
}

// setRevision records the revision of the bundle in service; "" (a source
// that failed before any bundle was read) changes nothing.
func (e *Engine) setRevision(revision string) {
	if revision == "" {
		return
	}
	e.mu.Lock()
	e.revision = revision
	e.mu.Unlock()
}

// observeRevision reads the active revision from OPA's store once the first
// bundle is active (its status may have been reported before the listener
// was registered).
func (e *Engine) observeRevision(ctx context.Context) {
	store := e.mgr.Store
	txn, err := store.NewTransaction(ctx)
	if err == nil {
		rev, rerr := bundle.ReadBundleRevisionFromStore(ctx, store, txn, BundleName)
		store.Abort(ctx, txn)
		if rerr == nil {
			e.mu.Lock()
			e.revision = rev
			e.mu.Unlock()
		}
	}
	if e.metrics != nil {
		e.metrics.bundle(e.Revision(), nil)
	}
	e.observeEpoch(ctx)
}

// observeEpoch reads the active bundle's epoch from OPA's store, and
// records it in the cluster when it is the highest yet.
func (e *Engine) observeEpoch(ctx context.Context) {
	if !e.guard.enforce {
		return
	}
	store := e.mgr.Store
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return
	}
	md, err := bundle.ReadBundleMetadataFromStore(ctx, store, txn, BundleName)
	store.Abort(ctx, txn)
	if err != nil {
		return
	}
	epoch, err := bundles.Epoch(bundle.Manifest{Metadata: md})
	if err != nil {
		return
	}
	done := e.guard.raising()
	defer done()
	e.guard.setActive(epoch)
	e.sayIfBehind()
	if e.epochs == nil || epoch <= e.guard.persistedEpoch() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := e.epochs.Raise(ctx, epoch); err != nil {
		// The bundle is in service here and its epoch guards this replica;
		// the refresh tries again at each poll (refreshEpochs).
		e.metrics.epochRecord(true)
		e.notes.WithFields(map[string]any{"epoch": epoch, "error": err.Error()}).Error("Could not record the bundle epoch in the cluster.")
		return
	}
	e.guard.setPersisted(epoch)
	e.metrics.epochRecord(false)
}

// Revision is the revision of the active bundle.
func (e *Engine) Revision() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.revision
}

// LastError is why the last bundle was refused; nil after a success.
func (e *Engine) LastError() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastErr
}

// Stop stops the SDK's plugins and removes the temporary bundle file. With a
// deadline on ctx, the decision-log upload sink first sends what it still
// holds, until the deadline; what it could not send is logged and counted
// (cause shutdown).
func (e *Engine) Stop(ctx context.Context) {
	if e.stopPoll != nil {
		e.stopPoll()
		<-e.pollDone
	}
	if e.stopRefresh != nil {
		e.stopRefresh()
		<-e.refreshDone
	}
	if e.opa != nil {
		e.opa.Stop(ctx)
	}
	e.cleanup()
}

func (e *Engine) cleanup() {
	if e.tmpDir != nil {
		_ = e.tmpDir.Remove()
	}
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
	start := time.Now()
	d, err := e.decide(ctx, path, input)
	if e.metrics != nil {
		e.metrics.decision(path, d.Result, err, time.Since(start))
	}
	if e.shadow != nil {
		e.compareShadow(ctx, path, input, d, err)
	}
	return d, err
}

// logsEntries is whether the engine's sinks (sinks.go) take the decision
// log: the console, a file or a service.
func logsEntries(opts Options) bool {
	return opts.DecisionLog != io.Discard || opts.DecisionLogFile != "" || opts.DecisionLogURL != ""
}

// entryReached is the context key under which a decision tells whether its
// entry reached the engine's sinks: OPA's logs plugin hands the entry on,
// with the decision's context, only once its mask succeeded.
type entryReached struct{}

// DefaultEvaluationTimeout bounds a decision's evaluation when
// Options.EvaluationTimeout does not. A decision of the shipped rules takes
// milliseconds; a bundle whose rule takes longer than this (a mistake in a
// signed bundle: iterating the product of two long lists) would otherwise
// hold every worker that asks it, for as long as the rule runs, with
// nothing said. Stopped, the decision fails with the bound named, as any
// evaluation error fails it: nothing is approved or issued on it (review
// 246 F4). OPA checks the bound between the evaluator's steps, so one builtin
// call that runs long (a regular expression over a long string) ends first.
// OPA's decision-log plugin evaluates the mask with the decision's context,
// so a stopped decision's entry may be lost, with an error line of OPA's
// that names the mask: the manager's own line names the bound.
const DefaultEvaluationTimeout = 5 * time.Second

// ErrEvaluationTimeout is a decision stopped at the bound on one
// evaluation. It wraps no context error: the caller's context did not end.
var ErrEvaluationTimeout = errors.New("not decided within the bound on one evaluation, and stopped")

// timedOut reports whether the bound's context ctx ended while the caller's
// parent had not.
func timedOut(parent, ctx context.Context) bool {
	return parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
}

func (e *Engine) decide(ctx context.Context, path string, input any) (Decision, error) {
	value, err := opavalue.Of(input)
	if err != nil {
		return Decision{Path: path}, fmt.Errorf("input of %s: %w", path, err)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, e.evaluationTimeout)
	defer cancel()
	var reached *atomic.Bool
	if e.logsEntries {
		reached = new(atomic.Bool)
		ctx = context.WithValue(ctx, entryReached{}, reached)
	}
	res, err := e.opa.Decision(ctx, sdk.DecisionOptions{
		Path: path, Input: value,
		// A builtin error fails the decision instead of making one rule
		// body undefined, which for a deny reason would fail open.
		StrictBuiltinErrors: true,
		// The input holds every fact: a rule never reaches the network
		// (http.send), so a logged decision replays exactly.
		HTTPRoundTripper: func(*http.Transport) http.RoundTripper { return refuseNetwork{} },
	})
	// An undefined decision is logged too, and its caller acts on it (the
	// rule does not govern the input): its entry must have reached the
	// sinks as well.
	if reached != nil && !reached.Load() && (err == nil || sdk.IsUndefinedErr(err)) {
		id := ""
		if res != nil {
			id = res.ID
		}
		if timedOut(parent, ctx) {
			return Decision{Path: path}, fmt.Errorf("decision %s of %s: its decision-log entry was not written: %w (%s)", id, path, ErrEvaluationTimeout, e.evaluationTimeout)
		}
		if ctx.Err() != nil {
			// Cut short (a stop, a shard lost), not the mask's doing.
			return Decision{Path: path}, fmt.Errorf("decision %s of %s: its decision-log entry was not written: %w", id, path, ctx.Err())
		}
		return Decision{Path: path}, fmt.Errorf("decision %s of %s: %w", id, path, ErrEntryNotLogged)
	}
	if err != nil {
		if sdk.IsUndefinedErr(err) {
			return Decision{Path: path}, fmt.Errorf("%s: %w", path, ErrNoDecision)
		}
		if timedOut(parent, ctx) {
			// OPA's error wraps the context's, which a caller would take
			// for its own deadline or a server's (a tenant's stall
			// breaker counts those): it is said, not wrapped (review 252
			// F1).
			return Decision{Path: path}, fmt.Errorf("evaluate %s: %w (%s): %s", path, ErrEvaluationTimeout, e.evaluationTimeout, err.Error())
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

// refuseNetwork is the transport of http.send: none.
type refuseNetwork struct{}

func (refuseNetwork) RoundTrip(r *http.Request) (*http.Response, error) {
	return nil, fmt.Errorf("policy rules may not reach the network (http.send %s): every fact is in the input", r.URL.Redacted())
}

// sourceQuery is the query of a URL source, "" if none (or not a URL).
func sourceQuery(source string) string {
	if !isURL(source) {
		return ""
	}
	u, err := url.Parse(source)
	if err != nil {
		return ""
	}
	return u.RawQuery
}

// scrubbing writes log lines with a secret replaced by "...", as written
// and as a JSON log line encodes it (the log's lines are JSON, whose encoder
// writes a query's & as \u0026).
type scrubbing struct {
	w       io.Writer
	secrets [][]byte
}

func newScrubbing(w io.Writer, secret string) scrubbing {
	s := scrubbing{w: w, secrets: [][]byte{[]byte(secret)}}
	if quoted, err := json.Marshal(secret); err == nil {
		if escaped := quoted[1 : len(quoted)-1]; !bytes.Equal(escaped, []byte(secret)) {
			s.secrets = append(s.secrets, escaped)
		}
	}
	return s
}

func (s scrubbing) Write(p []byte) (int, error) {
	out := p
	for _, secret := range s.secrets {
		out = bytes.ReplaceAll(out, secret, []byte("..."))
	}
	if _, err := s.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// scrubbedError is an error whose text had a secret replaced; it still
// wraps the error it was made of.
type scrubbedError struct {
	error
	msg string
}

func (e scrubbedError) Error() string { return e.msg }
func (e scrubbedError) Unwrap() error { return e.error }

// sinkMask is the sink label of the decision-log entries that reached no
// sink: the decision log's drop or mask rule failed on them.
const sinkMask = "mask"

// OPA's logs plugin's messages for an entry it drops because the bundle's
// drop or mask rule failed to evaluate (OPA v1's plugins/logs, Log): it
// logs this at error level and returns nothing to the decision's caller.
var lostEntryMessages = []string{"Log event masking failed", "Log drop decision failed"}

// opaLogger is OPA's logger. It counts the decision-log entries OPA's logs
// plugin drops when the bundle's mask fails (or a drop rule, which no
// bundle may define: dropDecisionPath): no sink sees them, and OPA tells
// the decision's caller nothing (the engine fails the decision itself:
// ErrEntryNotLogged; review 152 L2). They count as dropped by sink "mask", which
// IchorDecisionLogEntriesDropped alerts on; the error line stays OPA's. And
// it cuts every line to MaxLogText: OPA quotes what a bundle holds (a
// file's name, a module's line) in its errors, once a poll, and whoever
// writes the bundle's source needs no key to make that megabytes (review
// 162).
type opaLogger struct {
	logging.Logger
	lost func()
	// secret is the source's signed query, replaced before a line is cut:
	// cut first, a query across the cut would no longer be found whole by
	// the scrubbing writer behind (review 163).
	secret string
}

// line is a log line of OPA's, formatted (a format given alone is the line:
// OPA passes some texts so), scrubbed and cut to MaxLogText.
func (l opaLogger) line(format string, a []any) string {
	text := format
	if len(a) > 0 {
		text = fmt.Sprintf(format, a...)
	}
	if l.secret != "" {
		text = strings.ReplaceAll(text, l.secret, "...")
	}
	return servingcert.Clip(redactURLs(text), MaxLogText)
}

// MaxLogText is the most of one line of OPA's log, or of a bundle's
// refusal, kept.
const MaxLogText = 8 << 10

func (l opaLogger) Error(format string, a ...any) {
	for _, m := range lostEntryMessages {
		if strings.HasPrefix(format, m) && !cancelled(a) {
			l.lost()
			break
		}
	}
	l.Logger.Error("%s", l.line(format, a))
}

func (l opaLogger) Warn(format string, a ...any) {
	l.Logger.Warn("%s", l.line(format, a))
}

func (l opaLogger) Info(format string, a ...any) {
	if l.GetLevel() >= logging.Info {
		l.Logger.Info("%s", l.line(format, a))
	}
}

// Debug formats nothing below its level: OPA logs at debug level on the
// path of every decision.
func (l opaLogger) Debug(format string, a ...any) {
	if l.GetLevel() >= logging.Debug {
		l.Logger.Debug("%s", l.line(format, a))
	}
}

// cancelled reports whether the failure among args is the decision's
// context ending (a shard lost, a stop) rather than the rule's: the bundle
// is not at fault, and the decision's own writes end with that context.
func cancelled(args []any) bool {
	for _, x := range args {
		if err, ok := x.(error); ok && (topdown.IsCancel(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return true
		}
	}
	return false
}

// WithFields scrubs and cuts the fields' text as a line's: at debug level
// OPA's REST client logs a request's URL, the answer's headers and the body
// of an answer that is not a success as fields (review 228 N6).
func (l opaLogger) WithFields(fields map[string]any) logging.Logger {
	scrubbed := make(map[string]any, len(fields))
	for k, v := range fields {
		scrubbed[k] = l.field(v)
	}
	return opaLogger{Logger: l.Logger.WithFields(scrubbed), lost: l.lost, secret: l.secret}
}

// field is a field's value as the log keeps it: text (an error's, bytes',
// a URL's too) scrubbed and cut as a line is (line); a value of another kind
// whose JSON (as the log writes it) or text would be changed so, as that
// text; any other as it is.
func (l opaLogger) field(v any) any {
	switch v := v.(type) {
	case nil, bool, int, int64, uint64, float64:
		return v
	case string:
		return l.line(v, nil)
	case error:
		return l.line(v.Error(), nil)
	case []byte:
		return l.line(string(v), nil)
	case url.URL:
		return l.line(v.Redacted(), nil)
	case *url.URL:
		if v == nil {
			return nil
		}
		return l.line(v.Redacted(), nil)
	}
	texts := []string{fmt.Sprint(v)}
	if b, err := json.Marshal(v); err == nil {
		texts = append(texts, string(b))
	}
	for _, text := range texts {
		if scrubbed := l.line(text, nil); scrubbed != text {
			return scrubbed
		}
	}
	return v
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
