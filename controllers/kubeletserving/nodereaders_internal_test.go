package kubeletserving

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
)

// clusterWithBundle is a TalosCluster of namespace ns named name, with a new
// secrets bundle in the Secret it names (claimed for it), and a scheme.
func clusterWithBundle(t *testing.T, name string) (*secrets.Bundle, *ichorv1alpha1.TalosCluster, *corev1.Secret, *runtime.Scheme) {
	t.Helper()
	bundle := newSecretsBundle(t)
	data, err := clustersecrets.Marshal(bundle)
	require.NoError(t, err)
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec:       ichorv1alpha1.TalosClusterSpec{SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: name + "-secrets"}},
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-secrets", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: name}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: data},
	}
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	return bundle, cluster, secret, scheme
}

func newSecretsBundle(t *testing.T) *secrets.Bundle {
	t.Helper()
	bundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), config.TalosVersionCurrent, secrets.WithECDSAServiceAccountKey())
	require.NoError(t, err)
	return bundle
}

// A cluster forgotten (deleted, or its shard gone) while its secrets bundle
// was being read leaves no reader behind: the read in flight is answered,
// and the reader made for it, with the CA key it holds, is not kept until the
// name comes back (review of 2026-12-05).
func TestAReaderMadeWhileItsClusterIsForgottenIsNotKept(t *testing.T) {
	_, cluster, secret, scheme := clusterWithBundle(t, "gone")
	reading, forgotten := make(chan struct{}), make(chan struct{})
	slow := readWhile{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build(), reading: reading, until: forgotten}
	n := &NodeReaders{Reader: slow, Watch: true}
	t.Cleanup(n.Stop)
	key := client.ObjectKeyFromObject(cluster)

	done := make(chan error, 1)
	go func() {
		_, err := n.Get(t.Context(), cluster)
		done <- err
	}()
	<-reading
	n.Forget(key)
	close(forgotten)
	require.NoError(t, <-done, "the read in flight is answered")

	n.mu.Lock()
	_, kept := n.readers[key]
	n.mu.Unlock()
	assert.False(t, kept, "a reader of a forgotten cluster was kept")

	// Asked again by a caller that still holds it (an audit pass listed
	// the clusters before): not kept either.
	_, err := n.Get(t.Context(), cluster)
	require.NoError(t, err)
	n.mu.Lock()
	_, kept = n.readers[key]
	n.mu.Unlock()
	assert.False(t, kept, "a reader of a forgotten cluster was kept for a caller holding it")

	// Served again (the reconcile keeps its machines): kept.
	require.NoError(t, n.Keep(t.Context(), cluster, nil))
	n.mu.Lock()
	_, kept = n.readers[key]
	n.mu.Unlock()
	assert.True(t, kept)
}

// An OS CA rotated to one the reader refuses (its key not its certificate's:
// a new certificate with the old key, or the old certificate with a new key)
// ends the reader made with the CA before, and its watches: before, the old
// reader was kept, and its watches went on signing credentials from the old
// key and dialling the machines it held when its Keep began to fail (review
// 159); a key changed alone was not seen at all (review 160).
func TestAnOSCATheReaderRefusesEndsTheReaderBefore(t *testing.T) {
	for name, swap := range map[string]func(b, other *secrets.Bundle){
		"a new certificate": func(b, other *secrets.Bundle) { b.Certs.OS.Crt = other.Certs.OS.Crt },
		"a new key":         func(b, other *secrets.Bundle) { b.Certs.OS.Key = other.Certs.OS.Key },
	} {
		t.Run(name, func(t *testing.T) {
			bundle, cluster, secret, scheme := clusterWithBundle(t, "rotated")
			other := newSecretsBundle(t)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
			n := &NodeReaders{Reader: c, Watch: true}
			t.Cleanup(n.Stop)
			key := client.ObjectKeyFromObject(cluster)
			_, err := n.Get(t.Context(), cluster)
			require.NoError(t, err)
			n.mu.Lock()
			before := n.readers[key]
			n.mu.Unlock()
			require.NotNil(t, before)
			require.NotNil(t, before.watches)
			// A machine watched (nothing answers there; the watch retries).
			before.watches.Keep([]string{"127.0.0.1:1"})
			watched, _ := before.watches.Count()
			require.Equal(t, 1, watched)

			swap(bundle, other)
			mismatched, err := clustersecrets.Marshal(bundle)
			require.NoError(t, err)
			secret.Data[ichorv1alpha1.DefaultSecretsBundleKey] = mismatched
			require.NoError(t, c.Update(t.Context(), secret))
			n.mu.Lock()
			before.read = time.Time{} // read again now, not after secretsFreshness
			n.mu.Unlock()

			_, err = n.Get(t.Context(), cluster)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "talos identity reader of cluster ns/rotated")
			n.mu.Lock()
			_, kept := n.readers[key]
			n.mu.Unlock()
			assert.False(t, kept, "the reader of the CA before was kept")
			require.Eventually(t, func() bool {
				watched, _ := before.watches.Count()
				return watched == 0
			}, 10*time.Second, 10*time.Millisecond, "the watches of the CA before were not stopped")
		})
	}
}

// readWhile is a Reader whose first Get says it has started (reading) and
// answers only once until is closed.
type readWhile struct {
	client.Reader
	reading, until chan struct{}
}

func (r readWhile) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	select {
	case <-r.until:
	default:
		close(r.reading)
		<-r.until
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// A node that answers a read with a status message of megabytes (its
// headers are bounded at the transport too) is kept, and said on the
// cluster, in a few hundred bytes: the hostile review of 2026-12-05.
func TestAFailedReadsErrorIsKeptBounded(t *testing.T) {
	n := &NodeReaders{UnreachableAfter: time.Second}
	key := types.NamespacedName{Namespace: "ns", Name: "demo"}
	t0 := time.Unix(1_000_000, 0)
	huge := errors.New("rpc error: code = Unavailable desc = " + strings.Repeat("x", 4<<20))
	n.observe(key, "worker-1", t0, huge)
	n.observe(key, "worker-1", t0.Add(2*time.Second), huge)
	r := n.reachability(key, t0.Add(2*time.Second))
	require.Equal(t, 1, r.failed)
	assert.LessOrEqual(t, len(r.err), maxReadError)
	assert.True(t, strings.HasPrefix(r.err, "rpc error: code = Unavailable"), "the error is cut, not lost")
}

// What the reads of a cluster's machines say to its Ready, on a clock of
// the test's (review 169: only the unit table of unreachable() and one
// envtest run, which reached neither the grace nor the freshness, held it):
// a machine failing for less than UnreachableAfter is not yet unreachable;
// a success ends its failing, and its failing starts again from the next
// failure; an outcome older than readFreshness no longer counts.
func TestReachabilityFollowsTheReadsOnItsClock(t *testing.T) {
	n := &NodeReaders{UnreachableAfter: time.Minute}
	key := types.NamespacedName{Namespace: "ns", Name: "demo"}
	t0 := time.Unix(1_000_000, 0)
	down := errors.New("connection refused")

	n.observe(key, "worker-1", t0, down)
	n.observe(key, "worker-1", t0.Add(59*time.Second), down)
	r := n.reachability(key, t0.Add(59*time.Second))
	assert.Equal(t, 1, r.machines)
	assert.Zero(t, r.failed, "failing for less than the grace")

	n.observe(key, "worker-1", t0.Add(time.Minute), down)
	r = n.reachability(key, t0.Add(time.Minute))
	r.total = 1
	assert.Equal(t, 1, r.failed)
	assert.True(t, r.unreachable())
	assert.Equal(t, "worker-1", r.machine)

	// Answered once: its failing ends, and starts again from the next.
	n.observe(key, "worker-1", t0.Add(61*time.Second), nil)
	n.observe(key, "worker-1", t0.Add(62*time.Second), down)
	n.observe(key, "worker-1", t0.Add(100*time.Second), down)
	r = n.reachability(key, t0.Add(100*time.Second))
	assert.Zero(t, r.failed, "a success did not reset the failing")

	// Past readFreshness with no read since, it no longer counts: a
	// one-machine cluster whose failing request is gone is not unreachable
	// for ever.
	r = n.reachability(key, t0.Add(100*time.Second+readFreshness+time.Second))
	r.total = 1
	assert.Zero(t, r.machines)
	assert.False(t, r.unreachable())
}

// TestReachabilityIsEarlyForAWhileAfterItsReadsAreDropped (review 247, F2):
// a restart or a hand-over drops the reads; the first looks after it are
// early, so that reads that say nothing yet do not turn Ready True.
func TestReachabilityIsEarlyForAWhileAfterItsReadsAreDropped(t *testing.T) {
	n := &NodeReaders{UnreachableAfter: time.Minute}
	key := types.NamespacedName{Namespace: "ns", Name: "demo"}
	t0 := time.Unix(1_000_000, 0)

	r := n.reachability(key, t0)
	assert.True(t, r.early)
	n.observe(key, "worker-1", t0.Add(time.Second), errors.New("connection refused"))
	n.observe(key, "worker-2", t0.Add(time.Second), nil)
	r = n.reachability(key, t0.Add(readFreshness-time.Second))
	assert.True(t, r.early, "early from the first look, not from each")
	assert.Equal(t, time.Second, r.earlyLeft)
	assert.Equal(t, 2, r.machines)
	assert.Equal(t, 1, r.answered)
	assert.False(t, n.reachability(key, t0.Add(readFreshness)).early)

	n.Forget(key)
	assert.True(t, n.reachability(key, t0.Add(time.Hour)).early, "the reads were dropped: early again")
}

// Review 194: without a usable Kubernetes CA no certificate is recorded, and
// each request's look would fail on its own: the cluster says its bundle is
// unusable, as for its OS CA.
func TestABundleWithoutAUsableKubernetesCAIsSaidUnusable(t *testing.T) {
	bundle := newSecretsBundle(t)
	bundle.Certs.K8s.Crt = []byte("not a certificate")
	data, err := clustersecrets.Marshal(bundle)
	require.NoError(t, err)
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "broken", UID: "uid-broken"},
		Spec:       ichorv1alpha1.TalosClusterSpec{SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "broken-secrets"}},
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "broken-secrets", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "broken"}},
		Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: data},
	}
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	r := &Reconciler{NodeReaders: &NodeReaders{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()}}
	err = r.secretsUnusable(t.Context(), cluster)
	require.ErrorContains(t, err, "Kubernetes CA holds no PEM certificate")
	assert.ErrorIs(t, err, errKubernetesCAUnusable, "said as a bundle no node's identity can be read with")
}

// Two reads of a cluster's secrets bundle under way at once, the one begun
// first answered last: what it read, from before a rotation, is not put back
// over what the later read found, and its failure does not end the reader
// the later read made (review 193 L1: for up to secretsFreshness, machines
// were read, and certificates judged, with the CAs before the rotation).
func TestAnEarlierReadOfTheBundleAnsweredLastChangesNothing(t *testing.T) {
	t.Run("the CAs before a rotation", func(t *testing.T) {
		bundle, cluster, secret, scheme := clusterWithBundle(t, "rotated")
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
		read, answer := make(chan struct{}), make(chan struct{})
		n := &NodeReaders{Reader: &readThenWait{Reader: c, read: read, until: answer}, Watch: true}
		t.Cleanup(n.Stop)

		done := getInFlight(t, n, cluster)
		<-read // the bundle before the rotation, not yet answered
		rotated := newSecretsBundle(t)
		data, err := clustersecrets.Marshal(rotated)
		require.NoError(t, err)
		secret.Data[ichorv1alpha1.DefaultSecretsBundleKey] = data
		require.NoError(t, c.Update(t.Context(), secret))
		_, err = n.Get(t.Context(), cluster)
		require.NoError(t, err)
		close(answer)
		require.NoError(t, <-done, "the earlier read is answered")

		n.mu.Lock()
		kept := n.readers[client.ObjectKeyFromObject(cluster)]
		n.mu.Unlock()
		require.NotNil(t, kept)
		assert.Equal(t, string(rotated.Certs.OS.Crt), string(kept.caCert), "the OS CA before the rotation was put back")
		before, err := kubernetesRoots(clustersecrets.Bundles{Current: bundle})
		require.NoError(t, err)
		roots, err := n.KubernetesRoots(t.Context(), cluster)
		require.NoError(t, err)
		assert.NotEqual(t, before.id, roots.id, "the Kubernetes CA before the rotation was put back")
	})
	t.Run("a failure", func(t *testing.T) {
		_, cluster, secret, scheme := clusterWithBundle(t, "back")
		c := fake.NewClientBuilder().WithScheme(scheme).Build() // the Secret not made yet
		read, answer := make(chan struct{}), make(chan struct{})
		n := &NodeReaders{Reader: &readThenWait{Reader: c, read: read, until: answer}, Watch: true}
		t.Cleanup(n.Stop)

		done := getInFlight(t, n, cluster)
		<-read // not found, not yet answered
		require.NoError(t, c.Create(t.Context(), secret))
		_, err := n.Get(t.Context(), cluster)
		require.NoError(t, err)
		n.mu.Lock()
		made := n.readers[client.ObjectKeyFromObject(cluster)]
		n.mu.Unlock()
		require.NotNil(t, made)
		made.watches.Keep([]string{"127.0.0.1:1"}) // nothing answers there; the watch retries
		close(answer)
		require.Error(t, <-done, "the earlier read failed")

		n.mu.Lock()
		kept := n.readers[client.ObjectKeyFromObject(cluster)]
		n.mu.Unlock()
		assert.Same(t, made, kept, "the later read's reader was dropped for the earlier read's failure")
		watched, _ := made.watches.Count()
		assert.Equal(t, 1, watched, "the later read's watches were ended")
	})
}

// The later read failed (the bundle taken away): the earlier read, answered
// after it with the bundle before, neither makes a reader nor watches from
// its OS CA key (review 200 F1: its reader was kept, its watches went on
// signing credentials from a key taken away).
func TestAnEarlierReadAnsweredAfterALaterFailureIsNotUsed(t *testing.T) {
	_, cluster, secret, scheme := clusterWithBundle(t, "taken")
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
	read, answer := make(chan struct{}), make(chan struct{})
	n := &NodeReaders{Reader: &readThenWait{Reader: c, read: read, until: answer}, Watch: true}
	t.Cleanup(n.Stop)

	done := getInFlight(t, n, cluster)
	<-read // the bundle, not yet answered
	require.NoError(t, c.Delete(t.Context(), secret))
	_, err := n.Get(t.Context(), cluster)
	require.Error(t, err, "the bundle was taken away")
	close(answer)
	require.ErrorIs(t, <-done, errBundleReadAgain)

	n.mu.Lock()
	_, kept := n.readers[client.ObjectKeyFromObject(cluster)]
	n.mu.Unlock()
	assert.False(t, kept, "a reader of the bundle taken away was kept")
}

// A secretsRef changed while two reads were under way: the read of the new
// one, begun first and answered last, is answered with the new Secret's CA,
// not the reader a caller holding the cluster as it was made from the old
// one (review 200 F4).
func TestAnEarlierReadOfANewSecretsRefGetsItsOwnCA(t *testing.T) {
	_, cluster, secret, scheme := clusterWithBundle(t, "moved")
	moved := newSecretsBundle(t)
	data, err := clustersecrets.Marshal(moved)
	require.NoError(t, err)
	other := secret.DeepCopy()
	other.Name, other.ResourceVersion = "moved-other", ""
	other.Data[ichorv1alpha1.DefaultSecretsBundleKey] = data
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret, other).Build()
	read, answer := make(chan struct{}), make(chan struct{})
	n := &NodeReaders{Reader: &readThenWait{Reader: c, read: read, until: answer}}
	t.Cleanup(n.Stop)

	now := cluster.DeepCopy()
	now.Spec.SecretsRef.Name = other.Name
	done := make(chan *cachedReader, 1)
	go func() {
		r, err := n.get(t.Context(), now)
		assert.NoError(t, err)
		done <- r
	}()
	// The new Secret read, not yet answered; then a caller holding the
	// cluster as it was reads the old one.
	<-read
	_, err = n.get(t.Context(), cluster)
	require.NoError(t, err)
	close(answer)
	got := <-done
	require.NotNil(t, got)
	assert.Equal(t, string(moved.Certs.OS.Crt), string(got.caCert), "answered with the old secretsRef's CA")
}

// A read of the bundle that gets no answer (the API server busy: a 503)
// changes nothing: the reader and its watches stay, and an earlier read
// answered after it is used. Before, it dropped the reader and ended every
// watch, and the earlier read, refused as read again, said the bundle
// unusable on the cluster (review 201 F1).
func TestABundleReadWithoutAnAnswerChangesNothing(t *testing.T) {
	_, cluster, secret, scheme := clusterWithBundle(t, "busy")
	busy := &failingWhile{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()}
	read, answer := make(chan struct{}), make(chan struct{})
	n := &NodeReaders{Reader: &readThenWait{Reader: busy, read: read, until: answer}, Watch: true}
	t.Cleanup(n.Stop)
	key := client.ObjectKeyFromObject(cluster)

	done := getInFlight(t, n, cluster)
	<-read
	busy.fail.Store(true)
	_, err := n.Get(t.Context(), cluster)
	require.Error(t, err)
	require.True(t, transientRead(t.Context(), err), "%v", err)
	busy.fail.Store(false)
	close(answer)
	require.NoError(t, <-done, "the earlier read was refused for a later one that got no answer")

	n.mu.Lock()
	made := n.readers[key]
	n.mu.Unlock()
	require.NotNil(t, made, "the earlier read's reader was not kept")
	made.watches.Keep([]string{"127.0.0.1:1"}) // nothing answers there; the watch retries
	n.mu.Lock()
	made.read = time.Time{} // read again now, not after secretsFreshness
	n.mu.Unlock()
	busy.fail.Store(true)
	_, err = n.Get(t.Context(), cluster)
	require.Error(t, err)
	n.mu.Lock()
	kept := n.readers[key]
	n.mu.Unlock()
	assert.Same(t, made, kept, "a read without an answer dropped the reader")
	watched, _ := made.watches.Count()
	assert.Equal(t, 1, watched, "a read without an answer ended the watches")
}

// A read answered after a later one was kept and since let go (a lifetime
// changed) is used, for itself: only a later read that found the bundle
// gone or refused refuses it (review 201 F2). A cluster forgotten while its
// bundle was read leaves no note of the read behind (review 201 F3).
func TestAnEarlierReadAfterALaterOneLetGoIsUsed(t *testing.T) {
	_, cluster, secret, scheme := clusterWithBundle(t, "let-go")
	read, answer := make(chan struct{}), make(chan struct{})
	n := &NodeReaders{Reader: &readThenWait{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build(), read: read, until: answer}, Lifetime: 10 * time.Minute}
	t.Cleanup(n.Stop)
	key := client.ObjectKeyFromObject(cluster)

	done := getInFlight(t, n, cluster)
	<-read
	_, err := n.Get(t.Context(), cluster)
	require.NoError(t, err)
	n.SetLifetime(5 * time.Minute)
	close(answer)
	require.NoError(t, <-done, "refused for a later read that was answered")

	n.Forget(key)
	n.mu.Lock()
	_, noted := n.begun[key]
	n.mu.Unlock()
	assert.False(t, noted)
}

// A read in flight when its cluster is forgotten, found or not found, leaves
// no note of itself once answered: the names of clusters let go are not
// kept (review 201 F3).
func TestAForgottenClustersReadLeavesNoNote(t *testing.T) {
	for name, found := range map[string]bool{"found": true, "not found": false} {
		t.Run(name, func(t *testing.T) {
			_, cluster, secret, scheme := clusterWithBundle(t, "noted")
			b := fake.NewClientBuilder().WithScheme(scheme)
			if found {
				b = b.WithObjects(secret)
			}
			read, answer := make(chan struct{}), make(chan struct{})
			n := &NodeReaders{Reader: &readThenWait{Reader: b.Build(), read: read, until: answer}}
			t.Cleanup(n.Stop)
			done := getInFlight(t, n, cluster)
			<-read
			n.Forget(client.ObjectKeyFromObject(cluster))
			close(answer)
			if err := <-done; found {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			assert.Empty(t, n.begun, "the name of a cluster let go is kept")
		})
	}
}

// failingWhile is a Reader whose Gets are answered 503 while fail is set.
type failingWhile struct {
	client.Reader
	fail atomic.Bool
}

func (r *failingWhile) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if r.fail.Load() {
		return apierrors.NewServiceUnavailable("the API server is busy")
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// getInFlight starts a Get of cluster, whose answer comes on the channel.
func getInFlight(t *testing.T, n *NodeReaders, cluster *ichorv1alpha1.TalosCluster) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := n.Get(t.Context(), cluster)
		done <- err
	}()
	return done
}

// readThenWait is a Reader whose first Get reads, says it has (read), and
// answers what it read only once until is closed: a read answered late.
type readThenWait struct {
	client.Reader
	read, until chan struct{}
	once        sync.Once
}

func (r *readThenWait) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	first := false
	r.once.Do(func() { first = true })
	err := r.Reader.Get(ctx, key, obj, opts...)
	if first {
		close(r.read)
		<-r.until
	}
	return err
}

// A lifetime the bundle in service changes makes every reader anew at its
// next use, and ends the watches of the one before; the same lifetime
// changes nothing (review 197B F3).
func TestANewReaderLifetimeMakesTheReadersAnew(t *testing.T) {
	_, cluster, secret, scheme := clusterWithBundle(t, "lifetime")
	n := &NodeReaders{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build(), Watch: true, Lifetime: 10 * time.Minute}
	t.Cleanup(n.Stop)
	before, err := n.Get(t.Context(), cluster)
	require.NoError(t, err)
	n.mu.Lock()
	made := n.readers[client.ObjectKeyFromObject(cluster)]
	n.mu.Unlock()
	made.watches.Keep([]string{"127.0.0.1:1"}) // nothing answers there; the watch retries

	n.SetLifetime(10 * time.Minute)
	same, err := n.Get(t.Context(), cluster)
	require.NoError(t, err)
	assert.Same(t, before, same, "the same lifetime made the reader anew")

	n.SetLifetime(5 * time.Minute)
	after, err := n.Get(t.Context(), cluster)
	require.NoError(t, err)
	assert.NotSame(t, before, after, "a reader made with the lifetime before is kept")
	require.Eventually(t, func() bool {
		watched, _ := made.watches.Count()
		return watched == 0
	}, 10*time.Second, 10*time.Millisecond, "the watches of the reader before were not stopped")
}

// TestAGoneMachinesReadIsForgotten (review 247, F4): a machine deleted no
// longer counts towards its cluster's reachability, and one made again
// under its name has its grace whole.
func TestAGoneMachinesReadIsForgotten(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	f := newQueueFixture(t, clocktesting.NewFakeClock(t0))
	n := f.r.NodeReaders
	n.UnreachableAfter = time.Minute
	down := errors.New("connection refused")
	m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.cluster.Namespace, Name: "m-1", UID: "uid-m-1"}}
	m.Spec.ClusterName = f.cluster.Name

	n.observe(f.cluster, "m-1", t0, down)
	n.observe(f.cluster, "m-1", t0.Add(time.Minute), down)
	r := n.reachability(f.cluster, t0.Add(time.Minute))
	r.total = 1
	require.True(t, r.unreachable())

	f.r.forgetMachine(m)
	r = n.reachability(f.cluster, t0.Add(time.Minute))
	assert.Zero(t, r.machines, "a deleted machine still counts")

	// Made again under its name: its first failure is within its grace.
	n.observe(f.cluster, "m-1", t0.Add(70*time.Second), down)
	r = n.reachability(f.cluster, t0.Add(70*time.Second))
	r.total = 1
	assert.Equal(t, 1, r.machines)
	assert.Zero(t, r.failed, "the new machine inherited its predecessor's failing")
}
