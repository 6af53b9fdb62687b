package engine_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/version"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

type signer struct {
	private, public string
}

func newSigner(t *testing.T) signer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	require.NoError(t, err)
	return signer{
		private: string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})),
		public:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}
}

// policyBundle builds the repository's policy, optionally with the IP check
// loosened (a different rule, so a different revision).
func policyBundle(t *testing.T, loosen bool) *bundle.Bundle {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../policy")))
	if loosen {
		path := filepath.Join(dir, "ichor", "kubelet_serving", "names.rego")
		src, err := os.ReadFile(path)
		require.NoError(t, err)
		loosened := strings.Replace(string(src), "\tsan.type == \"ip\"\n\tvalue :=", "\tsan.type == \"ip-disabled\"\n\tvalue :=", 1)
		require.NotEqual(t, string(src), loosened)
		require.NoError(t, os.WriteFile(path, []byte(loosened), 0o600))
	}
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	return b
}

// policyWithProbe is the shipped policy with one more module,
// ichor/probe/probe.rego, whose source is module.
func policyWithProbe(t *testing.T, module string) *bundle.Bundle {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../policy")))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "ichor", "probe"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ichor", "probe", "probe.rego"), []byte(module), 0o600))
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	return b
}

// loggingEngine starts an engine on the repository's policy as change
// leaves it (in a copy), with its decision log kept.
func loggingEngine(t *testing.T, change func(dir string)) (*engine.Engine, *harness.DecisionLog) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../policy")))
	change(dir)
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	log := &harness.DecisionLog{}
	e, err := engine.New(context.Background(), engine.Options{Bundle: b, DecisionLog: log, Log: io.Discard, ID: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	return e, log
}

func writeBundle(t *testing.T, path string, b *bundle.Bundle, s *signer) {
	t.Helper()
	if s != nil {
		require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
	}
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	// Write and rename, as a ConfigMap update or a deploy would, so the
	// poller never reads half a file.
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, data, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// statuses collects the engine's bundle activation reports.
type statuses struct {
	mu  sync.Mutex
	all []engine.BundleStatus
}

func (s *statuses) add(st engine.BundleStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, st)
}

func (s *statuses) refusals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.all {
		if st.Err != nil {
			n++
		}
	}
	return n
}

// last is the error of the last report.
func (s *statuses) last() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return nil
	}
	return s.all[len(s.all)-1].Err
}

func forgedIPDecision(t *testing.T, e *engine.Engine) (string, string) {
	t.Helper()
	d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.3"))
	require.NoError(t, err)
	return d.Action, d.Revision
}

func TestSignedBundleRolloutKeepsTheLastGood(t *testing.T) {
	s, stranger := newSigner(t), newSigner(t)
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	good := policyBundle(t, false)
	writeBundle(t, path, good, &s)
	reg := prometheus.NewRegistry()
	metrics, err := engine.NewMetrics(reg)
	require.NoError(t, err)
	var st statuses

	e, err := engine.New(context.Background(), engine.Options{
		Source: path, PollInterval: 50 * time.Millisecond,
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}},
		DecisionLog:      io.Discard, Log: io.Discard, Metrics: metrics, OnBundleStatus: st.add,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	action, rev := forgedIPDecision(t, e)
	require.Equal(t, "deny", action)
	require.Equal(t, good.Manifest.Revision, rev)
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.RevisionGauge(good.Manifest.Revision)))

	refuse := func(name string, write func()) {
		t.Helper()
		before := st.refusals()
		write()
		require.Eventually(t, func() bool { return st.refusals() > before }, 10*time.Second, 20*time.Millisecond, "%s was not refused", name)
		action, rev := forgedIPDecision(t, e)
		assert.Equal(t, "deny", action, "%s: the last good bundle keeps deciding", name)
		assert.Equal(t, good.Manifest.Revision, rev, name)
		assert.Error(t, e.LastError(), name)
	}
	refuse("an unsigned bundle", func() { writeBundle(t, path, policyBundle(t, true), nil) })
	refuse("a bundle signed by an unknown key", func() { writeBundle(t, path, policyBundle(t, true), &stranger) })
	refuse("a tampered bundle", func() {
		b := policyBundle(t, false)
		require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
		// Change a rule after signing: the signature no longer covers it.
		b.Modules[0].Raw = append(b.Modules[0].Raw, []byte("\n# tampered\n")...)
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, data, 0o600))
	})
	refuse("a corrupt file", func() { require.NoError(t, os.WriteFile(path, []byte("not a tarball"), 0o600)) })
	assert.GreaterOrEqual(t, testutil.ToFloat64(metrics.LoadFailures()), 4.0)
	// The file is read again only when it changes, so the counter grows no
	// more; the gauge keeps saying so until a bundle is activated.
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Refused()))

	// A good new bundle is picked up without a restart.
	next := policyBundle(t, true)
	writeBundle(t, path, next, &s)
	require.Eventually(t, func() bool {
		_, rev := forgedIPDecision(t, e)
		return rev == next.Manifest.Revision
	}, 10*time.Second, 20*time.Millisecond)
	action, _ = forgedIPDecision(t, e)
	assert.Equal(t, "approve", action)
	assert.NoError(t, e.LastError())
	assert.Equal(t, next.Manifest.Revision, e.Revision())
	require.Eventually(t, func() bool { return testutil.ToFloat64(metrics.Refused()) == 0 }, 10*time.Second, 20*time.Millisecond,
		"a bundle activated ends the refusal")
}

func TestBadBundleAtStartFailsWithItsReason(t *testing.T) {
	s := newSigner(t)
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	writeBundle(t, path, policyBundle(t, false), nil)

	_, err := engine.New(context.Background(), engine.Options{
		Source: path, VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}},
		DecisionLog: io.Discard, Log: io.Discard,
	})

	require.Error(t, err)
	assert.Contains(t, err.Error(), "refused")
	_, err = engine.New(context.Background(), engine.Options{
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, DecisionLog: io.Discard, Log: io.Discard,
	})
	assert.ErrorContains(t, err, "embedded bundle is not signed")
}

func TestBundleFromURLIsPolled(t *testing.T) {
	s := newSigner(t)
	signed := func(b *bundle.Bundle) []byte {
		require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		return data
	}
	var mu sync.Mutex
	serve := signed(policyBundle(t, false))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = w.Write(serve)
	}))
	t.Cleanup(srv.Close)

	// Unsigned from a URL: refused outright.
	_, err := engine.New(context.Background(), engine.Options{Source: srv.URL + "/bundles/ichor.tar.gz", DecisionLog: io.Discard, Log: io.Discard})
	require.ErrorContains(t, err, "give the key its bundles are signed with")
	// Signed, but over plain http, without the operator allowing it: refused.
	keys := []engine.VerificationKey{{ID: "ichor", PEM: s.public}}
	_, err = engine.New(context.Background(), engine.Options{Source: srv.URL + "/bundles/ichor.tar.gz", DecisionLog: io.Discard, Log: io.Discard, VerificationKeys: keys})
	require.ErrorContains(t, err, "is plain http")

	e, err := engine.New(context.Background(), engine.Options{
		Source: srv.URL + "/bundles/ichor.tar.gz", PollInterval: time.Second, DecisionLog: io.Discard, Log: io.Discard,
		VerificationKeys: keys, AllowInsecureHTTP: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	action, _ := forgedIPDecision(t, e)
	require.Equal(t, "deny", action)

	data := signed(policyBundle(t, true))
	mu.Lock()
	serve = data
	mu.Unlock()
	require.Eventually(t, func() bool {
		action, _ := forgedIPDecision(t, e)
		return action == "approve"
	}, 15*time.Second, 50*time.Millisecond)
}

func TestShadowDisagreementsAreCountedNotActedOn(t *testing.T) {
	shadow, err := engine.New(context.Background(), engine.Options{Bundle: policyBundle(t, true), DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { shadow.Stop(context.Background()) })
	reg := prometheus.NewRegistry()
	metrics, err := engine.NewMetrics(reg)
	require.NoError(t, err)
	var logs harness.DecisionLog
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: &logs, Metrics: metrics, Shadow: shadow})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	action, _ := forgedIPDecision(t, e)
	assert.Equal(t, "deny", action, "the active bundle decides")
	good, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
	require.NoError(t, err)
	assert.Equal(t, "approve", good.Action)

	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Disagreements(engine.PathKubeletServing)))
	assert.Contains(t, logs.String(), "Shadow bundle disagrees")
	assert.Contains(t, logs.String(), `"codes":["IPNotNode"]`)
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Decisions(engine.PathKubeletServing, "deny", "IPNotNode")))
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Decisions(engine.PathKubeletServing, "approve", "IchorKubeletServing")))
}

// A shadow bundle that grants more for the same verdict (a talosconfig for
// twelve hours where the active one admits one for an hour, under the same
// reason code) disagrees: comparing the action and the
// codes alone counted no disagreement.
func TestAShadowThatGrantsMoreDisagrees(t *testing.T) {
	ctx := context.Background()
	wider, err := bundles.Load(harness.PolicyWithWiderTalosconfig(t))
	require.NoError(t, err)
	shadow, err := engine.New(ctx, engine.Options{Bundle: wider, DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { shadow.Stop(ctx) })
	reg := prometheus.NewRegistry()
	metrics, err := engine.NewMetrics(reg)
	require.NoError(t, err)
	var logs harness.DecisionLog
	e, err := engine.New(ctx, engine.Options{DecisionLog: io.Discard, Log: &logs, Metrics: metrics, Shadow: shadow})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(ctx) })

	admit := func(clusterExists bool) engine.Outcome {
		t.Helper()
		d, err := e.Decide(ctx, engine.PathCredentialAdmission, harness.AdmissionInput("ichor:alice", clusterExists))
		require.NoError(t, err)
		return d.Outcome()
	}

	admitted := admit(true)
	assert.Equal(t, engine.ActionAllowed, admitted.Action, "the active bundle decides")
	assert.Contains(t, admitted.Reasons.String(), "os:reader")
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.Disagreements(engine.PathCredentialAdmission)))
	assert.Contains(t, logs.String(), "Shadow bundle disagrees")
	assert.Contains(t, logs.String(), `"result_fields_changed":["credential","lifetime_seconds"]`)

	// A refusal that names another lifetime is a disagreement too: every
	// field counts, whatever the action word says.
	refused := admit(false)
	assert.Equal(t, engine.ActionRefused, refused.Action)
	assert.Equal(t, 2.0, testutil.ToFloat64(metrics.Disagreements(engine.PathCredentialAdmission)))
	assert.Contains(t, logs.String(), `"result_fields_changed":["lifetime_seconds"]`)
}

func TestDecisionLogFileSink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard, DecisionLogFile: path})
	require.NoError(t, err)
	d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
	require.NoError(t, err)
	e.Stop(context.Background())

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(data), "\n"))
	assert.Contains(t, string(data), `"decision_id":"`+d.DecisionID+`"`)
	assert.Contains(t, string(data), `"msg":"Decision Log"`)
	assert.Contains(t, string(data), `"ichor_version":"`+version.Get().Version+`"`)
	assert.NotContains(t, string(data), "s3cret", "masked")
}

// A manager killed while it wrote an entry leaves part of a line at the
// end of the file: the next manager's first entry begins on a line of its
// own, readable (review of 2026-12-06).
func TestDecisionLogFileLeftTornIsWrittenOnAfresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	require.NoError(t, os.WriteFile(path, []byte(`{"msg":"Decision Log","decision_id":"d-whole"}`+"\n"+`{"bundles":{"ich`), 0o600))
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard, DecisionLogFile: path})
	require.NoError(t, err)
	d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
	require.NoError(t, err)
	e.Stop(context.Background())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	entries, skipped, err := decisionlog.Read(f)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, "d-whole", entries[0].DecisionID)
	assert.Equal(t, d.DecisionID, entries[1].DecisionID, "the new entry was glued to the torn line")
	assert.Equal(t, 1, skipped.Lines, "the torn line")
}

// The file sink rotates by size and keeps a bounded number of rotated
// files: a manager that runs for months does not fill its volume. Every
// entry is whole in one file, and the newest is in the current one.
func TestDecisionLogFileSinkRotatesAndKeepsABoundedNumber(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "decisions.log")
	e, err := engine.New(context.Background(), engine.Options{
		DecisionLog: io.Discard, Log: io.Discard, DecisionLogFile: path, DecisionLogFileMaxMiB: 1, DecisionLogFileMaxBackups: 2,
	})
	require.NoError(t, err)
	in := servingInput(t, csrgen.ECDSA, "10.5.0.2")
	// Decide until the file was begun anew three times: one rotated file
	// more than are kept.
	var last string
	var size int64
	for rotations, i := 0, 0; rotations < 3; i++ {
		require.Less(t, i, 100_000, "the file was not rotated")
		d, err := e.KubeletServing(context.Background(), in)
		require.NoError(t, err)
		last = d.DecisionID
		info, err := os.Stat(path)
		require.NoError(t, err)
		if info.Size() < size {
			rotations++
		}
		size = info.Size()
	}
	e.Stop(context.Background())

	// The oldest rotated files are removed in the background.
	var files []string
	require.Eventually(t, func() bool {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return false
		}
		files = files[:0]
		for _, f := range entries {
			files = append(files, f.Name())
		}
		return len(files) == 3
	}, 10*time.Second, 50*time.Millisecond, "want the current file and two rotated ones")
	for _, name := range files {
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.LessOrEqual(t, len(data), 1<<20, name)
		assert.True(t, strings.HasSuffix(string(data), "\n"), "%s ends with a whole entry", name)
		for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			assert.True(t, json.Valid([]byte(line)), "%s holds whole JSON lines", name)
		}
		info, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), name)
	}
	current, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(current), `"decision_id":"`+last+`"`)
}

func TestDecisionLogServiceSink(t *testing.T) {
	got := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.Path + " " + r.Header.Get("Content-Encoding")
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard, DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	_, err = e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
	require.NoError(t, err)

	select {
	case req := <-got:
		assert.Equal(t, "/logs gzip", req)
	case <-time.After(20 * time.Second):
		t.Fatal("no decision-log upload")
	}
}

func TestDecisionLogUploadDropsAreCounted(t *testing.T) {
	// A log service that never answers, and an upload buffer of one entry:
	// every entry after the first is dropped, and counted.
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(block); srv.Close() })
	metrics, err := engine.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	e, err := engine.New(context.Background(), engine.Options{
		DecisionLog: io.Discard, Log: io.Discard, Metrics: metrics,
		DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true, DecisionLogBufferEvents: 1,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	for range 5 {
		_, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
		require.NoError(t, err)
	}

	assert.GreaterOrEqual(t, metrics.UploadDropped("buffer_full"), 3.0)
}

// An entry OPA's logs plugin drops because the bundle's mask fails to
// evaluate reaches no sink, and its decision is not acted on: the engine
// answers it with ErrEntryNotLogged, naming the decision, as it answers a
// decision whose entry the file cannot take, and so for an undefined one
// (its caller acts on "the rule does not govern this"). Before, it was
// taken with no entry (OPA tells the caller nothing), and only a count said
// so. Only the decisions the mask fails on are refused: the mask here fails
// on a marker in the input, and the decisions beside them are logged and
// answered. The entry is counted as dropped (sink "mask", which
// IchorDecisionLogEntriesDropped alerts on) beside OPA's error line (review
// 152 L2). The shipped rules drop and count nothing. (No drop rule of the
// bundle's is asked: TestADropRuleInTheBundleTakesNoEntryOutOfTheLog.)
func TestADecisionWhoseEntryTheMaskFailsOnIsNotActedOn(t *testing.T) {
	s := newSigner(t)
	const marker = "10.5.0.99"
	// Two values of one complete rule where the entry holds the marker: an
	// evaluation error, not undefined.
	const broken = "package system.log\n\n_twice := 1 if contains(json.marshal(input.input), \"" + marker + "\")\n\n" +
		"_twice := 2 if contains(json.marshal(input.input), \"" + marker + "\")\n\nmask contains \"/input/none\" if _twice == 1\n"
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../policy")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "system", "log", "broken.rego"), []byte(broken), 0o600))
	for name, c := range map[string]struct{ dir, message string }{
		"shipped":       {dir: "../policy"},
		"a broken mask": {dir: dir, message: "Log event masking failed"},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := bundles.FromDir(c.dir)
			require.NoError(t, err)
			bundles.SetEpoch(b, bundles.Floor())
			path := filepath.Join(t.TempDir(), "bundle.tar.gz")
			writeBundle(t, path, b, &s)
			metrics, err := engine.NewMetrics(prometheus.NewRegistry())
			require.NoError(t, err)
			var decisions, opaLog harness.DecisionLog
			e, err := engine.New(context.Background(), engine.Options{
				Source: path, VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}},
				DecisionLog: &decisions, Log: &opaLog, Metrics: metrics,
			})
			require.NoError(t, err)
			t.Cleanup(func() { e.Stop(context.Background()) })

			// A decision without the marker is logged and answered, either way.
			d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
			require.NoError(t, err)
			assert.Contains(t, decisions.String(), d.DecisionID)

			marked, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, marker))
			_, undefinedErr := e.Requirements(context.Background(), "no-such-purpose-"+marker)
			if c.message == "" {
				require.NoError(t, err)
				assert.Contains(t, decisions.String(), marked.DecisionID)
				require.ErrorIs(t, undefinedErr, engine.ErrNoDecision)
				assert.Zero(t, metrics.Dropped("mask"))
				return
			}
			require.ErrorIs(t, err, engine.ErrEntryNotLogged)
			id := regexp.MustCompile(`decision ([0-9a-f-]{36}) of `).FindStringSubmatch(err.Error())
			require.NotNil(t, id, "the decision is named: %v", err)
			assert.NotContains(t, decisions.String(), id[1], "the test proves nothing: the entry was written")
			require.ErrorIs(t, undefinedErr, engine.ErrEntryNotLogged, "an undefined decision the mask failed on is not answered as undefined")
			assert.Equal(t, 2.0, metrics.Dropped("mask"))
			assert.Contains(t, opaLog.String(), c.message)
		})
	}
}

// A rule reaches nothing beyond its input: a bundle whose rules call
// http.send is refused at activation (bundles.ErrBundleBuiltins), the
// decision log's mask as well as a decision rule, and the server is never
// called; the decision's own refusal of the network (refuseNetwork) stays
// behind it. OPA's decision-log plugin evaluates the mask on every entry
// without that refusal, so a mask calling http.send sent every decision out
// (review 227 F2).
func TestRulesCannotReachTheNetwork(t *testing.T) {
	called := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called <- struct{}{} }))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS("../policy")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "system", "log", "send.rego"), []byte(`package system.log

mask contains "/input/nothing" if http.send({"method": "POST", "url": "`+srv.URL+`", "body": input}).status_code == 200
`), 0o600))
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	_, err = engine.New(context.Background(), engine.Options{Bundle: b, DecisionLog: &harness.DecisionLog{}, Log: io.Discard, StartTimeout: 10 * time.Second})

	require.ErrorContains(t, err, engine.ErrBundleBuiltins.Error())
	assert.ErrorContains(t, err, "system/log/send.rego calls http.send")
	select {
	case <-called:
		t.Fatal("the rule reached the network")
	default:
	}
}

// The bundle's drop rule drops nothing: the engine asks for one at a path
// no bundle may define, so a rule at OPA's default path (system/log/drop,
// inside the roots a bundle may claim) takes no entry out of the log
// (review 227 F1).
func TestADropRuleInTheBundleTakesNoEntryOutOfTheLog(t *testing.T) {
	e, log := loggingEngine(t, func(dir string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "system", "log", "drop.rego"), []byte("package system.log\n\ndrop := true\n"), 0o600))
	})

	d, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.3"))
	require.NoError(t, err)

	read, _, err := decisionlog.Read(strings.NewReader(log.String()))
	require.NoError(t, err)
	require.Len(t, read, 1, "the decision's entry is in the log")
	assert.Equal(t, d.DecisionID, read[0].DecisionID)
}

func TestAKubeletClientRuleThatDeniesIsRefusedByTheEngine(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "ichor", "kubelet_client"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ichor", "kubelet_client", "broken.rego"), []byte(`package ichor.kubelet_client

decision := {"action": "deny", "reasons": [{"code": "Broken", "message": "a rule that denies"}], "node": "worker-1", "kind": ""}
`), 0o600))
	b, err := bundles.FromDir(dir)
	require.NoError(t, err)
	e, err := engine.New(context.Background(), engine.Options{Bundle: b, DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	d, err := e.KubeletClient(context.Background(), csrinput.KubeletClient{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "answers deny, which the kubelet client rule never does")
	assert.Empty(t, d.Action, "nothing to act on")
}

func TestStopFlushesTheUploadBufferAndCountsWhatItCouldNotSend(t *testing.T) {
	for _, healthy := range []bool{true, false} {
		t.Run(fmt.Sprintf("healthy=%v", healthy), func(t *testing.T) {
			svc := &harness.LogService{}
			svc.SetDown(!healthy)
			srv := httptest.NewServer(svc)
			t.Cleanup(srv.Close)
			metrics, err := engine.NewMetrics(prometheus.NewRegistry())
			require.NoError(t, err)
			e, err := engine.New(context.Background(), engine.Options{
				DecisionLog: io.Discard, Log: io.Discard, Metrics: metrics, DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true,
			})
			require.NoError(t, err)
			const n = 41
			for range n {
				_, err := e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
				require.NoError(t, err)
			}
			// Right away, as at SIGTERM: the periodic upload has not run yet.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			e.Stop(ctx)
			if healthy {
				assert.Equal(t, n, svc.Received(), "every entry reaches a healthy service before the engine stops")
				assert.Zero(t, metrics.UploadDropped("shutdown"))
			} else {
				assert.Zero(t, svc.Received())
				assert.EqualValues(t, n, metrics.UploadDropped("shutdown"), "what could not be sent is counted")
			}

			// A decision still running at shutdown (a webhook's, past the
			// server's grace period) is logged after Stop: counted as
			// dropped, not queued for an upload that is over.
			dropped := metrics.UploadDropped("shutdown")
			_, err = e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
			require.NoError(t, err)
			assert.Equal(t, dropped+1, metrics.UploadDropped("shutdown"), "an entry logged after the stop is counted")
		})
	}
}

func TestTheUploadBufferIsBoundedByDefault(t *testing.T) {
	// A service that is away: the buffer holds the default, not everything.
	// The entries come from a rule that costs nothing (the buffer counts
	// entries, whatever decided them): ten thousand kubelet-serving
	// decisions took half a minute of CPU.
	e, metrics := withTheServiceAway(t, policyWithProbe(t, "package ichor.probe\n\ndecision := true\n"))
	for range engine.DefaultDecisionLogBufferEvents + 50 {
		_, err := e.Decide(context.Background(), "ichor/probe/decision", map[string]any{})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return metrics.UploadDropped("buffer_full") >= 50 }, 10*time.Second, 50*time.Millisecond,
		"the oldest entries beyond the default buffer are dropped and counted")
}

func TestTheUploadBufferIsBoundedInBytes(t *testing.T) {
	// Entries of 900 KB each, which the mask does not cut (a request padded
	// with what no list cap reaches), while the service is away: the
	// buffer holds 64 MiB of them, not its 10,000 entries' worth (review of
	// 2026-12-05).
	e, metrics := withTheServiceAway(t, policyWithProbe(t, "package ichor.probe\n\ndecision := {\"big\": sprintf(\"%0900000d\", [0])}\n"))
	const decisions = 100
	for range decisions {
		_, err := e.Decide(context.Background(), "ichor/probe/decision", map[string]any{})
		require.NoError(t, err)
	}
	// 64 MiB holds 74 of them; some may be in flight to the service that
	// is away, which the buffer cannot drop.
	require.Eventually(t, func() bool { return metrics.UploadDropped("buffer_full") >= decisions-74-1 }, 10*time.Second, 50*time.Millisecond,
		"the oldest entries beyond 64 MiB are dropped and counted")
	assert.Zero(t, metrics.UploadDropped("oversized"))
}

// withTheServiceAway is an engine of bundle b uploading its decision log to
// a service that is away, and its metrics.
func withTheServiceAway(t *testing.T, b *bundle.Bundle) (*engine.Engine, *engine.Metrics) {
	t.Helper()
	svc := &harness.LogService{}
	svc.SetDown(true)
	e, metrics := uploadingTo(t, b, svc)
	t.Cleanup(func() { e.Stop(context.Background()) })
	return e, metrics
}

// probeUploading is an engine of a rule that costs nothing uploading its
// decision log to svc until the test ends, a decision of it (its id), and
// its metrics.
func probeUploading(t *testing.T, svc *harness.LogService) (decide func() string, metrics *engine.Metrics) {
	t.Helper()
	e, metrics := uploadingTo(t, policyWithProbe(t, "package ichor.probe\n\ndecision := true\n"), svc)
	t.Cleanup(func() { e.Stop(context.Background()) })
	return func() string {
		t.Helper()
		d, err := e.Decide(context.Background(), "ichor/probe/decision", map[string]any{})
		require.NoError(t, err)
		return d.ID
	}, metrics
}

// uploadingTo is an engine of bundle b uploading its decision log to svc,
// and its metrics; the caller stops it.
func uploadingTo(t *testing.T, b *bundle.Bundle, svc *harness.LogService) (*engine.Engine, *engine.Metrics) {
	t.Helper()
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	metrics, err := engine.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	e, err := engine.New(context.Background(), engine.Options{Bundle: b, DecisionLog: io.Discard, Log: io.Discard, Metrics: metrics, DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true})
	require.NoError(t, err)
	return e, metrics
}

// A buffer of a thousand entries or more wakes the upload at each decision;
// while the service fails, only the backoff starts the next attempt. Before
// review 202 (F1) each decision past the thousandth waiting was an upload,
// a gzip of megabytes each, to a service that was away.
func TestAFullBufferDoesNotHurryTheUploadsBackoff(t *testing.T) {
	svc := &harness.LogService{}
	svc.SetDown(true)
	e, _ := uploadingTo(t, policyWithProbe(t, "package ichor.probe\n\ndecision := true\n"), svc)
	t.Cleanup(func() { e.Stop(context.Background()) })

	start := time.Now()
	for range 3000 {
		_, err := e.Decide(context.Background(), "ichor/probe/decision", map[string]any{})
		require.NoError(t, err)
	}
	posts, elapsed := svc.Posts(), time.Since(start)

	// The attempts the backoff allows meanwhile: the first (a second in, or
	// as soon as a thousand wait), then one 2, 4, 8... seconds after the
	// one before; and one more that may be under way.
	allowed := 2
	for at, wait := time.Duration(0), 2*time.Second; at+wait <= elapsed; at, wait = at+wait, 2*wait {
		allowed++
	}
	assert.LessOrEqual(t, posts, allowed, "uploads in %s while the service was away", elapsed)
}

// A service that refuses a body of more than one entry (413, as a proxy's
// body limit does) gets every entry, in smaller batches: before review 202
// (F2) the same batch was sent again forever, no upload after it was taken,
// and the buffer dropped the rest as buffer_full.
func TestABatchTheServiceRefusesAsTooLargeIsSentInSmallerOnes(t *testing.T) {
	svc := &harness.LogService{}
	svc.SetMaxEntries(1)
	decide, metrics := probeUploading(t, svc)

	const n = 50
	for range n {
		decide()
	}

	require.Eventually(t, func() bool { return svc.Received() == n }, 30*time.Second, 20*time.Millisecond,
		"every entry reaches the service, one at a time")
	assert.Zero(t, metrics.UploadDropped("buffer_full"))
	assert.Zero(t, metrics.UploadDropped("refused"))
}

// An entry the service refuses on its own, while it takes the others, is
// dropped, counted and named in the manager's log, and the entries after it
// are sent.
func TestAnEntryTheServiceRefusesOnItsOwnIsDroppedAndTheRestGoOn(t *testing.T) {
	svc := &harness.LogService{}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	metrics, err := engine.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	var notes harness.DecisionLog
	e, err := engine.New(context.Background(), engine.Options{
		Bundle: policyWithProbe(t, "package ichor.probe\n\ndecision := true\n"), DecisionLog: io.Discard, Log: &notes, Metrics: metrics,
		DecisionLogURL: srv.URL, DecisionLogAllowInsecureHTTP: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	decide := func() engine.Decision {
		t.Helper()
		d, err := e.Decide(context.Background(), "ichor/probe/decision", map[string]any{})
		require.NoError(t, err)
		return d
	}
	// Away until the service refuses the first nine: the upload's timer
	// runs apart from the test (review 205 F8). Entries refused in a row,
	// however many, are no service that refuses every body (reviews 205
	// F1, 206 F3, 207 F4).
	svc.SetDown(true)
	var refused []string
	for range 9 {
		refused = append(refused, decide().ID)
	}
	for _, id := range refused {
		svc.RefuseDecision(id)
	}
	var ids []string
	for range 3 {
		ids = append(ids, decide().ID)
	}
	svc.SetDown(false)

	require.Eventually(t, func() bool { return svc.Received() == len(ids) }, 30*time.Second, 20*time.Millisecond,
		"the entries after those refused are sent")
	for _, id := range ids {
		assert.True(t, svc.Has(id), id)
	}
	// Each entry taken on its own after the first was refused lets that
	// one be dropped: as many as there were others. The rest wait for a
	// newer entry the service takes (only refused ones wait meanwhile,
	// tried again at the backoff's pace).
	require.Eventually(t, func() bool { return metrics.UploadDropped("refused") == float64(len(ids)) }, 30*time.Second, 20*time.Millisecond,
		"the entries the service refuses on their own are dropped and counted")
	for i, id := range refused {
		assert.False(t, svc.Has(id))
		if i < len(ids) {
			assert.Contains(t, notes.String(), id, "the manager's log names the decision dropped")
		}
	}
	more := decide().ID
	require.Eventually(t, func() bool { return svc.Has(more) && metrics.UploadDropped("refused") == float64(len(ids)+1) }, 30*time.Second, 20*time.Millisecond,
		"a newer entry taken lets the next refused one be dropped")
}

// An entry the service refuses by its content at the end of the buffer does
// not stand for every body: the tries on their own go to older entries, and
// the rest are sent (review 207 F2: the newest alone was tried, every
// backoff, and the good entries before it waited for good).
func TestANewestEntryTheServiceRefusesDoesNotHoldTheRestBack(t *testing.T) {
	svc := &harness.LogService{}
	decide, metrics := probeUploading(t, svc)
	svc.SetDown(true)
	first := decide()
	good := []string{decide(), decide(), decide()}
	last := decide()
	svc.RefuseDecision(first)
	svc.RefuseDecision(last)
	svc.SetDown(false)

	require.Eventually(t, func() bool { return svc.Received() == len(good) }, 30*time.Second, 20*time.Millisecond,
		"the entries between the two refused are sent")
	require.Eventually(t, func() bool { return metrics.UploadDropped("refused") == 1 }, 30*time.Second, 20*time.Millisecond,
		"the first, refused again after the service took another, is dropped")
}

// Entries the service refuses, logged one after another while older ones it
// takes wait, do not stand for every body: the tries on their own reach the
// older ones too (review 208 F1: only the newest was tried, always one the
// service refused, and the older ones waited for good).
func TestAStreamOfRefusedEntriesDoesNotHoldOlderOnesBack(t *testing.T) {
	svc := &harness.LogService{}
	svc.RefuseInput("bad")
	e, _ := uploadingTo(t, policyWithProbe(t, "package ichor.probe\n\ndecision := true\n"), svc)
	t.Cleanup(func() { e.Stop(context.Background()) })
	decide := func(in map[string]any) (string, error) {
		d, err := e.Decide(context.Background(), "ichor/probe/decision", in)
		return d.ID, err
	}
	bad := map[string]any{"bad": true}
	svc.SetDown(true)
	var good []string
	for _, in := range []map[string]any{bad, {}, {}, bad} {
		id, err := decide(in)
		require.NoError(t, err)
		if len(in) == 0 {
			good = append(good, id)
		}
	}
	svc.SetDown(false)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := decide(bad); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()

	require.Eventually(t, func() bool { return svc.Has(good[0]) && svc.Has(good[1]) }, 60*time.Second, 20*time.Millisecond,
		"the entries the service takes are sent while refused ones keep coming")
}

// A balancer alternating a backend that takes bodies with one that refuses
// them all has no entry dropped: an entry is dropped only when refused twice
// in a row right after the service took another (review 209 F2: refused,
// taken, refused dropped a good entry).
func TestABalancerOverARefusingBackendDropsNothing(t *testing.T) {
	svc := &harness.LogService{}
	svc.Alternate()
	decide, metrics := probeUploading(t, svc)
	const n = 5
	for range n {
		decide()
	}
	// The batch, then its halves, the refusals falling on every other
	// upload, leave the fifth refused on its own (the seventh upload), and
	// held; a newer entry is then taken on its own, and the fifth refused
	// right after.
	require.Eventually(t, func() bool { return svc.Posts() >= 7 }, 30*time.Second, 20*time.Millisecond)
	decide()
	require.Eventually(t, func() bool { return svc.Received() == n+1 }, 60*time.Second, 20*time.Millisecond, "every entry is taken")
	assert.Zero(t, metrics.UploadDropped("refused"))
}

// The service's taking an entry counts for the upload right after only: a
// 503 between the two, and a service that then refuses every body, drop
// nothing (review 207 F1: the entry held was dropped as refused).
func TestATakenEntryBeforeAnOutageDropsNothingAfterIt(t *testing.T) {
	svc := &harness.LogService{}
	decide, metrics := probeUploading(t, svc)
	svc.SetDown(true)
	first := decide()
	newest := decide()
	svc.RefuseDecision(first)
	// Once the newest is taken on its own, the service is away (503),
	// and back refusing every body.
	svc.AfterTake(func(ids []string) {
		if slices.Contains(ids, newest) {
			svc.SetDown(true)
		}
	})
	svc.SetDown(false)
	require.Eventually(t, func() bool { return svc.Has(newest) }, 30*time.Second, 20*time.Millisecond)
	svc.AfterTake(nil)
	posts := svc.Posts()
	require.Eventually(t, func() bool { return svc.Posts() > posts }, 30*time.Second, 20*time.Millisecond, "the first is tried again")
	svc.SetMaxEntries(0)
	svc.SetDown(false)
	posts = svc.Posts()
	require.Eventually(t, func() bool { return svc.Posts() > posts+1 }, 60*time.Second, 20*time.Millisecond, "the first is tried twice more, kept after the first refusal (dropped, it is not tried again)")
	assert.Zero(t, metrics.UploadDropped("refused"), "an entry dropped on a taking that an outage came between")
}

// A service that refuses every body (a proxy answering 400 or 413 whatever
// it is sent) loses no entry: an entry refused on its own is dropped only
// when refused twice right after the service took another on its own. Once
// the service takes bodies again, every entry reaches it (review 204 F1: the
// first version dropped an entry at its first refusal on its own).
func TestAServiceThatRefusesEveryBodyLosesNoEntry(t *testing.T) {
	svc := &harness.LogService{}
	svc.SetMaxEntries(0)
	decide, metrics := probeUploading(t, svc)

	const n = 3
	for range n {
		decide()
	}
	// The batch, then its halves down to the first entry on its own, then
	// the newest on its own.
	require.Eventually(t, func() bool { return svc.Posts() >= 4 }, 30*time.Second, 20*time.Millisecond)
	assert.Zero(t, metrics.UploadDropped("refused"), "an entry dropped by a service that refuses every body")

	// Back, with a decision made meanwhile: none of those held while it
	// refused every body is dropped (review 206 F1: they were, as soon as
	// the newest was taken).
	svc.SetMaxEntries(-1)
	decide()
	require.Eventually(t, func() bool { return svc.Received() == n+1 }, 60*time.Second, 20*time.Millisecond,
		"every entry reaches the service once it takes bodies again")
	assert.Zero(t, metrics.UploadDropped("refused"))
}

func TestAnOversizedEntryIsCountedNotUploaded(t *testing.T) {
	// A rule whose answer is over a megabyte, which the mask does not cut.
	b := policyWithProbe(t, `package ichor.probe

decision := {"big": concat("", [x | some _ in numbers.range(1, 1200000); x := "z"])}
`)
	svc := &harness.LogService{}
	e, metrics := uploadingTo(t, b, svc)
	_, err := e.Decide(context.Background(), "ichor/probe/decision", map[string]any{})
	require.NoError(t, err)
	_, err = e.KubeletServing(context.Background(), servingInput(t, csrgen.ECDSA, "10.5.0.2"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.Stop(ctx)
	assert.EqualValues(t, 1, metrics.UploadDropped("oversized"))
	assert.Equal(t, 1, svc.Received(), "the entries that fit are uploaded")
}

// TestAPublicKeyIsNoHMACSecret (review 246, F3): with an HMAC algorithm
// OPA takes the key's text as the shared secret, so a public key given
// with HS256 let whoever reads it sign the bundles the manager activates.
func TestAPublicKeyIsNoHMACSecret(t *testing.T) {
	s := newSigner(t)
	_, err := engine.New(t.Context(), engine.Options{
		Source:           filepath.Join(t.TempDir(), "bundle.tar.gz"),
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public, Algorithm: "HS256"}},
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `bundle verification key "ichor" is a PEM PUBLIC KEY given with the HMAC algorithm HS256`)
	for name, text := range map[string]string{
		"indented":                "  " + s.public,
		"after a byte-order mark": "\ufeff" + s.public,
		"damaged":                 strings.Replace(s.public, "-----END PUBLIC KEY-----", "", 1),
	} {
		err := engine.CheckVerificationKey(engine.VerificationKey{ID: "ichor", PEM: text, Algorithm: "hs256"})
		assert.ErrorContains(t, err, "given with the HMAC algorithm hs256", name)
	}
	assert.NoError(t, engine.CheckVerificationKey(engine.VerificationKey{ID: "ichor", PEM: "a shared secret", Algorithm: "HS256"}), "a shared secret is no PEM")
	assert.NoError(t, engine.CheckVerificationKey(engine.VerificationKey{ID: "ichor", PEM: s.public, Algorithm: "RS256"}))
}
