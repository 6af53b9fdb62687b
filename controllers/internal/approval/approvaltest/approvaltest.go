// Package approvaltest is an API server, for the approvers' tests, that
// holds the answer to a CSR's approval or denial write until the test lets
// it go: a write on the wire when the manager stops.
package approvaltest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Held answers every approval write (PUT .../certificatesigningrequests/NAME/approval)
// as applied once Answer is called, unless the write's own context ends
// first: then it fails at once, as client-go's transport fails a request
// cancelled on the wire. Anything else is not found.
type Held struct {
	// Sent is closed when the first write arrives.
	Sent chan struct{}

	answer   chan struct{}
	sentOnce sync.Once
	puts     atomic.Int64
	cut      atomic.Int64
}

// NewHeld returns a Held whose writes wait for Answer.
func NewHeld() *Held {
	return &Held{Sent: make(chan struct{}), answer: make(chan struct{})}
}

// Clientset is a clientset of this API server.
func (h *Held) Clientset(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host: "http://held.invalid", Transport: h,
		ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Answer lets the writes held, and every later one, be answered.
func (h *Held) Answer() { close(h.answer) }

// Cut is how many writes were cut short on the wire: their context ended
// before they were answered.
func (h *Held) Cut() int64 { return h.cut.Load() }

// Writes is how many approval writes arrived.
func (h *Held) Writes() int64 { return h.puts.Load() }

// RoundTrip serves a request.
func (h *Held) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPut || !strings.HasSuffix(req.URL.Path, "/approval") {
		return respond(req, http.StatusNotFound, []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound"}`)), nil
	}
	var written certificatesv1.CertificateSigningRequest
	if err := json.NewDecoder(req.Body).Decode(&written); err != nil {
		return nil, err
	}
	h.puts.Add(1)
	h.sentOnce.Do(func() { close(h.Sent) })
	select {
	case <-h.answer:
	case <-req.Context().Done():
	}
	if err := req.Context().Err(); err != nil {
		h.cut.Add(1)
		return nil, err
	}
	written.ResourceVersion += "1"
	body, err := json.Marshal(&written)
	if err != nil {
		return nil, err
	}
	return respond(req, http.StatusOK, body), nil
}

func respond(req *http.Request, code int, body []byte) *http.Response {
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: req,
	}
}
