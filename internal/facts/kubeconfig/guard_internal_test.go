package kubeconfig

import (
	"context"
	"encoding/binary"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A list is bounded as one; anything else as one object's answer.
func TestIsCollection(t *testing.T) {
	for path, want := range map[string]bool{
		"/apis/certificates.k8s.io/v1/certificatesigningrequests":  true,
		"/apis/certificates.k8s.io/v1/certificatesigningrequests/": true,
		"/api/v1/nodes":                  true,
		"/api/v1/namespaces/a/pods":      true,
		"/apis/g/v1/namespaces/a/things": true,
		"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1":          false,
		"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1/approval": false,
		"/api/v1/namespaces/a":          false,
		"/api/v1/namespaces/a/pods/p":   false,
		"/apis/authorization.k8s.io/v1": false,
		"/version":                      false,
		"/api":                          false,
		"/apis":                         false,
		"/":                             false,
		"":                              false,
	} {
		if got := isCollection(path); got != want {
			t.Errorf("isCollection(%q) = %v, want %v", path, got, want)
		}
	}
}

// A read may hold whole events, each of which client-go's decoders grew
// their buffers for: the longest is charged, not only the one still open.
func TestAnEventReadWholeInOneReadIsCharged(t *testing.T) {
	budget := &byteBudget{limit: 100 << 20}
	event := `{"type":"ADDED","object":{"metadata":{"name":"` + strings.Repeat("a", 1<<20) + `"}}}` + "\n"
	b := &boundedEvents{ReadCloser: io.NopCloser(strings.NewReader(event)), ctx: context.Background(), held: &heldBytes{budget: budget}}
	buf := make([]byte, 4<<20)
	n, err := b.Read(buf)
	require.NoError(t, err)
	require.Equal(t, len(event), n, "one read")
	assert.Equal(t, jsonDecoderHolds(int64(len(event)-1)), budget.used, "the event that ended in the read")
	require.NoError(t, b.Close())
	assert.Zero(t, budget.used)
}

func TestFrameBuffer(t *testing.T) {
	for n, want := range map[int64]int64{0: 1 << 10, 1: 1 << 10, 1 << 10: 1 << 10, 1<<10 + 1: 2 << 10, 2 << 20: 2 << 20, 8<<20 + 1: 16 << 20} {
		assert.Equal(t, want, frameBuffer(n), "%d", n)
	}
}

// A frame refused ends the stream for good: a later read is not the rest of
// the frame read as headers.
func TestARefusedFrameEndsTheStream(t *testing.T) {
	var header [4]byte
	binary.BigEndian.PutUint32(header[:], MaxWatchEventBytes+1)
	b := &boundedFrames{ReadCloser: io.NopCloser(strings.NewReader(string(header[:]) + strings.Repeat("\x00", 64))), ctx: context.Background()}
	buf := make([]byte, 4)
	_, err := b.Read(buf)
	require.Error(t, err)
	_, again := b.Read(buf)
	assert.Equal(t, err, again)
}
