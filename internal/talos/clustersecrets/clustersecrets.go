// Package clustersecrets reads a TalosCluster's secrets bundle, the file
// `talosctl gen secrets` writes, from the Secret the cluster names, and
// checks the claim of each Secret a TalosCluster names (its secrets bundle,
// its kubeconfig): the Secret, not the cluster, says which clusters may use
// it (CheckClaim).
//
// During a CA rotation the Secret also carries the bundle from before the
// rotation under PreviousKey: new credentials are signed with the current CAs
// and trust bundles carry both, so a credential issued during the cut-over
// keeps working (ADR 0124, Decision 1).
package clustersecrets

import (
	"bytes"
	"context"
	"crypto/sha256"
	stdx509 "crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"go.yaml.in/yaml/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// ErrInvalid marks a Secret that does not hold a usable secrets bundle: a
// person has to fix it, retrying will not.
var ErrInvalid = errors.New("invalid secrets bundle")

// ErrNotClaimed marks a Secret that does not name the cluster whose
// secretsRef (or kubeconfigRef) names it
// (ichorv1alpha1.SecretsClaimAnnotation): whoever may write the Secret has
// to name the cluster. Load wraps it in ErrInvalid too.
var ErrNotClaimed = errors.New("the Secret does not name this TalosCluster")

// Claims is what Load asks of the Secret's claim.
type Claims int

const (
	// ClaimRequired uses a Secret only for the clusters its annotation
	// names.
	ClaimRequired Claims = iota
	// ClaimIfAnnotated also uses a Secret without the annotation for any
	// cluster that names it, as before the claim: for the upgrade from such
	// a release (`ichor manager --require-secrets-claim=false`). A Secret
	// whose annotation names other clusters is refused all the same.
	ClaimIfAnnotated
)

// PreviousKey is the key of the secrets Secret holding the bundle from before
// a CA rotation, present only while the rotation is in progress.
const PreviousKey = "previous-secrets.yaml"

// Bundles are a cluster's current secrets bundle and, during a CA rotation,
// the previous one.
type Bundles struct {
	Current  *secrets.Bundle
	Previous *secrets.Bundle
}

// KubernetesCAs are the Kubernetes CAs of the bundles, the ones kubelet
// serving certificates are signed with (Talos gives kube-controller-manager
// the Kubernetes CA as --cluster-signing-cert-file): the current bundle's
// and, during a CA rotation, the previous one's, which may have signed a
// certificate issued just before the rotation; and a digest of their PEM,
// which tells them from others.
func (b Bundles) KubernetesCAs() (*stdx509.CertPool, string, error) {
	pool := stdx509.NewCertPool()
	sum := sha256.New()
	found := false
	for _, one := range []struct {
		which  string
		bundle *secrets.Bundle
	}{{"the secrets bundle's", b.Current}, {"the previous secrets bundle's", b.Previous}} {
		if one.bundle == nil || one.bundle.Certs == nil || one.bundle.Certs.K8s == nil {
			continue
		}
		if !pool.AppendCertsFromPEM(one.bundle.Certs.K8s.Crt) {
			return nil, "", fmt.Errorf("%s Kubernetes CA holds no PEM certificate", one.which)
		}
		sum.Write(one.bundle.Certs.K8s.Crt)
		found = true
	}
	if !found {
		return nil, "", errors.New("the secrets bundle has no Kubernetes CA")
	}
	return pool, hex.EncodeToString(sum.Sum(nil)), nil
}

// ClaimsOf is ClaimRequired when require (the flag --require-secrets-claim
// of the manager and of `ichor audit`), ClaimIfAnnotated otherwise.
func ClaimsOf(require bool) Claims {
	if require {
		return ClaimRequired
	}
	return ClaimIfAnnotated
}

// Load reads the secrets bundle (and the previous one, if any) of a cluster,
// from a Secret that names the cluster (claims): Get, then FromSecret.
func Load(ctx context.Context, reader client.Reader, cluster *ichorv1alpha1.TalosCluster, claims Claims) (Bundles, error) {
	secret, err := Get(ctx, reader, cluster)
	if err != nil {
		return Bundles{}, err
	}
	return FromSecret(secret, cluster, claims)
}

// Get reads the Secret the cluster's secretsRef names. The reader should be
// uncached: the manager needs only get on the one Secret, never list or watch
// on every Secret of the namespace.
func Get(ctx context.Context, reader client.Reader, cluster *ichorv1alpha1.TalosCluster) (*corev1.Secret, error) {
	var secret corev1.Secret
	if err := reader.Get(ctx, types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Spec.SecretsRef.Name}, &secret); err != nil {
		return nil, fmt.Errorf("secrets bundle of cluster %s/%s: get Secret %q: %w", cluster.Namespace, cluster.Name, cluster.Spec.SecretsRef.Name, Forbidden(err, cluster.Namespace))
	}
	return &secret, nil
}

// FromSecret is the secrets bundle (and the previous one, if any) of a
// cluster in the Secret its secretsRef names, Get's, when the Secret names
// the cluster (claims).
func FromSecret(secret *corev1.Secret, cluster *ichorv1alpha1.TalosCluster, claims Claims) (Bundles, error) {
	ref := cluster.Spec.SecretsRef
	key := ref.Key
	if key == "" {
		key = ichorv1alpha1.DefaultSecretsBundleKey
	}
	if err := CheckClaim(secret, cluster.Name, claims); err != nil {
		return Bundles{}, fmt.Errorf("secrets bundle of cluster %s/%s: Secret %q: %w: %w", cluster.Namespace, cluster.Name, ref.Name, ErrInvalid, err)
	}
	data, ok := secret.Data[key]
	if !ok {
		return Bundles{}, fmt.Errorf("secrets bundle of cluster %s/%s: Secret %q has no key %q: %w", cluster.Namespace, cluster.Name, ref.Name, key, ErrInvalid)
	}
	current, err := Parse(data)
	if err != nil {
		return Bundles{}, fmt.Errorf("secrets bundle of cluster %s/%s: Secret %q key %q: %w: %w", cluster.Namespace, cluster.Name, ref.Name, key, ErrInvalid, err)
	}
	out := Bundles{Current: current}
	if prev, ok := secret.Data[PreviousKey]; ok {
		if out.Previous, err = Parse(prev); err != nil {
			return Bundles{}, fmt.Errorf("secrets bundle of cluster %s/%s: Secret %q key %q: %w: %w", cluster.Namespace, cluster.Name, ref.Name, PreviousKey, ErrInvalid, err)
		}
	}
	return out, nil
}

// CheckClaim is nil when the Secret's annotation names the cluster, or "*",
// or (ClaimIfAnnotated) the Secret has no such annotation; otherwise an
// ErrNotClaimed that says how to name it. The names are those of
// TalosClusters of the Secret's namespace: a name with spaces around it is
// the name.
func CheckClaim(secret *corev1.Secret, cluster string, claims Claims) error {
	value, ok := secret.Annotations[ichorv1alpha1.SecretsClaimAnnotation]
	if !ok {
		if claims == ClaimIfAnnotated {
			return nil
		}
		return fmt.Errorf("%w: it has no annotation %s, which names the TalosClusters that may use it "+
			"(kubectl -n %s annotate secret %s %s=%s; see docs/install.md)",
			ErrNotClaimed, ichorv1alpha1.SecretsClaimAnnotation, secret.Namespace, secret.Name, ichorv1alpha1.SecretsClaimAnnotation, cluster)
	}
	for name := range strings.SplitSeq(value, ",") {
		if name = strings.TrimSpace(name); name == cluster || name == "*" {
			return nil
		}
	}
	if len(value) > maxQuotedClaim {
		// An annotation may be long; the message goes to conditions and logs.
		value = value[:maxQuotedClaim] + "..."
	}
	return fmt.Errorf("%w: its annotation %s names %s, not %q: only whoever may write the Secret may let another cluster use it",
		ErrNotClaimed, ichorv1alpha1.SecretsClaimAnnotation, strconv.Quote(value), cluster)
}

// maxQuotedClaim is how much of a claim an error quotes.
const maxQuotedClaim = 200

// Forbidden adds to an error of reading a cluster's Secret, when the API
// server refused the manager the read, what grants it: the chart gives the
// manager get on Secrets only in the namespaces rbac.secretsNamespaces names
// (the release namespace by default), so a cluster elsewhere is unreadable
// until a person names its namespace. Any other error is returned as it is.
func Forbidden(err error, namespace string) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	return fmt.Errorf("%w (the manager may not read Secrets in namespace %q: with the Helm chart, add it to "+
		"rbac.secretsNamespaces, whose default is the release namespace only; see docs/hardening.md)", err, namespace)
}

// Parse reads a secrets bundle as `talosctl gen secrets` writes it, and checks
// that the CAs this project signs with are present.
func Parse(data []byte) (*secrets.Bundle, error) {
	b := &secrets.Bundle{Clock: secrets.NewClock()}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(b); err != nil {
		return nil, fmt.Errorf("not a Talos secrets bundle: %w", err)
	}
	if b.Certs == nil {
		return nil, fmt.Errorf("not a Talos secrets bundle: no certs")
	}
	for name, ca := range map[string]*x509.PEMEncodedCertificateAndKey{"os": b.Certs.OS, "k8s": b.Certs.K8s} {
		if ca == nil || len(ca.Crt) == 0 || len(ca.Key) == 0 {
			return nil, fmt.Errorf("secrets bundle has no %s CA certificate and key", name)
		}
	}
	return b, nil
}

// Marshal writes a bundle as `talosctl gen secrets` does.
func Marshal(b *secrets.Bundle) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(b); err != nil {
		return nil, fmt.Errorf("encode secrets bundle: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode secrets bundle: %w", err)
	}
	return buf.Bytes(), nil
}
