package kubeletserving

import (
	"context"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/internal/machines"
)

// Cache indexes, so that each event costs a lookup, not a scan.
const (
	// IndexCluster indexes TalosMachines by spec.clusterName.
	IndexCluster = "ichor.dev/cluster"
	// IndexServingEnabled indexes TalosClusters by whether kubelet serving
	// certificates are enabled.
	IndexServingEnabled = "ichor.dev/kubeletServingEnabled"
	// IndexSignerName indexes CSRs by spec.signerName.
	IndexSignerName = "spec.signerName"
)

// AddIndexes registers the indexes the reconciler queries, the machines'
// node-name index (machines.IndexNodeName) among them.
func AddIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	if err := machines.AddNodeNameIndex(ctx, indexer); err != nil {
		return err
	}
	if err := addUndecidedIndex(ctx, indexer); err != nil {
		return err
	}
	for _, ix := range []struct {
		obj     client.Object
		field   string
		extract client.IndexerFunc
	}{
		{&ichorv1alpha1.TalosMachine{}, IndexCluster, func(o client.Object) []string {
			return []string{o.(*ichorv1alpha1.TalosMachine).Spec.ClusterName}
		}},
		{&ichorv1alpha1.TalosCluster{}, IndexServingEnabled, func(o client.Object) []string {
			return []string{fmt.Sprint(o.(*ichorv1alpha1.TalosCluster).Spec.Security.KubeletServingCertificates.Enabled)}
		}},
		{&certificatesv1.CertificateSigningRequest{}, IndexSignerName, func(o client.Object) []string {
			return []string{o.(*certificatesv1.CertificateSigningRequest).Spec.SignerName}
		}},
	} {
		if err := indexer.IndexField(ctx, ix.obj, ix.field, ix.extract); err != nil {
			return fmt.Errorf("index %s: %w", ix.field, err)
		}
	}
	return nil
}
