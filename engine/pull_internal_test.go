package engine

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// answers is a registry that answers every request with status and size
// bytes, counting what it was asked.
type answers struct {
	status int
	size   int
	asked  int
}

func (a *answers) RoundTrip(req *http.Request) (*http.Response, error) {
	a.asked++
	return &http.Response{StatusCode: a.status, Body: io.NopCloser(bytes.NewReader(make([]byte, a.size))), Request: req, Header: http.Header{"Content-Type": {"application/vnd.oci.image.manifest.v1+json"}}}, nil
}

func do(t *testing.T, tr http.RoundTripper, method, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(method, "http://registry.test/v2/ichor/policy/"+path, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	return resp, err
}

// One pull fetches at most a bundle's answers and bytes, whatever a
// registry serves (oras follows what it is given): the checks of a
// manifest bound what it names, this bounds what is fetched. Each pull,
// which starts with the HEAD of its tag, has the whole budget again.
func TestAPullFetchesNoMoreThanABundle(t *testing.T) {
	t.Run("answers", func(t *testing.T) {
		reg := &answers{status: http.StatusOK, size: 1 << 10}
		tr := &limitsTransport{base: reg, limits: bundles.DefaultLimits, oci: true, plainHTTP: true}
		for range 2 {
			_, err := do(t, tr, http.MethodHead, "manifests/stable")
			require.NoError(t, err)
			for i := range maxPullResponses {
				_, err := do(t, tr, http.MethodGet, "blobs/sha256:"+strings.Repeat("a", i+1))
				require.NoError(t, err, "answer %d of a pull", i+1)
			}
			_, err = do(t, tr, http.MethodGet, "blobs/sha256:b")
			require.ErrorIs(t, err, ErrBundleManifest)
			assert.Contains(t, err.Error(), "answers in one pull")
		}
	})
	t.Run("bytes", func(t *testing.T) {
		limits := bundles.DefaultLimits
		reg := &answers{status: http.StatusOK, size: int(limits.CompressedBytes)}
		tr := &limitsTransport{base: reg, limits: limits, oci: true, plainHTTP: true}
		_, err := do(t, tr, http.MethodHead, "manifests/stable")
		require.NoError(t, err)
		fetched := int64(0)
		for fetched+limits.CompressedBytes <= pullBudget(limits) {
			_, err := do(t, tr, http.MethodGet, "blobs/sha256:a")
			require.NoError(t, err)
			fetched += limits.CompressedBytes
		}
		_, err = do(t, tr, http.MethodGet, "blobs/sha256:a")
		require.ErrorIs(t, err, bundles.ErrBundleTooLarge)
		assert.Contains(t, err.Error(), "one pull fetched more than")
	})
	t.Run("not a registry", func(t *testing.T) {
		// A bundle served over http(s) is one answer a poll, each bounded
		// on its own: no pull's budget.
		reg := &answers{status: http.StatusOK, size: 1 << 10}
		tr := &limitsTransport{base: reg, limits: bundles.DefaultLimits, plainHTTP: true}
		for range 2 * maxPullResponses {
			_, err := do(t, tr, http.MethodGet, "bundle.tar.gz")
			require.NoError(t, err)
		}
	})
}

// An answer other than 200 is read no further than maxErrorBody: OPA reads
// such a body whole to log it.
func TestAnErrorAnswerIsReadNoFurtherThanItsBound(t *testing.T) {
	reg := &answers{status: http.StatusInternalServerError, size: 8 << 20}
	tr := &limitsTransport{base: reg, limits: bundles.DefaultLimits, oci: true, plainHTTP: true}
	resp, err := do(t, tr, http.MethodGet, "blobs/sha256:a")
	require.NoError(t, err, "the answer is OPA's to report")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Len(t, body, maxErrorBody)
}

// A server that sends a bundle's headers, then its body a byte a while,
// holds a request no longer than its timeout: OPA's client bounds the wait
// for the headers only, and a poll held for good would report nothing
// (review of 2026-12-06).
func TestAStalledBodyEndsTheRequestAtItsTimeout(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1048576")
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := w.Write([]byte{0x1f}); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-stop:
				return
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	tr := &limitsTransport{base: http.DefaultTransport, limits: bundles.DefaultLimits, plainHTTP: true, fetchTimeout: 300 * time.Millisecond}
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/bundle.tar.gz", nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not fetched within 300ms")
	case <-time.After(30 * time.Second):
		t.Fatal("the request outlived its timeout a hundredfold")
	}
}

// An answer handed on to OPA with its body (an error's, a HEAD's) keeps its
// request's context until the body is closed, and no longer.
func TestAnAnswersBodyIsReadableUntilClosed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(strings.Repeat("not here ", 1000)))
	}))
	t.Cleanup(srv.Close)
	tr := &limitsTransport{base: http.DefaultTransport, limits: bundles.DefaultLimits, plainHTTP: true}
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/bundle.tar.gz", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Len(t, body, 9000)
	require.NoError(t, resp.Body.Close())
}
