package reviewbounds_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/webhook/reviewbounds"
)

// served is a webhook server held to l, with handler at /review, on an
// httptest server of its mux.
func served(t *testing.T, l reviewbounds.Limits, handler http.HandlerFunc) string {
	t.Helper()
	if l.BodyDeadline == 0 {
		l.BodyDeadline = l.Deadline
	}
	inner := crwebhook.NewServer(crwebhook.Options{})
	srv := reviewbounds.Server(inner, l)
	srv.Register("/review", handler)
	unwrapped, ok := srv.(interface{ Unwrap() crwebhook.Server })
	require.True(t, ok)
	assert.Same(t, inner, unwrapped.Unwrap(), "webhookcerts finds the server under it")
	hs := httptest.NewServer(inner.WebhookMux())
	t.Cleanup(hs.Close)
	return hs.URL + "/review"
}

// post posts body to the test server's url.
func post(url string, body io.Reader) (*http.Response, error) {
	return http.Post(url, "application/json", body) //nolint:gosec // G107: the test's own server
}

// readBody answers how many bytes of the body it read, or why it could not.
func readBody(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprint(w, n)
}

// A body past the bound is refused: said so at once when its length is
// declared, cut where it passes it when it is not.
func TestABodyPastTheBoundIsNotRead(t *testing.T) {
	url := served(t, reviewbounds.Limits{MaxBody: 1 << 10, InFlight: 1, Waiting: 1, Deadline: 10 * time.Second}, readBody)
	resp, err := post(url, bytes.NewReader(make([]byte, 1<<10)))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "1024", string(body), "a body of the bound is read whole")

	resp, err = post(url, bytes.NewReader(make([]byte, 1<<10+1)))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	// Chunked: no length declared.
	resp, err = post(url, io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), strings.NewReader("")))
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Contains(t, string(body), "a review's body is at most 1024 bytes")
}

// A body sent a byte at a time (or never finished) is cut at its deadline,
// refused and counted, and its slot is free again for the next review:
// without it the handler waited as long as the sender liked, holding the
// slot (reviews 240 F2, 243 F1).
func TestABodySentSlowlyIsCutAtItsDeadline(t *testing.T) {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
	url := served(t, reviewbounds.Limits{MaxBody: 1 << 20, InFlight: 1, Waiting: 1, BodyDeadline: 500 * time.Millisecond, Deadline: 20 * time.Second, Refused: refused}, readBody)
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/review"), "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /review HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	answer, err := io.ReadAll(conn)
	require.NoError(t, err, "the connection was not closed by the server before the client's deadline")
	assert.Contains(t, string(answer), "400 Bad Request")
	assert.Contains(t, string(answer), "the review's body was not read whole within 500ms")
	assert.InDelta(t, 1, testutil.ToFloat64(refused.WithLabelValues(reviewbounds.ReasonUnread)), 0)

	// The one slot is free: the next review is answered.
	resp, err := post(url, strings.NewReader("{}"))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "2", string(body))
}

// Reviews past InFlight wait for a slot, and past Waiting as well are
// answered 429 at once: however many a sender opens, only InFlight are
// read and answered at a time.
func TestReviewsPastTheBoundWaitOrAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting int
		want    int
	}{
		{"none may wait", 0, http.StatusTooManyRequests},
		{"one may wait", 1, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			entered := make(chan struct{}, 10)
			url := served(t, reviewbounds.Limits{MaxBody: 1 << 10, InFlight: 2, Waiting: tc.waiting, Deadline: 20 * time.Second}, func(http.ResponseWriter, *http.Request) {
				entered <- struct{}{}
				<-release
			})
			codes := make(chan int, 3)
			post := func() {
				resp, err := post(url, strings.NewReader("{}"))
				if err != nil {
					codes <- 0
					return
				}
				resp.Body.Close()
				codes <- resp.StatusCode
			}
			go post()
			go post()
			for range 2 {
				select {
				case <-entered:
				case <-time.After(10 * time.Second):
					t.Fatal("two reviews were not answered at once")
				}
			}
			go post()
			if tc.want == http.StatusTooManyRequests {
				select {
				case code := <-codes:
					assert.Equal(t, tc.want, code, "a third review, beside two and none may wait")
				case <-time.After(10 * time.Second):
					t.Fatal("a third review, beside two and none may wait, was not refused at once")
				}
				close(release)
				assert.Equal(t, http.StatusOK, <-codes)
				assert.Equal(t, http.StatusOK, <-codes)
				return
			}
			close(release)
			for range 3 {
				assert.Equal(t, tc.want, <-codes, "a review that waited for its slot is answered")
			}
			assert.Len(t, entered, 1, "the review that waited was answered once a slot was free")
		})
	}
}

// A review answered past its body's deadline keeps a live context to the
// end: the body's deadline is the body's, not the answer's (review 244 F3).
func TestAnAnswerPastTheBodysDeadlineIsGiven(t *testing.T) {
	url := served(t, reviewbounds.Limits{MaxBody: 1 << 10, InFlight: 1, Waiting: 1, BodyDeadline: 100 * time.Millisecond, Deadline: 20 * time.Second},
		func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
				http.Error(w, "cancelled: "+r.Context().Err().Error(), http.StatusInternalServerError)
			case <-time.After(500 * time.Millisecond):
				fmt.Fprint(w, "answered")
			}
		})
	resp, err := post(url, strings.NewReader("{}"))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "answered", string(body))
}
