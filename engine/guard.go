package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
)

// EpochStore keeps the highest bundle epoch any replica has activated, where
// every replica and every restart reads it (the manager's ConfigMap): a
// restart must not reopen the window a newer bundle closed.
type EpochStore interface {
	// Highest is the highest epoch recorded; 0 when none is.
	Highest(ctx context.Context) (int64, error)
	// Raise records epoch unless a higher one is recorded already.
	Raise(ctx context.Context, epoch int64) error
}

// ErrBundleRollback is a signed bundle older than the floor of this binary,
// than the bundle active, or than the newest any replica has activated.
var ErrBundleRollback = errors.New("bundle older than the one in service")

// epochGuard refuses, inside OPA's activation and before anything of the
// bundle is in service, a signed bundle whose epoch is below the lowest one
// allowed. OPA's bundle plugin offers no hook that can refuse a bundle (its
// pre-activation hook's error is only logged), so the guard sits where every
// activation must pass, whatever its source: the write of the bundle's
// manifest into the store, inside the activation's transaction. An error
// there aborts the transaction, and OPA keeps the last good bundle.
type epochGuard struct {
	// enforce is false for unsigned sources: an unsigned bundle has no
	// epoch anyone vouches for.
	enforce bool
	floor   int64

	mu sync.Mutex
	// active is the epoch of the bundle in service; persisted, the highest
	// the EpochStore holds as last read; behind, whether the first was
	// below the second when last said (sayIfBehind).
	active, persisted int64
	behind            bool
	// raises counts the activations being recorded (raising); raised,
	// those whose recording ended.
	raises int
	raised uint64
}

// ErrBundleRevision is bundles.ErrBundleRevision: a revision the engine
// refuses to activate.
var ErrBundleRevision = bundles.ErrBundleRevision

// MaxBundleRevision is bundles.MaxBundleRevision.
const MaxBundleRevision = bundles.MaxBundleRevision

// check says why a manifest may not be activated; nil when it may.
func (g *epochGuard) check(m bundle.Manifest) error {
	if err := bundles.CheckRevision(m.Revision); err != nil {
		return err
	}
	if !g.enforce {
		return nil
	}
	epoch, err := bundles.Epoch(m)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBundleRollback, err)
	}
	g.mu.Lock()
	active, persisted := g.active, g.persisted
	g.mu.Unlock()
	switch {
	case epoch < g.floor:
		return fmt.Errorf("%w: epoch %d is below %d, the floor of this binary (a bundle from before a hole it closes)", ErrBundleRollback, epoch, g.floor)
	case epoch < active:
		return fmt.Errorf("%w: epoch %d is below %d, the epoch of the bundle in service", ErrBundleRollback, epoch, active)
	case epoch < persisted:
		return fmt.Errorf("%w: epoch %d is below %d, the highest epoch activated in this cluster", ErrBundleRollback, epoch, persisted)
	}
	return nil
}

// setActive notes the epoch of a bundle activated. It never goes down:
// check refuses a bundle below it, and a start's read of the store may come
// after an activation's (review 180).
func (g *epochGuard) setActive(epoch int64) {
	g.mu.Lock()
	g.active = max(g.active, epoch)
	g.mu.Unlock()
}

func (g *epochGuard) persistedEpoch() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.persisted
}

func (g *epochGuard) setPersisted(epoch int64) {
	g.mu.Lock()
	g.persisted = max(g.persisted, epoch)
	g.mu.Unlock()
}

// raising notes that an activation's epoch is being recorded in the
// cluster (observeEpoch), until done is called: meanwhile the refresh does
// not take the record's older value for one lowered by hand.
func (g *epochGuard) raising() (done func()) {
	g.mu.Lock()
	g.raises++
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.raises--
		g.raised++
		g.mu.Unlock()
	}
}

// raisedCount is how many activations' recordings have ended; a refresh
// takes it before it reads the record.
func (g *epochGuard) raisedCount() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.raised
}

// toRestore is the epoch of the bundle in service when the cluster's record,
// recorded (read when raisedCount was before), is below it and no
// activation was being recorded meanwhile (review 180: one that ended
// between the read and now may have raised the record already; the next
// refresh reads it again, so a restore is put off by a poll at most);
// 0 otherwise, and deferred when the record is below it but an activation's
// recording ran meanwhile: then the read says nothing of the record now
// (review 188: the failing gauge was set back to 0 from such a read).
//
// Only the epoch this replica verified and activated is written back, never
// one it merely read: a record raised by whoever may write the ConfigMap
// would otherwise be written back by every replica that read it, after it
// was put right, for as long as any runs (review 179).
func (g *epochGuard) toRestore(recorded int64, before uint64) (active int64, deferred bool) {
	if !g.enforce {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.active <= recorded:
		return 0, false
	case g.raises > 0 || g.raised != before:
		return 0, true
	}
	return g.active, false
}

// guardedStore is OPA's store with the epoch guard on the write of the
// bundle's manifest, each module checked as it is written, and the compiled
// bundle checked as its activation commits.
type guardedStore struct {
	storage.Store
	guard *epochGuard
	// manifest is where the bundle plugin writes the manifest of BundleName.
	manifest storage.Path
	// activations are the open write transactions, by ID (*activation).
	activations sync.Map
}

// activation is what Commit checks of a write transaction: its storage
// context, on which OPA's bundle plugin (and its manager, at its start) puts
// the compiler of the bundle being activated, and whether a module was
// written in it.
type activation struct {
	ctx     *storage.Context
	modules atomic.Bool
}

// moduleCheck is bundles.CheckModule; a test takes it away to show that the
// check of the compiled bundle at Commit refuses on its own what it would.
var moduleCheck = bundles.CheckModule

func (s *guardedStore) NewTransaction(ctx context.Context, params ...storage.TransactionParams) (storage.Transaction, error) {
	txn, err := s.Store.NewTransaction(ctx, params...)
	if err == nil && len(params) > 0 && params[0].Write {
		s.activations.Store(txn.ID(), &activation{ctx: params[0].Context})
	}
	return txn, err
}

// wroteModules marks txn as one that wrote modules.
func (s *guardedStore) wroteModules(txn storage.Transaction) {
	if a, ok := s.activations.Load(txn.ID()); ok {
		a.(*activation).modules.Store(true)
	}
}

// Commit refuses a write transaction whose compiled bundle reaches a
// refused builtin (bundles.CheckCompiled), or that wrote modules with no
// compiled bundle to check: nothing of it is in service, the transaction
// is aborted (a Store's Commit that fails must abort), and OPA keeps the
// last good bundle, as when a module's own check refuses it.
func (s *guardedStore) Commit(ctx context.Context, txn storage.Transaction) error {
	if a, ok := s.activations.LoadAndDelete(txn.ID()); ok {
		if err := a.(*activation).check(); err != nil {
			s.Store.Abort(ctx, txn)
			return err
		}
	}
	return s.Store.Commit(ctx, txn)
}

func (a *activation) check() error {
	var compiled *ast.Compiler
	if a.ctx != nil {
		compiled = plugins.GetCompilerOnContext(a.ctx)
	}
	switch {
	case compiled != nil:
		return bundles.CheckCompiled(compiled)
	case a.modules.Load():
		return fmt.Errorf("%w: modules were written with no compiled bundle to check", ErrBundleBuiltins)
	}
	return nil
}

func (s *guardedStore) Abort(ctx context.Context, txn storage.Transaction) {
	s.activations.Delete(txn.ID())
	s.Store.Abort(ctx, txn)
}

func (s *guardedStore) Write(ctx context.Context, txn storage.Transaction, op storage.PatchOp, path storage.Path, value any) error {
	if op != storage.RemoveOp && path.Equal(s.manifest) {
		var m bundle.Manifest
		if err := roundTrip(value, &m); err != nil {
			return fmt.Errorf("bundle manifest: %w", err)
		}
		if err := bundles.CheckManifest(m); err != nil {
			return err
		}
		if err := s.guard.check(m); err != nil {
			return err
		}
	}
	return s.Store.Write(ctx, txn, op, path, value)
}

// ErrBundleLabels is bundles.ErrBundleLabels: a bundle the engine refuses
// to activate.
var ErrBundleLabels = bundles.ErrBundleLabels

// ErrBundleBuiltins is bundles.ErrBundleBuiltins: a bundle the engine
// refuses to activate.
var ErrBundleBuiltins = bundles.ErrBundleBuiltins

// ErrBundleRoots is bundles.ErrBundleRoots: a bundle the engine refuses to
// activate.
var ErrBundleRoots = bundles.ErrBundleRoots

// UpsertPolicy refuses, inside the activation's transaction, a module whose
// METADATA declares labels (ErrBundleLabels) or that calls a builtin reaching
// beyond its input (ErrBundleBuiltins).
func (s *guardedStore) UpsertPolicy(ctx context.Context, txn storage.Transaction, id string, bs []byte) error {
	if err := moduleCheck(id, bs); err != nil {
		return err
	}
	s.wroteModules(txn)
	return s.Store.UpsertPolicy(ctx, txn, id, bs)
}

// Truncate is how a bundle read in OPA's lazy mode (a URL's) is written:
// its modules pass through bundles.CheckModule on the way in.
func (s *guardedStore) Truncate(ctx context.Context, txn storage.Transaction, params storage.TransactionParams, it storage.Iterator) error {
	return s.Store.Truncate(ctx, txn, params, modulesChecked{Iterator: it, wrote: func() { s.wroteModules(txn) }})
}

type modulesChecked struct {
	storage.Iterator
	wrote func()
}

func (it modulesChecked) Next() (*storage.Update, error) {
	u, err := it.Iterator.Next()
	if err == nil && u != nil && u.IsPolicy {
		err = moduleCheck(u.Path.String(), u.Value)
		it.wrote()
	}
	return u, err
}

// MakeDir and NonEmpty are the optional interfaces of OPA's in-memory store,
// which OPA looks for on the store it is given.
func (s *guardedStore) MakeDir(ctx context.Context, txn storage.Transaction, path storage.Path) error {
	if md, ok := s.Store.(storage.MakeDirer); ok {
		return md.MakeDir(ctx, txn, path)
	}
	return storage.MakeDir(ctx, s.Store, txn, path)
}

func (s *guardedStore) NonEmpty(ctx context.Context, txn storage.Transaction) func([]string) (bool, error) {
	if ne, ok := s.Store.(storage.NonEmptyer); ok {
		return ne.NonEmpty(ctx, txn)
	}
	return storage.NonEmpty(ctx, s.Store, txn)
}

// limitsPluginName is the name of the HTTP client plugin of the bundle
// service: OPA's default client, whose responses are bounded and scanned.
const limitsPluginName = "ichor_bundle_limits"

// limitsPlugin is an OPA REST client plugin (credentials.plugin of the
// bundle service) that gives the bundle downloader, for a URL and for a
// registry alike, OPA's own HTTP client with every response body read
// within the bundle limits and, when it is a gzip stream, scanned (Limits.Scan)
// before OPA's reader sees a byte of it. A registry's manifests and blobs
// pass through it too: what the OCI downloader keeps in its local store has
// been bounded and scanned on the way in.
type limitsPlugin struct {
	limits bundles.Limits
	// plainHTTP: --bundle-allow-insecure-http; without it no request of a
	// bundle's goes over plain http, redirected or not.
	plainHTTP           bool
	registryCredentials string
	manager             *plugins.Manager
}

type limitsFactory struct {
	limits    bundles.Limits
	plainHTTP bool
	// registryCredentials is the Docker config file of an oci:// source's
	// credential (--bundle-registry-credentials), read at each pull.
	registryCredentials string
}

func (*limitsFactory) Validate(*plugins.Manager, []byte) (any, error) { return struct{}{}, nil }

func (f *limitsFactory) New(m *plugins.Manager, _ any) plugins.Plugin {
	return &limitsPlugin{limits: f.limits, plainHTTP: f.plainHTTP, registryCredentials: f.registryCredentials, manager: m}
}

// Start reports the plugin ready: OPA is ready once every plugin is.
func (p *limitsPlugin) Start(context.Context) error {
	p.manager.UpdatePluginStatus(limitsPluginName, &plugins.Status{State: plugins.StateOK})
	return nil
}

func (*limitsPlugin) Stop(context.Context)             {}
func (*limitsPlugin) Reconfigure(context.Context, any) {}

// NewClient is OPA's default client (its TLS configuration from the
// service's) with the limits on its transport.
func (p *limitsPlugin) NewClient(c rest.Config) (*http.Client, error) {
	tlsConfig, err := rest.DefaultTLSConfig(c)
	if err != nil {
		return nil, err
	}
	var timeout int64
	if c.ResponseHeaderTimeoutSeconds != nil {
		timeout = *c.ResponseHeaderTimeoutSeconds
	}
	client := rest.DefaultRoundTripperClient(tlsConfig, timeout)
	client.CheckRedirect = noDowngrade("a bundle asked for over https is not fetched over plain http")
	// Plain http only for a service asked for over it: OPA's OCI client
	// drops CheckRedirect, so the transport is what refuses an https
	// registry's redirect to plain http, flag or no flag (review 162).
	plainHTTP := p.plainHTTP && !strings.HasPrefix(strings.ToLower(c.URL), "https://")
	t := &limitsTransport{base: client.Transport, limits: p.limits.OrDefault(), oci: strings.EqualFold(c.Type, "oci"), plainHTTP: plainHTTP}
	u, err := url.Parse(c.URL)
	if err != nil {
		// url.Error quotes the URL, which may hold a password.
		return nil, fmt.Errorf("the bundle service's URL cannot be read: %w", errors.Unwrap(err))
	}
	// What the service names elsewhere stays out of the manager's loopback
	// and the node's link-local services (elsewhere.go, review 246 F2).
	if base, ok := client.Transport.(*http.Transport); ok && u.Host != "" {
		t.service = origin(u).Host
		t.denied = deniedElsewhere(u.Host)
		t.elsewhere = guardedElsewhere(base, t.denied)
		t.proxy = base.Proxy
	}
	if cfg := p.manager.GetConfig(); t.oci && cfg.PersistenceDirectory != nil {
		t.store = ociStoreDir(*cfg.PersistenceDirectory)
		t.logger = p.manager.Logger()
	}
	if t.oci && p.registryCredentials != "" {
		// Read at each pull (OPA makes a client for each): a credential
		// rotated in its Secret is used at the next.
		header, err := registryBasicAuth(p.registryCredentials, u.Host)
		if err != nil {
			return nil, err
		}
		t.auth = newRegistryAuth(u, header)
	}
	client.Transport = t
	return client, nil
}

func (*limitsPlugin) Prepare(*http.Request) error { return nil }

// noDowngrade is a client's CheckRedirect that follows redirects as
// net/http does (a registry sends its blobs from elsewhere), but not from
// https to plain http, refused with refusal: that would let anyone on the
// path serve the bundle (review 28 L4), or read and drop the decision
// log, which --bundle-allow-insecure-http and
// --decision-log-allow-insecure-http exist to make a choice.
func noDowngrade(refusal string) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return fmt.Errorf("%s: stopped after 10 redirects", bundles.RedactedURL(via[0].URL))
		}
		if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("%s redirects to %s: %s", bundles.RedactedURL(via[0].URL), bundles.RedactedURL(req.URL), refusal)
		}
		return nil
	}
}

type limitsTransport struct {
	base   http.RoundTripper
	limits bundles.Limits
	// plainHTTP allows requests over plain http. OPA's OCI downloader
	// builds its own client around this transport, without the client's
	// CheckRedirect (noDowngrade), so a registry's redirect to http is
	// refused here (review 30 L2).
	plainHTTP bool
	// oci: the service is a registry, whose manifests are checked
	// (ocipull.go).
	oci bool
	// store is OPA's OCI store, pruned as each pull starts (ocistore.go).
	store  string
	logger logging.Logger
	// auth adds the registry's credential, when it has one
	// (registryauth.go).
	auth *registryAuth
	// service is the host of the bundle's service (origin's); a request to
	// any other goes through elsewhere, whose connections stay out of
	// denied (elsewhere.go), unless it goes through a proxy (proxy: the
	// base's), which is then what is dialled. elsewhere nil: no such check.
	service   string
	elsewhere http.RoundTripper
	denied    netguard.Denied
	proxy     func(*http.Request) (*url.URL, error)
	// What the pull under way has fetched (oci): successful GETs and their
	// bytes, counted from the HEAD of its tag (OPA makes a client for each
	// pull; counting from the HEAD holds should it not).
	pullResponses atomic.Int64
	pullBytes     atomic.Int64
	// fetchTimeout bounds each request (the constant fetchTimeout if 0).
	fetchTimeout time.Duration
}

// maxErrorBody bounds what is read of an answer other than 200: OPA reads
// such a body whole (to log it, at the debug level), and a hostile server's
// could be of any size.
const maxErrorBody = 64 << 10

// gzipMagic starts every gzip stream; a bundle is one.
var gzipMagic = []byte{0x1f, 0x8b}

func (t *limitsTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !t.plainHTTP {
		return nil, fmt.Errorf("%s %s: a bundle is not fetched over plain http, except from a source given as plain http with --bundle-allow-insecure-http", req.Method, bundles.RedactedURL(req.URL))
	}
	// OPA's client bounds the wait for an answer's headers only, and its
	// polls have no deadline: a server that sends the headers and then the
	// body a byte at a time would hold the poll, and every bundle after it,
	// for good, with no error to report. Each request has fetchTimeout.
	timeout := t.fetchTimeout
	if timeout == 0 {
		timeout = fetchTimeout
	}
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	resp, err := t.roundTrip(req.WithContext(ctx))
	if err != nil || resp.Body == nil {
		timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
		cancel()
		if err != nil && timedOut {
			err = fmt.Errorf("%s %s: not fetched within %s: %w", req.Method, bundles.RedactedURL(req.URL), timeout, err)
		}
		return resp, err
	}
	resp.Body = cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// proxied reports whether req goes through a proxy (HTTPS_PROXY): the
// proxy, an address the operator chose and often on the loopback (an egress
// sidecar), is then what is dialled, so the request goes through the base
// transport, its URL's address checked before (checkElsewhereHost).
func (t *limitsTransport) proxied(req *http.Request) bool {
	if t.proxy == nil {
		return false
	}
	u, err := t.proxy(req)
	return err == nil && u != nil
}

// fetchTimeout bounds one request of a bundle's fetch, its body read
// included: a bundle's bytes at a slow link's pace, not a stalled server's.
const fetchTimeout = 2 * time.Minute

// cancelOnClose ends a request's context once its answer's body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	defer c.cancel()
	return c.ReadCloser.Close()
}

func (t *limitsTransport) roundTrip(req *http.Request) (*http.Response, error) {
	// A pull starts by resolving the tag (HEAD of its manifest); the
	// previous pull is over, so every blob its tag does not reference can
	// go.
	// Only at the first request of a chain: a redirect of the HEAD is the
	// same resolve (review 181).
	start := req.Method == http.MethodHead && req.Response == nil && isManifestRequest(req)
	if t.oci && start {
		t.pullResponses.Store(0)
		t.pullBytes.Store(0)
	}
	if t.store != "" && start {
		if removed, err := pruneOCIStore(t.store, t.limits, pinnedManifest(req)); err != nil {
			t.logger.Warn("The OCI bundle store could not be pruned before a pull: %v.", err)
		} else if removed > 0 {
			t.logger.Debug("Removed %d blobs of earlier revisions from the OCI bundle store.", removed)
		}
	}
	base := t.base
	if t.elsewhere != nil && origin(req.URL).Host != t.service {
		if err := checkElsewhereHost(req, t.denied); err != nil {
			return nil, elsewhereError(req, t.service, err)
		}
		if !t.proxied(req) {
			base = t.elsewhere
		}
	}
	resp, err := base.RoundTrip(t.auth.authorize(req))
	if err != nil {
		if errors.As(err, new(*netguard.RefusedError)) {
			err = elsewhereError(req, t.service, err)
		}
		return resp, err
	}
	t.auth.learn(req, resp)
	if resp.StatusCode != http.StatusOK {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, maxErrorBody), resp.Body}
		return resp, nil
	}
	manifest := t.oci && isManifestRequest(req)
	if manifest {
		if err := checkPinnedDigest(req, resp); err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("%s %s: %w", req.Method, bundles.RedactedURL(req.URL), err)
		}
	}
	if req.Method == http.MethodHead {
		if manifest {
			if err := checkManifestType(resp); err != nil {
				resp.Body.Close()
				return nil, fmt.Errorf("%s %s: %w", req.Method, bundles.RedactedURL(req.URL), err)
			}
		}
		return resp, nil
	}
	defer resp.Body.Close()
	if t.oci {
		if n := t.pullResponses.Add(1); n > maxPullResponses {
			return nil, fmt.Errorf("%s %s: %w: more than %d answers in one pull (a bundle's manifest, its layers and config)", req.Method, bundles.RedactedURL(req.URL), ErrBundleManifest, maxPullResponses)
		}
	}
	// A registry's manifest is checked for what it would have OPA fetch;
	// image configs are bounded in size only; a gzip stream is a bundle,
	// and is scanned.
	var data []byte
	if manifest {
		data, err = readManifest(resp.Body)
	} else {
		data, err = t.limits.ReadCompressed(resp.Body)
	}
	switch {
	case err != nil:
	case manifest:
		err = checkManifest(data, t.limits)
	case bytes.HasPrefix(data, gzipMagic):
		err = t.limits.Scan(bytes.NewReader(data))
	}
	if err == nil && t.oci {
		if budget := pullBudget(t.limits); t.pullBytes.Add(int64(len(data))) > budget {
			err = fmt.Errorf("%w: one pull fetched more than %d bytes", bundles.ErrBundleTooLarge, budget)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, bundles.RedactedURL(req.URL), err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	return resp, nil
}

// roundTrip decodes a value written to OPA's store (Go values as JSON
// decodes them, or OPA's own) into v.
func roundTrip(value, v any) error {
	if av, ok := value.(ast.Value); ok {
		j, err := ast.JSON(av)
		if err != nil {
			return err
		}
		value = j
	}
	raw, err := json.Marshal(value)
	if err != nil {
		return err
	}
	return util.Unmarshal(raw, v)
}

// refreshEpochs reads the highest epoch recorded in the cluster every
// interval, so that a replica learns what another activated before its own
// source shows it; and writes the epoch of the bundle in service again when
// the record is below it (review 178 F1): the raise after an activation may
// have failed (a file source is activated once, and nothing else would try
// again), or someone lowered or emptied the record, and either way the next
// restart would take back a signed bundle this cluster has moved past.
func (e *Engine) refreshEpochs(ctx context.Context, store EpochStore, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		before := e.guard.raisedCount()
		n, err := store.Highest(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.metrics.epochRecord(true)
				e.notes.WithFields(map[string]any{"error": err.Error()}).Error("Could not read the highest bundle epoch recorded in the cluster.")
			}
			continue
		}
		e.guard.setPersisted(n)
		e.sayIfBehind()
		if active, deferred := e.guard.toRestore(n, before); active > 0 {
			e.restoreEpoch(ctx, store, n, active, before)
		} else if !deferred {
			e.recordFine(before)
		}
	}
}

// recordFine says the record is fine, read when raisedCount was before,
// unless an activation's raise has begun since: under the guard's lock, so
// that a raise that fails and says so (within its raising) is never
// followed by this read's older word (review 190).
func (e *Engine) recordFine(before uint64) {
	e.guard.mu.Lock()
	defer e.guard.mu.Unlock()
	if e.guard.raises == 0 && e.guard.raised == before {
		e.metrics.epochRecord(false)
	}
}

// restoreEpoch writes active, the epoch of the bundle in service here, into
// the cluster's record, which holds recorded, a lower one (read when
// raisedCount was before).
func (e *Engine) restoreEpoch(ctx context.Context, store EpochStore, recorded, active int64, before uint64) {
	fields := map[string]any{"epoch": active, "recorded_epoch": recorded}
	raiseCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := store.Raise(raiseCtx, active); err != nil {
		if ctx.Err() == nil {
			// A raise that timed out is said too (review 179).
			e.metrics.epochRecord(true)
			fields["error"] = err.Error()
			e.notes.WithFields(fields).Error("The cluster's record of the highest bundle epoch is below the epoch of the bundle in service here, and could not be written again (tried at each poll); a replica started now would take back an older signed bundle.")
		}
		return
	}
	e.guard.setPersisted(active)
	// Not over the word of an activation's raise begun since (review 192).
	e.recordFine(before)
	e.notes.WithFields(fields).Warn("The cluster's record of the highest bundle epoch was below the epoch of the bundle in service here (a failed write after its activation, or the record lowered or emptied by hand): written again.")
}

// sayIfBehind tells, by its gauge and once in the log at each change, when
// the bundle in service here is below the highest epoch recorded in the
// cluster: this replica then decides with rules another has moved past, and
// its source will not give it the newer bundle (or its binary is older, in a
// rollout). It still decides: a replica of an older release keeps its
// requests decided until the rollout replaces it.
func (e *Engine) sayIfBehind() {
	// Under the guard's lock throughout: an activation and the refresh
	// may call it at once, and the gauge and the log must end as the last
	// of them saw the epochs. (The revision is read first: the engine's
	// lock is not taken under the guard's.)
	revision := e.Revision()
	e.guard.mu.Lock()
	defer e.guard.mu.Unlock()
	active, persisted := e.guard.active, e.guard.persisted
	behind := active > 0 && persisted > active
	changed := behind != e.guard.behind
	e.guard.behind = behind
	if e.metrics != nil {
		setFlag(e.metrics.epochBehind, behind)
	}
	if !changed {
		return
	}
	fields := map[string]any{"epoch": active, "cluster_epoch": persisted, "revision": revision}
	if behind {
		e.notes.WithFields(fields).Warn("The bundle in service is below the highest epoch recorded in the cluster: another replica activated a newer one, which this replica's source does not serve (or its binary is older).")
	} else {
		e.notes.WithFields(fields).Info("The bundle in service is at the highest epoch recorded in the cluster again.")
	}
}
