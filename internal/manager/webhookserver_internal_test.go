package manager

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/webhook/reviewbounds"
)

// The manager's webhook server speaks HTTP/1.1 only and holds every handler
// registered on it to reviewbounds' limits (review 240 F2).
func TestTheWebhookServerIsBoundedAndSpeaksHTTP1(t *testing.T) {
	srv, err := newWebhookServer(Options{WebhookPort: 0, WebhookCertDir: t.TempDir()}, prometheus.NewRegistry())
	require.NoError(t, err)
	srv.Register("/review", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	var inner crwebhook.Server = srv
	for {
		u, ok := inner.(interface{ Unwrap() crwebhook.Server })
		if !ok {
			break
		}
		inner = u.Unwrap()
	}
	def, ok := inner.(*crwebhook.DefaultServer)
	require.True(t, ok, "controller-runtime's server under the wrappers")

	cfg := &tls.Config{NextProtos: []string{"h2"}}
	for _, opt := range def.Options.TLSOpts {
		opt(cfg)
	}
	assert.Equal(t, []string{"http/1.1"}, cfg.NextProtos)

	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/review", bytes.NewReader(make([]byte, reviewbounds.Defaults.MaxBody+1)))
	def.WebhookMux().ServeHTTP(rec, req)
	assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
}
