package engine_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/bundles/bundlestest"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// bomb is the reproduced attack: 40 files just under the per-file limit,
// of zeros, about 321 KiB gzipped and 320 MiB once decompressed. It needs no
// key: OPA's loader read every file before it looked at the signature.
func bomb(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	size := int64(engine.MaxBundleFileBytes - 4096)
	zeros := make([]byte, size)
	for i := range 40 {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("/x%d/data.json", i), Mode: 0o600, Size: size, Typeflag: tar.TypeReg}))
		_, err := tw.Write(zeros)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

// signedEpoch is the policy, loosened or not, at an epoch, signed by s.
func signedEpoch(t *testing.T, loosen bool, epoch int64, s signer) (*bundle.Bundle, []byte) {
	t.Helper()
	b := policyBundle(t, loosen)
	bundles.SetEpoch(b, epoch)
	require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	return b, data
}

// pushRaw pushes a layer's bytes as the bundle of a tag, as any OCI tool
// would, with none of the checks of ichor bundle push.
func pushRaw(t *testing.T, host, repository, tag string, data []byte) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	layer := content.NewDescriptorFromBytes(bundles.OCILayerMediaType, data)
	require.NoError(t, store.Push(ctx, layer, bytes.NewReader(data)))
	manifest, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "application/vnd.ichor.test", oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}})
	require.NoError(t, err)
	require.NoError(t, store.Tag(ctx, manifest, tag))
	repo, err := remote.NewRepository(host + "/" + repository)
	require.NoError(t, err)
	repo.PlainHTTP = true
	_, err = oras.Copy(ctx, store, tag, repo, tag, oras.DefaultCopyOptions)
	require.NoError(t, err)
}

// source is a bundle source of each kind whose content a test replaces.
type source struct {
	ref   string
	serve func(data []byte)
}

func sources(t *testing.T) map[string]func(t *testing.T) source {
	return map[string]func(t *testing.T) source{
		"file": func(t *testing.T) source {
			path := filepath.Join(t.TempDir(), "bundle.tar.gz")
			return source{ref: path, serve: func(data []byte) {
				require.NoError(t, os.WriteFile(path+".tmp", data, 0o600))
				require.NoError(t, os.Rename(path+".tmp", path))
			}}
		},
		"url": func(t *testing.T) source {
			var current atomic.Pointer[[]byte]
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if p := current.Load(); p != nil {
					_, _ = w.Write(*p)
				}
			}))
			t.Cleanup(srv.Close)
			return source{ref: srv.URL + "/bundles/ichor.tar.gz", serve: func(data []byte) { current.Store(&data) }}
		},
		"oci": func(t *testing.T) source {
			srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
			t.Cleanup(srv.Close)
			host := strings.TrimPrefix(srv.URL, "http://")
			return source{ref: bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable", serve: func(data []byte) {
				pushRaw(t, host, "ichor/policy", "stable", data)
			}}
		},
	}
}

// fakeEpochs is the cluster's record of the highest epoch, in memory.
type fakeEpochs struct {
	mu      sync.Mutex
	highest int64
	// failRaises is how many raises fail next (the API server away).
	failRaises int
	// failReads makes every read fail while it is set.
	failReads bool
}

func (f *fakeEpochs) Highest(context.Context) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failReads {
		return 0, errors.New("the API server is away")
	}
	return f.highest, nil
}

func (f *fakeEpochs) Raise(_ context.Context, epoch int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRaises > 0 {
		f.failRaises--
		return errors.New("the API server is away")
	}
	f.highest = max(f.highest, epoch)
	return nil
}

// set writes the record as whoever may write its ConfigMap could, lower too.
func (f *fakeEpochs) set(epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.highest = epoch
}

func (f *fakeEpochs) get() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.highest
}

// failing sets what fails next: raises (how many) and reads.
func (f *fakeEpochs) failing(raises int, reads bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failRaises, f.failReads = raises, reads
}

type started struct {
	e       *engine.Engine
	st      *statuses
	metrics *engine.Metrics
}

// start starts an engine on src and waits for its first bundle, long
// enough for a loaded machine.
func start(t *testing.T, src source, s signer, epochs engine.EpochStore) (started, error) {
	t.Helper()
	return startWithin(t, src, s, epochs, 30*time.Second)
}

// startOnGood serves a good bundle of the floor epoch on src and starts an
// engine on it.
func startOnGood(t *testing.T, src source, s signer) (*bundle.Bundle, started) {
	t.Helper()
	good, data := signedEpoch(t, false, bundles.Floor(), s)
	src.serve(data)
	e, err := start(t, src, s, nil)
	require.NoError(t, err)
	return good, e
}

// startWithin is start with a start timeout: a start that must fail waits
// for all of it.
func startWithin(t *testing.T, src source, s signer, epochs engine.EpochStore, timeout time.Duration) (started, error) {
	t.Helper()
	metrics, err := engine.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	st := &statuses{}
	e, err := engine.New(context.Background(), engine.Options{
		Source: src.ref, PollInterval: 200 * time.Millisecond, StartTimeout: timeout,
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, AllowInsecureHTTP: true,
		Epochs: epochs, DecisionLog: io.Discard, Log: io.Discard, Metrics: metrics, OnBundleStatus: st.add,
	})
	if err == nil {
		t.Cleanup(func() { e.Stop(context.Background()) })
	}
	return started{e: e, st: st, metrics: metrics}, err
}

// refused serves data and waits for its refusal, which names want; the
// bundle in service stays.
func (s started) refused(t *testing.T, src source, data []byte, want string, keeps *bundle.Bundle) {
	t.Helper()
	before := s.st.refusals()
	failures := testutil.ToFloat64(s.metrics.LoadFailures())
	src.serve(data)
	// A source polled again refuses the previous bundle again until the
	// new one is there: wait for this one's reason.
	require.Eventually(t, func() bool {
		return s.st.refusals() > before && s.st.last() != nil && strings.Contains(s.st.last().Error(), want)
	}, 30*time.Second, 20*time.Millisecond, "not refused for %q; last: %v", want, s.st.last())
	assert.Greater(t, testutil.ToFloat64(s.metrics.LoadFailures()), failures, "the refusal is counted")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.Refused()), "the source's latest bundle is said to be refused")
	_, rev := forgedIPDecision(t, s.e)
	assert.Equal(t, keeps.Manifest.Revision, rev, "the last good bundle keeps deciding")
}

// peakHeapGrowth is how far the heap in use grew above where it was, at
// most, while f ran (sampled every few milliseconds).
func peakHeapGrowth(f func()) uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	done := make(chan struct{})
	sampled := make(chan uint64)
	go func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				sampled <- peak
				return
			case <-t.C:
			}
		}
	}()
	f()
	close(done)
	return <-sampled - base
}

// The reproduced attack of issue 21 (3), from each kind of source: a bundle
// of 321 KiB that costs 320 MiB once OPA reads it. It is refused by the scan
// before OPA reads it, the last good bundle keeps deciding, the refusal is
// counted, and the heap does not grow by what the bomb decompresses to.
func TestABundleBombIsRefusedBeforeOPAReadsIt(t *testing.T) {
	s := newSigner(t)
	data := bomb(t)
	sparse := bundlestest.SparseBomb(40, engine.MaxBundleFileBytes)
	t.Logf("bomb: %d KiB on the wire, %d MiB once decompressed", len(data)>>10, 40*(engine.MaxBundleFileBytes-4096)>>20)
	for name, newSource := range sources(t) {
		t.Run(name, func(t *testing.T) {
			src := newSource(t)
			good, e := startOnGood(t, src, s)

			grown := peakHeapGrowth(func() { e.refused(t, src, data, "bundle too large", good) })
			t.Logf("%s: the heap grew by at most %d MiB while the bomb was refused (the bomb is %d MiB decompressed)", name, grown>>20, 40*(engine.MaxBundleFileBytes-4096)>>20)
			// Generous, and no timing: OPA reading it held 320 MiB at once.
			assert.Less(t, grown, uint64(128<<20))

			// The same 320 MiB as sparse entries: under a kilobyte, each
			// declaring 8 MiB, which OPA's loader allocated and filled
			// before it looked at the signature.
			grown = peakHeapGrowth(func() { e.refused(t, src, sparse, "sparse file", good) })
			t.Logf("%s: the heap grew by at most %d MiB while the sparse bomb (%d bytes) was refused", name, grown>>20, len(sparse))
			assert.Less(t, grown, uint64(128<<20))
		})
	}
}

// The reproduced attack of issue 21 (2): whoever may move the tag (or
// serve the URL, or write the file) puts back an older bundle signed with
// the operator's key. It is refused before it is activated, from every kind
// of source; so is one from before epochs, and one below the binary's floor.
// The highest epoch is recorded, and a restart that reads it refuses the old
// bundle too.
func TestAnOlderSignedBundleIsRefused(t *testing.T) {
	s := newSigner(t)
	for name, newSource := range sources(t) {
		t.Run(name, func(t *testing.T) {
			src := newSource(t)
			old, oldData := signedEpoch(t, false, bundles.Floor()+1, s)
			src.serve(oldData)
			epochs := &fakeEpochs{}
			e, err := start(t, src, s, epochs)
			require.NoError(t, err)
			_, rev := forgedIPDecision(t, e.e)
			require.Equal(t, old.Manifest.Revision, rev)
			assert.Equal(t, bundles.Floor()+1, epochs.get(), "the epoch in service is recorded")

			// A newer bundle, one epoch up: activated, and recorded.
			newer, newerData := signedEpoch(t, true, bundles.Floor()+2, s)
			src.serve(newerData)
			require.Eventually(t, func() bool {
				_, rev := forgedIPDecision(t, e.e)
				return rev == newer.Manifest.Revision
			}, 30*time.Second, 20*time.Millisecond)
			require.Eventually(t, func() bool { return epochs.get() == bundles.Floor()+2 }, 10*time.Second, 20*time.Millisecond)

			// The tag moved back to the older signed bundle.
			e.refused(t, src, oldData, fmt.Sprintf("epoch %d is below %d", bundles.Floor()+1, bundles.Floor()+2), newer)
			// A signed bundle from before epochs.
			noEpoch := policyBundle(t, false)
			delete(noEpoch.Manifest.Metadata, bundles.EpochKey)
			require.NoError(t, bundles.Sign(noEpoch, s.private, "RS256", "ichor"))
			noEpochData, err := bundles.Bytes(noEpoch)
			require.NoError(t, err)
			e.refused(t, src, noEpochData, "carries no epoch", newer)
			// Below the floor of this binary.
			_, belowFloor := signedEpoch(t, false, bundles.Floor()-1, s)
			e.refused(t, src, belowFloor, "the floor of this binary", newer)
			action, _ := forgedIPDecision(t, e.e)
			assert.Equal(t, "approve", action, "the newer rules keep deciding")

			// A restart while the source serves the older bundle: the
			// recorded epoch refuses it.
			e.e.Stop(context.Background())
			src.serve(oldData)
			want := fmt.Sprintf("below %d, the highest epoch activated in this cluster", bundles.Floor()+2)
			// On a loaded machine the first pull can outlast the start
			// timeout, and the start then fails for that: start again until
			// the bundle was read, within a deadline. It must never start.
			for deadline := time.Now().Add(time.Minute); ; {
				_, err = startWithin(t, src, s, epochs, 5*time.Second)
				require.Error(t, err, "a restart activated the older bundle")
				if strings.Contains(err.Error(), want) || time.Now().After(deadline) {
					break
				}
				t.Logf("the restart failed before it read the bundle (%v): again", err)
			}
			require.ErrorContains(t, err, want)
		})
	}
}

// Another replica activated a newer bundle: this one learns its epoch from
// the record within a poll interval, and refuses what is below it although
// it never served the newer bundle itself.
func TestAReplicaRefusesWhatIsBelowAnotherReplicasEpoch(t *testing.T) {
	s := newSigner(t)
	src := sources(t)["url"](t)
	cur, curData := signedEpoch(t, false, bundles.Floor()+1, s)
	src.serve(curData)
	epochs := &fakeEpochs{}
	e, err := start(t, src, s, epochs)
	require.NoError(t, err)
	require.NoError(t, epochs.Raise(context.Background(), bundles.Floor()+3))
	// Wait for the record to be read: a same-epoch rebuild is then refused.
	_, sameEpoch := signedEpoch(t, true, bundles.Floor()+1, s)
	e.refused(t, src, sameEpoch, "the highest epoch activated in this cluster", cur)
}

// A replica whose source keeps serving a bundle below the epoch another
// activated (a tag moved back after the other pulled, by someone without the
// signing key) says so, within a poll interval, until a bundle at that epoch
// is in service (review of 2026-12-06: before, it decided on in silence).
func TestAReplicaBelowAnotherReplicasEpochSaysSo(t *testing.T) {
	s := newSigner(t)
	src := sources(t)["url"](t)
	_, curData := signedEpoch(t, false, bundles.Floor()+1, s)
	src.serve(curData)
	epochs := &fakeEpochs{}
	e, err := start(t, src, s, epochs)
	require.NoError(t, err)
	behind := e.metrics.EpochBehind()
	assert.Zero(t, testutil.ToFloat64(behind))
	require.NoError(t, epochs.Raise(context.Background(), bundles.Floor()+3))
	require.Eventually(t, func() bool { return testutil.ToFloat64(behind) == 1 }, 30*time.Second, 20*time.Millisecond)
	newer, newerData := signedEpoch(t, false, bundles.Floor()+3, s)
	src.serve(newerData)
	require.Eventually(t, func() bool { return testutil.ToFloat64(behind) == 0 }, 30*time.Second, 20*time.Millisecond)
	_, rev := forgedIPDecision(t, e.e)
	assert.Equal(t, newer.Manifest.Revision, rev)
}

// The cluster's record of the highest epoch does not stay below the epoch a
// replica has seen (review 178 F1): a file source is activated once, so a
// raise that failed then was never tried again, and a record lowered by hand
// stayed low; either way a replica started next took back an older signed
// bundle.
func TestTheEpochRecordIsWrittenAgainWhenItIsBelowWhatAReplicaSaw(t *testing.T) {
	s := newSigner(t)
	src := sources(t)["file"](t)
	_, data := signedEpoch(t, false, bundles.Floor()+2, s)
	src.serve(data)
	// Every raise of the start fails (the API server away then), and none
	// after.
	epochs := &fakeEpochs{failRaises: math.MaxInt}
	e, err := start(t, src, s, epochs)
	require.NoError(t, err)
	require.Zero(t, epochs.get())
	// Said while it lasts (review 180 F4): the activation's raise and
	// the polls' failed.
	failing := e.metrics.EpochRecordFailing()
	require.Eventually(t, func() bool { return testutil.ToFloat64(failing) == 1 }, 10*time.Second, 20*time.Millisecond,
		"a record left below the epoch in service is not said")
	epochs.failing(0, false)
	require.Eventually(t, func() bool { return epochs.get() == bundles.Floor()+2 }, 10*time.Second, 20*time.Millisecond,
		"the epoch whose raise failed at the activation is never recorded")
	require.Eventually(t, func() bool { return testutil.ToFloat64(failing) == 0 }, 10*time.Second, 20*time.Millisecond,
		"a record written again is still said to fail")

	epochs.set(bundles.Floor())
	require.Eventually(t, func() bool { return epochs.get() == bundles.Floor()+2 }, 10*time.Second, 20*time.Millisecond,
		"a record lowered by hand stays low")

	// A record that cannot be read: a replica started now would not
	// start, and nothing but this replica's log would say so.
	epochs.failing(0, true)
	require.Eventually(t, func() bool { return testutil.ToFloat64(failing) == 1 }, 10*time.Second, 20*time.Millisecond,
		"a record that cannot be read is not said")
	epochs.failing(0, false)
	require.Eventually(t, func() bool { return testutil.ToFloat64(failing) == 0 }, 10*time.Second, 20*time.Millisecond,
		"a record read again is still said to fail")

	// A record raised past the epoch in service (by whoever may write the
	// ConfigMap, or another replica's activation) and read here, then put
	// back: only the epoch this replica activated is ever written back, so
	// a forged record once put right stays right (review 179: every replica
	// that had read it wrote it back, and new ones refused to start).
	epochs.set(math.MaxInt64)
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.metrics.EpochBehind()) == 1 }, 10*time.Second, 20*time.Millisecond,
		"the replica never read the higher record")
	epochs.set(bundles.Floor() + 2)
	require.Never(t, func() bool { return epochs.get() != bundles.Floor()+2 }, time.Second, 20*time.Millisecond,
		"an epoch only read was written back")
	epochs.set(0)
	require.Eventually(t, func() bool { return epochs.get() == bundles.Floor()+2 }, 10*time.Second, 20*time.Millisecond,
		"a record emptied stays empty")
}

// An unsigned source (a file without --bundle-key) has no epoch anyone
// vouches for: it is neither checked nor recorded.
func TestAnUnsignedFileIsNotHeldToEpochs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	b := policyBundle(t, false)
	delete(b.Manifest.Metadata, bundles.EpochKey)
	writeBundle(t, path, b, nil)
	e, err := engine.New(context.Background(), engine.Options{Source: path, DecisionLog: io.Discard, Log: io.Discard})
	require.NoError(t, err)
	e.Stop(context.Background())
}

// pushGraph pushes to a tag what a registry may hold that is not a bundle:
// a manifest of layers random blobs of size bytes each, or, with index, an
// image index over such a manifest.
func pushGraph(t *testing.T, host, repository, tag string, layers, size int, index bool) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	var descs []ocispec.Descriptor
	for range layers {
		blob := make([]byte, size)
		_, _ = rand.Read(blob)
		d := content.NewDescriptorFromBytes(bundles.OCILayerMediaType, blob)
		require.NoError(t, store.Push(ctx, d, bytes.NewReader(blob)))
		descs = append(descs, d)
	}
	root, err := oras.PackManifest(ctx, store, oras.PackManifestVersion1_1, "application/vnd.ichor.test", oras.PackManifestOptions{Layers: descs})
	require.NoError(t, err)
	if index {
		raw, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{root}})
		require.NoError(t, err)
		root = content.NewDescriptorFromBytes(ocispec.MediaTypeImageIndex, raw)
		require.NoError(t, store.Push(ctx, root, bytes.NewReader(raw)))
	}
	require.NoError(t, store.Tag(ctx, root, tag))
	repo, err := remote.NewRepository(host + "/" + repository)
	require.NoError(t, err)
	repo.PlainHTTP = true
	_, err = oras.Copy(ctx, store, tag, repo, tag, oras.DefaultCopyOptions)
	require.NoError(t, err)
}

// pushNested pushes, as the tag, an image manifest whose one layer has the
// media type of a manifest (nested): an artifact manifest listing blobs, or
// an image manifest of layers. The nested manifest and its blobs are put in
// the registry directly, the nested one both as a blob and as a manifest,
// so that OPA's downloader would find it whichever endpoint it asks.
func pushNested(t *testing.T, host, repository, tag, nested string) {
	t.Helper()
	ctx := context.Background()
	repo, err := remote.NewRepository(host + "/" + repository)
	require.NoError(t, err)
	repo.PlainHTTP = true
	var blobs []ocispec.Descriptor
	for range 3 {
		blob := make([]byte, 64<<10)
		_, _ = rand.Read(blob)
		d := content.NewDescriptorFromBytes("application/octet-stream", blob)
		require.NoError(t, repo.Blobs().Push(ctx, d, bytes.NewReader(blob)))
		blobs = append(blobs, d)
	}
	var raw []byte
	if nested == ocispec.MediaTypeImageManifest {
		config := ocispec.DescriptorEmptyJSON
		require.NoError(t, repo.Blobs().Push(ctx, config, bytes.NewReader(config.Data)))
		raw, err = json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: nested, Config: config, Layers: blobs})
	} else {
		raw, err = json.Marshal(map[string]any{"mediaType": nested, "artifactType": "application/vnd.ichor.test", "blobs": blobs})
	}
	require.NoError(t, err)
	inner := content.NewDescriptorFromBytes(nested, raw)
	require.NoError(t, repo.Blobs().Push(ctx, ocispec.Descriptor{MediaType: "application/octet-stream", Digest: inner.Digest, Size: inner.Size}, bytes.NewReader(raw)))
	if nested == ocispec.MediaTypeImageManifest {
		require.NoError(t, repo.Manifests().Push(ctx, inner, bytes.NewReader(raw)))
	}
	config := ocispec.DescriptorEmptyJSON
	require.NoError(t, repo.Blobs().Push(ctx, config, bytes.NewReader(config.Data)))
	root, err := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: config, Layers: []ocispec.Descriptor{inner}})
	require.NoError(t, err)
	require.NoError(t, repo.Manifests().PushReference(ctx, content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, root), bytes.NewReader(root), tag))
}

// hostileTag is the tag ichor/policy:stable of the registry at host: a
// bundle served is pushed as it; nil pushes what *hostile pushes, with the
// count of blob fetches set back to zero first.
func hostileTag(t *testing.T, host string, blobGets *atomic.Int64, hostile *func()) source {
	return source{ref: bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable", serve: func(data []byte) {
		if data == nil {
			blobGets.Store(0)
			(*hostile)()
			return
		}
		pushRaw(t, host, "ichor/policy", "stable", data)
	}}
}

// The reproduced attack of the review's F2: whoever may move the tag points
// it at a manifest of 40 layers (or at an index), and OPA's downloader
// would copy every blob into its store on disk, each within the limits,
// their number without bound. The manifest is refused before any blob is
// fetched, the refusal is counted, the last good bundle keeps deciding.
func TestAnOCITagOfMoreThanABundleIsRefusedBeforeABlobIsFetched(t *testing.T) {
	s := newSigner(t)
	var blobGets atomic.Int64
	registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			blobGets.Add(1)
		}
		registry.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var hostile func()
	src := hostileTag(t, strings.TrimPrefix(srv.URL, "http://"), &blobGets, &hostile)
	good, e := startOnGood(t, src, s)

	for _, tc := range []struct {
		name, want   string
		layers, size int
		index        bool
		// nested: the tag's one layer is a manifest of this media type.
		nested string
	}{
		{name: "40 layers", want: "40 layers, more than the 4 a bundle may have", layers: 40, size: 64 << 10},
		{name: "layers beyond the compressed limit", want: "its blobs declare more than", layers: 3, size: 1 << 20},
		{name: "an index", want: "not an index", layers: 1, size: 1 << 10, index: true},
		// A layer is followed by its media type as the root is (the
		// hostile review of 2026-12-05): an artifact manifest is fetched
		// from /blobs/, where no manifest check sees it.
		{name: "a layer that is an artifact manifest", want: "a layer or config of media type application/vnd.oci.artifact.manifest.v1+json", nested: "application/vnd.oci.artifact.manifest.v1+json"},
		{name: "a layer that is an image manifest", want: "a layer or config of media type application/vnd.oci.image.manifest.v1+json", nested: ocispec.MediaTypeImageManifest},
	} {
		host := strings.TrimPrefix(srv.URL, "http://")
		hostile = func() { pushGraph(t, host, "ichor/policy", "stable", tc.layers, tc.size, tc.index) }
		if tc.nested != "" {
			hostile = func() { pushNested(t, host, "ichor/policy", "stable", tc.nested) }
		}
		e.refused(t, src, nil, tc.want, good)
		t.Logf("%s: %v", tc.name, e.st.last())
		assert.Zero(t, blobGets.Load(), "%s: no blob is fetched", tc.name)
	}
}

// A registry (or whoever answers for it) that redirects the tag's manifest
// to a path of its choice does not take it past the checks: a request is
// known by the first of its chain, not by the path of the last hop.
func TestAManifestRedirectedElsewhereIsCheckedAllTheSame(t *testing.T) {
	s := newSigner(t)
	var blobGets, redirected atomic.Int64
	registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/"):
			blobGets.Add(1)
		case r.Method != http.MethodPut && strings.Contains(r.URL.Path, "/manifests/"):
			redirected.Add(1)
			http.Redirect(w, r, "/cdn"+strings.Replace(r.URL.Path, "/manifests/", "/m/", 1), http.StatusTemporaryRedirect) //nolint:gosec // G710: the test registry redirects its own paths
			return
		case strings.HasPrefix(r.URL.Path, "/cdn/"):
			r.URL.Path = strings.Replace(strings.TrimPrefix(r.URL.Path, "/cdn"), "/m/", "/manifests/", 1)
		}
		registry.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var hostile func()
	src := hostileTag(t, strings.TrimPrefix(srv.URL, "http://"), &blobGets, &hostile)
	good, e := startOnGood(t, src, s)
	require.Positive(t, redirected.Load(), "the good bundle's manifest came through the redirect")

	for _, tc := range []struct {
		name, want string
		index      bool
		layers     int
	}{
		{name: "40 layers", want: "40 layers, more than the 4 a bundle may have", layers: 40},
		{name: "an index", want: "not an index", layers: 1, index: true},
	} {
		host := strings.TrimPrefix(srv.URL, "http://")
		hostile = func() { pushGraph(t, host, "ichor/policy", "stable", tc.layers, 1<<10, tc.index) }
		e.refused(t, src, nil, tc.want, good)
		assert.Zero(t, blobGets.Load(), "%s: no blob is fetched", tc.name)
	}
}

// A registry (or whoever answers a plain-http one) that answers the tag's
// HEAD with a manifest's media type written otherwise (a parameter, other
// capitals) does not take the manifest past the checks: OPA's downloader
// keeps the header as sent and, matching it exactly, fetched the root from
// /blobs/, where no manifest check runs, 2 MiB of it decoded at each poll
// (review 235 F1). The type is handed on as a bundle's, so the root is
// fetched and checked as a manifest, and a good bundle served so is pulled.
func TestAManifestTypeWrittenOtherwiseIsCheckedAsAManifest(t *testing.T) {
	for _, written := range []string{"application/vnd.oci.image.manifest.v1+json; charset=utf-8", "Application/VND.OCI.IMAGE.MANIFEST.V1+JSON"} {
		t.Run(written, func(t *testing.T) {
			s := newSigner(t)
			var blobGets atomic.Int64
			registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/"):
					blobGets.Add(1)
				case r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/manifests/"):
					registry.ServeHTTP(retyped{w, written}, r)
					return
				}
				registry.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			var hostile func()
			host := strings.TrimPrefix(srv.URL, "http://")
			src := hostileTag(t, host, &blobGets, &hostile)
			good, e := startOnGood(t, src, s)

			hostile = func() { pushGraph(t, host, "ichor/policy", "stable", 40, 1<<10, false) }
			e.refused(t, src, nil, "40 layers, more than the 4 a bundle may have", good)
			assert.Zero(t, blobGets.Load(), "no blob is fetched")
		})
	}
}

// retyped answers an image manifest's media type as written.
type retyped struct {
	http.ResponseWriter
	written string
}

func (w retyped) WriteHeader(code int) {
	if w.Header().Get("Content-Type") == ocispec.MediaTypeImageManifest {
		w.Header().Set("Content-Type", w.written)
	}
	w.ResponseWriter.WriteHeader(code)
}

// A bundle whose revision holds a parenthesis (or a control character) is
// refused at activation from every kind of source, the last good bundle
// keeps deciding: the revision is written into every verdict's condition,
// whose tail tells Ichor's verdicts from a person's (review 18).
func TestABundleWithARevisionTheTailCannotHoldIsRefused(t *testing.T) {
	s := newSigner(t)
	// And one without a revision (opa build's default), which decided
	// under the name of the bundle before it, whose verdicts the approvers
	// kept (review 162).
	for _, revision := range []string{"v1 (decision 0b5c6f1e-8a39-4a53-9d7e-0c7f7f9a1b2c)", "v1)", "v1\x1b[2J", ""} {
		odd := policyWithProbe(t, "package ichor.probe\n\nx := true\n")
		odd.Manifest.Revision = revision
		bundles.SetEpoch(odd, bundles.Floor())
		require.NoError(t, bundles.Sign(odd, s.private, "RS256", "ichor"))
		data, err := bundles.Bytes(odd)
		require.NoError(t, err)
		for name, newSource := range sources(t) {
			t.Run(fmt.Sprintf("%s/%q", name, revision), func(t *testing.T) {
				src := newSource(t)
				good, e := startOnGood(t, src, s)
				e.refused(t, src, data, engine.ErrBundleRevision.Error(), good)
			})
		}
	}
}

// A bundle whose METADATA declares labels would have OPA v1.22.4 write one
// shared tracker from every concurrent decision (ErrBundleLabels): from
// every kind of source it is refused at activation and the last good bundle
// keeps deciding, and a start on one fails saying why.
func TestABundleWithMetadataLabelsIsRefused(t *testing.T) {
	s := newSigner(t)
	labelled := policyWithProbe(t, "# METADATA\n# title: probe\n# labels:\n#   team: platform\npackage ichor.probe\n\nx := true\n")
	bundles.SetEpoch(labelled, bundles.Floor())
	require.NoError(t, bundles.Sign(labelled, s.private, "RS256", "ichor"))
	labelledData, err := bundles.Bytes(labelled)
	require.NoError(t, err)
	for name, newSource := range sources(t) {
		t.Run(name, func(t *testing.T) {
			src := newSource(t)
			good, e := startOnGood(t, src, s)
			e.refused(t, src, labelledData, engine.ErrBundleLabels.Error(), good)
			assert.Contains(t, e.st.last().Error(), "probe/probe.rego, line 1", "the module and the line are named")
		})
	}

	// A start on one: a file is read at once, so the start fails for it
	// within a short start timeout.
	src := sources(t)["file"](t)
	src.serve(labelledData)
	_, err = startWithin(t, src, s, nil, 10*time.Second)
	require.ErrorContains(t, err, engine.ErrBundleLabels.Error())

	// A module in Rego v0, as the manifest may ask for one: read as v1 it
	// did not parse, and its labels got through (review 178).
	v0 := policyWithProbe(t, "package ichor.probe\n\nx := true\n")
	for i := range v0.Modules {
		if strings.HasSuffix(v0.Modules[i].Path, "probe/probe.rego") {
			v0.Modules[i].Raw = []byte("# METADATA\n# title: probe\n# labels:\n#   team: platform\npackage ichor.probe\n\nx { true }\n")
			v0.Manifest.FileRegoVersions = map[string]int{"*probe/probe.rego": 0}
		}
	}
	require.NotNil(t, v0.Manifest.FileRegoVersions, "no probe module")
	bundles.SetEpoch(v0, bundles.Floor())
	require.NoError(t, bundles.Sign(v0, s.private, "RS256", "ichor"))
	v0Data, err := bundles.Bytes(v0)
	require.NoError(t, err)
	v0Src := sources(t)["file"](t)
	good, e := startOnGood(t, v0Src, s)
	e.refused(t, v0Src, v0Data, engine.ErrBundleLabels.Error(), good)

	// The key spelled with a YAML escape, which OPA's METADATA reads as
	// labels: a look for the word "labels" let it through (review 179).
	escaped := policyWithProbe(t, "# METADATA\n# title: probe\n# \"\\x6cabels\": {team: platform}\npackage ichor.probe\n\nx := true\n")
	bundles.SetEpoch(escaped, bundles.Floor())
	require.NoError(t, bundles.Sign(escaped, s.private, "RS256", "ichor"))
	escapedData, err := bundles.Bytes(escaped)
	require.NoError(t, err)
	e.refused(t, v0Src, escapedData, engine.ErrBundleLabels.Error(), good)
}

// A signed bundle whose rules reach beyond their input, or whose manifest
// claims paths beyond Ichor's, is refused at activation from every kind of
// source, the last good bundle keeps deciding: a mask calling http.send
// would send every decision out, and a bundle claiming every path could
// define the decision log's drop rule, taking entries out of the log
// without a trace (review 227 F1, F2).
func TestABundleReachingBeyondItsInputOrItsRootsIsRefused(t *testing.T) {
	s := newSigner(t)
	called := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called <- struct{}{} }))
	t.Cleanup(srv.Close)
	signed := func(b *bundle.Bundle) []byte {
		bundles.SetEpoch(b, bundles.Floor())
		require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
		data, err := bundles.Bytes(b)
		require.NoError(t, err)
		return data
	}
	sending := signed(policyWithProbe(t, "package ichor.probe\n\nx := http.send({\"method\": \"GET\", \"url\": \""+srv.URL+"\"}).status_code\n"))
	everyPath := policyWithProbe(t, "package ichor.probe\n\nx := true\n")
	all := []string{""}
	everyPath.Manifest.Roots = &all
	dropping := signed(everyPath)
	for name, newSource := range sources(t) {
		t.Run(name, func(t *testing.T) {
			src := newSource(t)
			good, e := startOnGood(t, src, s)
			e.refused(t, src, sending, "probe/probe.rego calls http.send", good)
			e.refused(t, src, dropping, engine.ErrBundleRoots.Error(), good)
		})
	}
	select {
	case <-called:
		t.Fatal("a rule reached the network")
	default:
	}
}

// What a module's own check misses, the check of the compiled bundle as
// its activation commits refuses: with the first taken away, a bundle that
// calls http.send is refused all the same, from every source and at the
// start, the call named where it is, and the last good bundle kept. A form
// the walk of each module as written does not see (as a rule head's
// reference was not: review 228 N1) is one the compiler makes a call of.
func TestTheCompiledBundleIsCheckedBehindEachModule(t *testing.T) {
	engine.WithoutModuleCheck(t)
	s := newSigner(t)
	const probe = "package ichor.probe\n\nx := http.send({\"method\": \"GET\", \"url\": \"https://example.com\"}).status_code\n"
	sending := policyWithProbe(t, probe)
	bundles.SetEpoch(sending, bundles.Floor())
	require.NoError(t, bundles.Sign(sending, s.private, "RS256", "ichor"))
	data, err := bundles.Bytes(sending)
	require.NoError(t, err)
	const named = "the compiled bundle calls http.send (/ichor/probe/probe.rego:3)"
	for name, newSource := range sources(t) {
		t.Run(name, func(t *testing.T) {
			src := newSource(t)
			good, e := startOnGood(t, src, s)
			e.refused(t, src, data, named, good)
		})
	}
	t.Run("at the start", func(t *testing.T) {
		_, err := engine.New(context.Background(), engine.Options{Bundle: policyWithProbe(t, probe), DecisionLog: io.Discard, Log: io.Discard, StartTimeout: 10 * time.Second})
		require.ErrorContains(t, err, engine.ErrBundleBuiltins.Error())
		assert.ErrorContains(t, err, named)
	})
}

// A registry that sends a blob's request on to its storage with a redirect
// signed in the query (as Docker Hub's and GHCR's do) has its signature
// repeated nowhere when that request fails: Go's HTTP client names the
// redirect's URL in its error, which reached OPA's log, the refusal and the
// manager's log whole (review 227 F4).
func TestARedirectsSignedQueryIsNotRepeatedWhenItFails(t *testing.T) {
	s := newSigner(t)
	const signature = "sig=5e3c7e7-signed-for-minutes"
	var failing atomic.Bool
	var cut atomic.Int64
	registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/storage/"):
			// The storage hangs up: the client's error names the URL.
			cut.Add(1)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		case failing.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/"):
			http.Redirect(w, r, "http://"+r.Host+"/storage"+r.URL.Path+"?"+signature, http.StatusTemporaryRedirect) //nolint:gosec // G710: the test registry redirects to itself
			return
		}
		registry.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	src := source{ref: bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable", serve: func(data []byte) { pushRaw(t, host, "ichor/policy", "stable", data) }}
	_, data := signedEpoch(t, false, bundles.Floor(), s)
	src.serve(data)
	opaLog := &harness.DecisionLog{}
	st := &statuses{}
	e, err := engine.New(context.Background(), engine.Options{
		Source: src.ref, PollInterval: 200 * time.Millisecond, StartTimeout: 30 * time.Second,
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, AllowInsecureHTTP: true,
		DecisionLog: io.Discard, Log: opaLog, OnBundleStatus: st.add,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })

	failing.Store(true)
	_, newer := signedEpoch(t, true, bundles.Floor(), s)
	src.serve(newer)
	require.Eventually(t, func() bool {
		return cut.Load() > 0 && st.last() != nil && strings.Contains(st.last().Error(), "/storage/")
	}, 30*time.Second, 20*time.Millisecond, "the storage's failure was not reported; last: %v; cut %d; log: %s", st.last(), cut.Load(), opaLog.String())

	for what, text := range map[string]string{"the refusal": st.last().Error(), "the engine's last error": e.LastError().Error(), "OPA's log": opaLog.String()} {
		assert.NotContains(t, text, signature, "%s repeats the redirect's signature", what)
	}
	assert.Contains(t, st.last().Error(), "/storage/", "the URL is still named, without its query")
}

// blockingEpochs is the cluster's record of the highest epoch, whose raise to
// epoch blocked holds until released.
type blockingEpochs struct {
	fakeEpochs
	blocked  int64
	entered  chan struct{}
	enter    sync.Once
	released chan struct{}
	// inFlight counts the raises to the blocked epoch under way; alongside,
	// those begun while another was.
	inFlight, alongside atomic.Int32
}

func (b *blockingEpochs) Raise(ctx context.Context, epoch int64) error {
	if epoch == b.blocked {
		if b.inFlight.Add(1) > 1 {
			b.alongside.Add(1)
		}
		defer b.inFlight.Add(-1)
		// Raised again if the first try timed out.
		b.enter.Do(func() { close(b.entered) })
		select {
		case <-b.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return b.fakeEpochs.Raise(ctx, epoch)
}

// While a new bundle's epoch is being recorded in the cluster (a write of up
// to 10 s), Revision names the new bundle already: the approvers remember
// each verdict with the revision it was reached under, and a Revision that
// lagged the bundle deciding had them decide a request a second time under
// one bundle.
func TestTheRevisionNamesANewBundleWhileItsEpochIsRecorded(t *testing.T) {
	s := newSigner(t)
	src := sources(t)["file"](t)
	first, data := signedEpoch(t, false, bundles.Floor(), s)
	src.serve(data)
	epochs := &blockingEpochs{blocked: bundles.Floor() + 1, entered: make(chan struct{}), released: make(chan struct{})}
	e, err := start(t, src, s, epochs)
	require.NoError(t, err)
	t.Cleanup(func() {
		select {
		case <-epochs.released:
		default:
			close(epochs.released)
		}
	})
	require.Equal(t, first.Manifest.Revision, e.e.Revision())

	second, data := signedEpoch(t, true, bundles.Floor()+1, s)
	require.NotEqual(t, first.Manifest.Revision, second.Manifest.Revision)
	src.serve(data)
	select {
	case <-epochs.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the new bundle's epoch was never recorded")
	}
	assert.Equal(t, second.Manifest.Revision, e.e.Revision(), "the revision while the epoch is recorded")
	_, decidedUnder := forgedIPDecision(t, e.e)
	assert.Equal(t, second.Manifest.Revision, decidedUnder, "the bundle deciding meanwhile")
	// The refresh polls meanwhile (every 200 ms here) and reads the record
	// below the epoch in service: the activation's own raise is under way,
	// so it is no record lowered by hand to write again (review 179).
	assert.Never(t, func() bool { return epochs.alongside.Load() > 0 }, time.Second, 20*time.Millisecond,
		"the refresh took a record being raised for one lowered by hand")
	close(epochs.released)
	require.Eventually(t, func() bool { return epochs.get() == bundles.Floor()+1 }, 30*time.Second, 20*time.Millisecond)
}

// withEntry is the gzipped tarball data with the file name's content
// replaced, everything else (the signatures included) as it was.
func withEntry(t *testing.T, data []byte, name string, content []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	replaced := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		if hdr.Name == name {
			body, replaced = content, true
		}
		hdr.Size = int64(len(body))
		require.NoError(t, tw.WriteHeader(hdr))
		_, err = tw.Write(body)
		require.NoError(t, err)
	}
	require.True(t, replaced, "no %s in the bundle", name)
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	return buf.Bytes()
}

// Review of 2026-12-06: OPA reads a signed structured file (the manifest, a
// data.json) to check its digest before it compares it, and reads what is
// not JSON as YAML, whose aliases a megabyte expands to gigabytes: whoever
// may move the tag, serve the URL or edit the file killed every replica with
// a genuinely signed bundle's signatures and a manifest of aliases. And a
// key given twice is hashed as its last value but decoded into the
// manifest's metadata as both, so a signed manifest without an epoch took
// one the signature does not cover. Each is refused before OPA reads it,
// from every kind of source, and the bundle in service stays.
func TestAStructuredFileThatIsNotOneJSONDocumentIsRefusedBeforeOPAReadsIt(t *testing.T) {
	s := newSigner(t)
	// 4,000 aliases of a 16 KiB string: 62 MiB once expanded.
	var yaml bytes.Buffer
	yaml.WriteString(`[&a "` + strings.Repeat("x", 16<<10) + `"`)
	for range 4000 {
		yaml.WriteString(", *a")
	}
	yaml.WriteString("]")
	for name, newSource := range sources(t) {
		t.Run(name, func(t *testing.T) {
			src := newSource(t)
			good, e := startOnGood(t, src, s)
			_, signed := signedEpoch(t, false, bundles.Floor()+1, s)

			grown := peakHeapGrowth(func() {
				e.refused(t, src, withEntry(t, signed, "/.manifest", yaml.Bytes()), `"/.manifest" is not one JSON document`, good)
			})
			t.Logf("%s: the heap grew by at most %d MiB while the aliases were refused", name, grown>>20)
			assert.Less(t, grown, uint64(32<<20), "the aliases were expanded")

			// The signed manifest, its metadata given twice: first with an
			// epoch the signature does not cover.
			noEpoch := policyBundle(t, false)
			delete(noEpoch.Manifest.Metadata, bundles.EpochKey)
			noEpoch.Manifest.Metadata["note"] = "signed without an epoch"
			require.NoError(t, bundles.Sign(noEpoch, s.private, "RS256", "ichor"))
			noEpochData, err := bundles.Bytes(noEpoch)
			require.NoError(t, err)
			manifest, err := json.Marshal(noEpoch.Manifest)
			require.NoError(t, err)
			forged := append([]byte(fmt.Sprintf(`{"metadata":{%q:%d},`, bundles.EpochKey, bundles.Floor()+100)), manifest[1:]...)
			e.refused(t, src, withEntry(t, noEpochData, "/.manifest", forged), `has the key "metadata" twice in one object`, good)
		})
	}
}

// A registry (or whoever answers for it) cannot send the manager to the
// node's instance metadata, or anywhere in the networks netguard denies by
// default, by a blob's redirect: the request is refused before it is sent,
// the refusal says which network, and the last good bundle keeps deciding
// (review 246, F2). A token service its 401 names there is refused too, by
// ORAS's own check of the realm (its address, or its name's as resolved
// then) before the transport's (every hop's address as it is dialled).
func TestARegistryCannotSendTheManagerIntoADeniedNetwork(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hostile func(w http.ResponseWriter, r *http.Request) bool
		want    string
	}{
		{name: "a blob's redirect", want: "address 169.254.169.254 is in 169.254.0.0/16, a network the manager does not connect to: nothing was sent to it",
			hostile: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
					return false
				}
				http.Redirect(w, r, "http://169.254.169.254/storage"+r.URL.Path, http.StatusTemporaryRedirect) //nolint:gosec // G710: the hostile registry's redirect is the test
				return true
			}},
		{name: "a token service", want: `bearer realm host "169.254.169.254" is 169.254.169.254, in blocked prefix 169.254.0.0/16`,
			hostile: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Header.Get("Authorization") != "" {
					return false
				}
				w.Header().Set("Www-Authenticate", `Bearer realm="http://169.254.169.254/token",service="registry",scope="repository:ichor/policy:pull"`)
				w.WriteHeader(http.StatusUnauthorized)
				return true
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSigner(t)
			var turned atomic.Bool
			registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if turned.Load() && tc.hostile(w, r) {
					return
				}
				registry.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			host := strings.TrimPrefix(srv.URL, "http://")
			src := source{ref: bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable", serve: func(data []byte) { pushRaw(t, host, "ichor/policy", "stable", data) }}
			good, e := startOnGood(t, src, s)

			// Pushed before the registry turns: the test's own push would
			// meet the 401.
			_, newer := signedEpoch(t, true, bundles.Floor(), s)
			src.serve(newer)
			turned.Store(true)
			require.Eventually(t, func() bool {
				last := e.e.LastError()
				return last != nil && strings.Contains(last.Error(), tc.want)
			}, 30*time.Second, 20*time.Millisecond, "not refused for %q; last: %v", tc.want, e.e.LastError())
			_, rev := forgedIPDecision(t, e.e)
			assert.Equal(t, good.Manifest.Revision, rev, "the last good bundle keeps deciding")
		})
	}
}
