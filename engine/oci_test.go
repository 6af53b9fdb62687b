package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/open-policy-agent/opa/v1/bundle"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/engine"
)

// anonymous logs in to the in-process registry, which asks for nothing.
func anonymous(context.Context, string) (auth.Credential, error) { return auth.EmptyCredential, nil }

// push signs b with s and pushes it to ref.
func push(t *testing.T, ref string, b *bundle.Bundle, s signer) {
	t.Helper()
	require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	parsed, err := bundles.ParseOCIRef(ref)
	require.NoError(t, err)
	// Forced: these tests move the tag as they need to, epoch or not (the
	// refusal of an epoch not above the tag's is tested in bundles).
	_, err = bundles.PushOCI(context.Background(), parsed, data, bundles.PushOptions{Credential: anonymous, Force: true})
	require.NoError(t, err)
}

// pushUnchecked pushes a bundle in OPA's layout as any OCI tool would,
// without the checks of ichor bundle push (which refuses what a manager
// would refuse), as someone who may push could.
func pushUnchecked(t *testing.T, host, repository, tag string, b *bundle.Bundle) {
	t.Helper()
	ctx := context.Background()
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
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

// The registry is go-containerregistry's, in process; OPA pulls from it with
// its own OCI downloader, as it would from any registry.
func TestBundleFromAnOCIRegistry(t *testing.T) {
	s, stranger := newSigner(t), newSigner(t)
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable"
	good := policyBundle(t, false)
	push(t, ref, good, s)
	keys := []engine.VerificationKey{{ID: "ichor", PEM: s.public}}

	for name, tc := range map[string]struct {
		opts engine.Options
		want string
	}{
		"unsigned source":      {engine.Options{Source: ref, AllowInsecureHTTP: true}, "give the key its bundles are signed with"},
		"plain http unallowed": {engine.Options{Source: ref, VerificationKeys: keys}, "is plain http"},
		"no tag":               {engine.Options{Source: bundles.OCIPlainHTTPScheme + host + "/ichor/policy", VerificationKeys: keys, AllowInsecureHTTP: true}, "names no tag or digest"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.opts.DecisionLog, tc.opts.Log = io.Discard, io.Discard
			_, err := engine.New(context.Background(), tc.opts)
			require.ErrorContains(t, err, tc.want)
		})
	}

	var st statuses
	e, err := engine.New(context.Background(), engine.Options{
		Source: ref, PollInterval: time.Second, VerificationKeys: keys, AllowInsecureHTTP: true,
		DecisionLog: io.Discard, Log: io.Discard, OnBundleStatus: st.add,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	action, rev := forgedIPDecision(t, e)
	require.Equal(t, "deny", action)
	require.Equal(t, good.Manifest.Revision, rev)

	// The tag moved to a bundle signed by another key: refused, and the
	// last good bundle keeps deciding.
	push(t, ref, policyBundle(t, true), stranger)
	require.Eventually(t, func() bool { return st.refusals() > 0 }, 15*time.Second, 50*time.Millisecond)
	assert.ErrorContains(t, st.last(), "verification")
	action, rev = forgedIPDecision(t, e)
	assert.Equal(t, "deny", action)
	assert.Equal(t, good.Manifest.Revision, rev)

	// A bundle signed with the operator's key is taken up at the next poll.
	loosened := policyBundle(t, true)
	push(t, ref, loosened, s)
	require.Eventually(t, func() bool {
		action, rev := forgedIPDecision(t, e)
		return action == "approve" && rev == loosened.Manifest.Revision
	}, 15*time.Second, 50*time.Millisecond)

	// A bundle with a file beyond MaxBundleFileBytes, even signed with the
	// operator's key, is refused before it is read whole: a gzip bomb from
	// whoever may push costs no replica its memory.
	bomb := policyBundle(t, false)
	bomb.Data["ichor"].(map[string]any)["padding"] = strings.Repeat("x", engine.MaxBundleFileBytes)
	require.NoError(t, bundles.Sign(bomb, s.private, "RS256", "ichor"))
	before := st.refusals()
	pushUnchecked(t, host, "ichor/policy", "stable", bomb)
	require.Eventually(t, func() bool { return st.refusals() > before }, 15*time.Second, 50*time.Millisecond)
	assert.ErrorContains(t, st.last(), "size")
	_, rev = forgedIPDecision(t, e)
	assert.Equal(t, loosened.Manifest.Revision, rev)
	push(t, ref, loosened, s)

	// The registry goes away: each failed poll is reported, and the bundle
	// in service stays.
	before = st.refusals()
	srv.Close()
	require.Eventually(t, func() bool { return st.refusals() > before }, 15*time.Second, 50*time.Millisecond)
	assert.ErrorContains(t, st.last(), host)
	action, rev = forgedIPDecision(t, e)
	assert.Equal(t, "approve", action)
	assert.Equal(t, loosened.Manifest.Revision, rev)
}

func TestAnUnreachableRegistryFailsTheStartWithItsReason(t *testing.T) {
	s := newSigner(t)
	// A port that was just free: nothing answers there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	start := time.Now()
	_, err = engine.New(context.Background(), engine.Options{
		Source: bundles.OCIPlainHTTPScheme + addr + "/ichor/policy:stable", AllowInsecureHTTP: true,
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}},
		StartTimeout:     2 * time.Second, DecisionLog: io.Discard, Log: io.Discard,
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was not activated within 2s")
	assert.Contains(t, err.Error(), addr, "the error names the registry")
	assert.Less(t, time.Since(start), 30*time.Second)
}

// duBytes is the size of the files under dir.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	require.NoError(t, filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			total += info.Size()
		}
		return err
	}))
	return total
}

// OPA's OCI downloader keeps every revision it ever pulled in a store on
// disk. A tag that keeps moving (to bundles nobody signed: whoever may push
// to the repository) must not fill the manager's /tmp, a 64 MiB emptyDir in
// the chart: the store keeps the revision tagged and the one being pulled.
// (Before: 20 pushes of a 682 KiB bundle left 10.3 MiB; after, 1.1 MiB.)
func TestAMovingTagDoesNotFillTheDisk(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	s, stranger := newSigner(t), newSigner(t)
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable"
	good := policyBundle(t, false)
	push(t, ref, good, s)
	// A store a killed process left in the same /tmp (an emptyDir outlives
	// the container): its lock is free, and it goes as the engine makes its
	// own (review 235 F2).
	killed := filepath.Join(tmp, "ichor-bundle-killed")
	require.NoError(t, os.MkdirAll(filepath.Join(killed, "oci", "blobs"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(killed, "oci", "blobs", "x"), make([]byte, 1<<20), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(killed, ".held"), nil, 0o600))
	hourAgo := time.Now().Add(-time.Hour)
	require.NoError(t, os.Chtimes(filepath.Join(killed, ".held"), hourAgo, hourAgo))
	var st statuses
	e, err := engine.New(context.Background(), engine.Options{
		Source: ref, PollInterval: time.Second, VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}},
		AllowInsecureHTTP: true, DecisionLog: io.Discard, Log: io.Discard, OnBundleStatus: st.add,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	assert.NoDirExists(t, killed, "a store a killed process left")

	const pushes, padding = 20, 512 << 10
	for i := range pushes {
		b := policyBundle(t, true)
		random := make([]byte, padding)
		_, _ = rand.Read(random)
		// Incompressible: the bundle is as large on disk as on the wire.
		b.Data["ichor"].(map[string]any)["padding"] = base64.StdEncoding.EncodeToString(random)
		before := st.refusals()
		push(t, ref, b, stranger)
		require.Eventually(t, func() bool { return st.refusals() > before }, 15*time.Second, 20*time.Millisecond, "push %d refused", i)
	}
	used := duBytes(t, tmp)
	t.Logf("%d pushes of a %d KiB bundle: %d KiB on disk", pushes, padding*4/3>>10, used>>10)
	assert.Less(t, used, int64(4*padding*4/3), "at most the revision tagged and the one being pulled, with room")
	_, rev := forgedIPDecision(t, e)
	assert.Equal(t, good.Manifest.Revision, rev, "the bundle in service stays")

	e.Stop(context.Background())
	assert.Zero(t, duBytes(t, tmp), "the store goes with the engine")
}

// A source pinned to a manifest's digest names a bundle that cannot change:
// it is fetched once, not again at every poll (review 178: OPA's store tags
// no name for a pull by digest, so the pruning before each poll removed its
// blobs, and every poll fetched the whole bundle again, up to 2 MiB a poll a
// replica against the registry's rate limits).
func TestADigestPinnedSourceIsFetchedOnce(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	s := newSigner(t)
	registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	var manifestLooks, blobGets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.Contains(r.URL.Path, "/manifests/"):
			manifestLooks.Add(1)
		case strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet:
			blobGets.Add(1)
		}
		registry.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	b := policyBundle(t, false)
	require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	tagged, err := bundles.ParseOCIRef(bundles.OCIPlainHTTPScheme + host + "/ichor/policy:stable")
	require.NoError(t, err)
	desc, err := bundles.PushOCI(context.Background(), tagged, data, bundles.PushOptions{Credential: anonymous, Force: true})
	require.NoError(t, err)

	e, err := engine.New(context.Background(), engine.Options{
		Source: bundles.OCIPlainHTTPScheme + host + "/ichor/policy@" + desc.Digest.String(), PollInterval: 200 * time.Millisecond,
		VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, AllowInsecureHTTP: true, DecisionLog: io.Discard, Log: io.Discard,
	})
	require.NoError(t, err)
	t.Cleanup(func() { e.Stop(context.Background()) })
	_, rev := forgedIPDecision(t, e)
	require.Equal(t, b.Manifest.Revision, rev)
	fetched := blobGets.Load()
	require.NotZero(t, fetched)
	looks := manifestLooks.Load()
	require.Eventually(t, func() bool { return manifestLooks.Load() >= looks+6 }, 30*time.Second, 20*time.Millisecond, "the source was not polled")
	assert.Equal(t, fetched, blobGets.Load(), "a bundle pinned by digest was fetched again")
}

// A source pinned to a digest activates that manifest or none (review 181):
// OPA pulls the manifest the registry's answer names (Docker-Content-Digest)
// and never compares it with the digest asked for, so a registry, or anyone
// on the path of a plain-http one, answering the pinned request with another
// signed bundle's manifest had that bundle activated.
func TestAPinnedSourceActivatesOnlyItsManifest(t *testing.T) {
	for _, redirect := range []bool{false, true} {
		t.Run(map[bool]string{false: "answered as the other", true: "redirected to the other"}[redirect], func(t *testing.T) {
			t.Setenv("TMPDIR", t.TempDir())
			s := newSigner(t)
			registry := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
			var swap atomic.Pointer[[2]string]
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if p := swap.Load(); p != nil && strings.Contains(r.URL.Path, "/manifests/"+p[0]) {
					path := strings.Replace(r.URL.Path, "/manifests/"+p[0], "/manifests/"+p[1], 1)
					if redirect {
						// The pin read from the redirect's path saw the
						// other manifest answer as itself (review 182).
						http.Redirect(w, r, path, http.StatusTemporaryRedirect) //nolint:gosec // the redirect is the hostile registry this test plays
						return
					}
					r.URL.Path = path
				}
				registry.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			host := strings.TrimPrefix(srv.URL, "http://")
			pushed := func(tag string, loosen bool) string {
				b := policyBundle(t, loosen)
				require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
				data, err := bundles.Bytes(b)
				require.NoError(t, err)
				ref, err := bundles.ParseOCIRef(bundles.OCIPlainHTTPScheme + host + "/ichor/policy:" + tag)
				require.NoError(t, err)
				desc, err := bundles.PushOCI(context.Background(), ref, data, bundles.PushOptions{Credential: anonymous, Force: true})
				require.NoError(t, err)
				return desc.Digest.String()
			}
			pinned, other := pushed("one", false), pushed("two", true)
			swap.Store(&[2]string{pinned, other})

			_, err := engine.New(context.Background(), engine.Options{
				Source: bundles.OCIPlainHTTPScheme + host + "/ichor/policy@" + pinned, AllowInsecureHTTP: true,
				VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}},
				StartTimeout:     5 * time.Second, DecisionLog: io.Discard, Log: io.Discard,
			})
			require.Error(t, err, "another manifest than the one pinned was activated")
			assert.Contains(t, err.Error(), "the source is pinned to manifest "+pinned)
		})
	}
}

// A repository whose name holds a segment "manifests" is pulled, by tag and
// by digest: before, every request whose path held "/manifests/" was taken
// for a manifest's, its blobs were refused as no manifest, and the source
// for good (review 197B F2).
func TestARepositoryNamedWithManifestsIsPulled(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	s := newSigner(t)
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	b := policyBundle(t, false)
	require.NoError(t, bundles.Sign(b, s.private, "RS256", "ichor"))
	data, err := bundles.Bytes(b)
	require.NoError(t, err)
	tagged := bundles.OCIPlainHTTPScheme + host + "/team/manifests/policy:stable"
	parsed, err := bundles.ParseOCIRef(tagged)
	require.NoError(t, err)
	desc, err := bundles.PushOCI(context.Background(), parsed, data, bundles.PushOptions{Credential: anonymous, Force: true})
	require.NoError(t, err)

	for name, source := range map[string]string{
		"by tag":    tagged,
		"by digest": bundles.OCIPlainHTTPScheme + host + "/team/manifests/policy@" + desc.Digest.String(),
	} {
		t.Run(name, func(t *testing.T) {
			e, err := engine.New(context.Background(), engine.Options{
				Source: source, VerificationKeys: []engine.VerificationKey{{ID: "ichor", PEM: s.public}}, AllowInsecureHTTP: true,
				DecisionLog: io.Discard, Log: io.Discard,
			})
			require.NoError(t, err)
			t.Cleanup(func() { e.Stop(context.Background()) })
			_, rev := forgedIPDecision(t, e)
			assert.Equal(t, b.Manifest.Revision, rev)
		})
	}
}
