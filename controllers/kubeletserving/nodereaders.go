package kubeletserving

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
)

// NodeReaders keeps one Talos identity reader per cluster, made from the
// cluster's OS CA, so the reader's short-lived os:reader credential is reused
// across requests until it nears expiry.
type NodeReaders struct {
	// Reader reads the secrets Secret (uncached).
	Reader client.Reader
	// Lifetime of the reader's own credential, as the policy caps it.
	Lifetime time.Duration
	// Timeout bounds one identity read.
	Timeout time.Duration

	mu      sync.Mutex
	readers map[types.NamespacedName]*cachedReader
}

type cachedReader struct {
	caCert []byte
	reader *talosnode.Reader
	// read is when the secrets bundle was last read, secretsRef where from.
	read       time.Time
	secretsRef ichorv1alpha1.SecretsBundleReference
}

// secretsFreshness is how long a cluster's secrets bundle, read once, is
// used before it is read again: a decision does not cost a Secret read, and a
// rotated OS CA is in use within this time.
const secretsFreshness = 10 * time.Second

// Get returns the reader of a cluster, made anew when its OS CA changed.
func (n *NodeReaders) Get(ctx context.Context, cluster *ichorv1alpha1.TalosCluster) (*talosnode.Reader, error) {
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Name}
	n.mu.Lock()
	if c, ok := n.readers[key]; ok && c.secretsRef == cluster.Spec.SecretsRef && time.Since(c.read) < secretsFreshness {
		n.mu.Unlock()
		return c.reader, nil
	}
	n.mu.Unlock()
	bundles, err := clustersecrets.Load(ctx, n.Reader, cluster)
	if err != nil {
		return nil, err
	}
	os := bundles.Current.Certs.OS
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.readers[key]; ok && bytes.Equal(c.caCert, os.Crt) {
		c.read, c.secretsRef = time.Now(), cluster.Spec.SecretsRef
		return c.reader, nil
	}
	reader, err := talosnode.NewReader(talosnode.Options{
		CACertPEM:           os.Crt,
		CAKeyPEM:            os.Key,
		CertificateLifetime: n.Lifetime,
		Timeout:             n.Timeout,
	})
	if err != nil {
		return nil, fmt.Errorf("talos identity reader of cluster %s: %w", key, err)
	}
	if n.readers == nil {
		n.readers = map[types.NamespacedName]*cachedReader{}
	}
	n.readers[key] = &cachedReader{caCert: os.Crt, reader: reader, read: time.Now(), secretsRef: cluster.Spec.SecretsRef}
	return reader, nil
}

// Forget drops a cluster's reader.
func (n *NodeReaders) Forget(key types.NamespacedName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.readers, key)
}
