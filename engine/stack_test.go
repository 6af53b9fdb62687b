package engine_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"runtime/debug"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/engine/enginetest"
)

// A webhook request's goroutine is new: GrowStack must leave its stack large
// enough for the admission decision (its decision log written and masked),
// with room to spare for the server's frames below the handler, or the
// runtime grows it again under OPA's evaluator. A rule that comes to need
// more stack fails this test: raise admissionStack.
func TestGrowStackMakesRoomForAnAdmission(t *testing.T) {
	e, _ := newEngine(t)
	admit := admission(t, e)
	require.NoError(t, admit(), "the admission, once on the test's goroutine")
	// A collection halves a stack that is less than a quarter used, which
	// moves it too: none runs while the probes do.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))

	// The control: without GrowStack, the probe sees the stack grow.
	moved, err := stackMoved(false, admit)
	require.NoError(t, err)
	require.True(t, moved, "an admission in a new goroutine did not grow its stack: the probe sees nothing, and the test below would pass without GrowStack")

	for range 3 {
		moved, err := stackMoved(true, admit)
		require.NoError(t, err)
		assert.False(t, moved, "the admission grew the stack GrowStack had grown")
	}
}

// stackMoved runs f in a new goroutine, GrowStack first if grow, beneath a
// frame of serverFrames standing for the web server's, and says whether the
// goroutine's stack was moved meanwhile: the runtime copies a stack to grow
// it, and a local's address changes with it.
func stackMoved(grow bool, f func() error) (bool, error) {
	type result struct {
		moved bool
		err   error
	}
	done := make(chan result, 1)
	go func() {
		if grow {
			engine.GrowStack()
		}
		var local byte
		before := uintptr(unsafe.Pointer(&local)) //nolint:gosec // G103: the address is compared, never dereferenced
		err := beneathServerFrames(f)
		done <- result{moved: uintptr(unsafe.Pointer(&local)) != before, err: err} //nolint:gosec // G103: as above
	}()
	r := <-done
	return r.moved, r.err
}

// serverFrames is room for what runs below a webhook handler (net/http's
// HTTP/2 server, controller-runtime's webhook, the handler's own frame):
// about 10 KiB, doubled.
const serverFrames = 20 << 10

// frameIndex is always 0: reading frames[frameIndex] after f keeps the frame
// the compiler would otherwise drop.
var frameIndex int

//go:noinline
func beneathServerFrames(f func() error) error {
	var frames [serverFrames]byte
	err := f()
	frames[frameIndex] = 1
	if frames[frameIndex] != 1 {
		return errors.New("unreachable")
	}
	return err
}

// admission is a person's talosconfig-reader request as the webhook decides
// it once its facts are gathered (the requirements, asked here once): the
// admission, allowed.
func admission(t *testing.T, e *engine.Engine) func() error {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	key, _ := engine.ParsePublicKey(string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	reqs, err := e.Requirements(context.Background(), "talosconfig-reader")
	require.NoError(t, err)
	in := enginetest.AllowedAdmission(key, reqs.Authorization)
	return func() error {
		d, err := e.Admission(context.Background(), in)
		if err != nil {
			return err
		}
		if !d.Allowed {
			return fmt.Errorf("the admission refused: %s", d.Reasons.String())
		}
		return nil
	}
}
