package kubeletserving

import (
	"context"
	"fmt"
	"sort"

	certificatesv1 "k8s.io/api/certificates/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// Cache indexes, so that each event costs a lookup, not a scan.
const (
	// IndexNodeName indexes TalosMachines by the node names they answer to:
	// status.nodeName and spec.hostname.
	IndexNodeName = "ichor.dev/nodeName"
	// IndexCluster indexes TalosMachines by spec.clusterName.
	IndexCluster = "ichor.dev/cluster"
	// IndexServingEnabled indexes TalosClusters by whether kubelet serving
	// certificates are enabled.
	IndexServingEnabled = "ichor.dev/kubeletServingEnabled"
	// IndexSignerName indexes CSRs by spec.signerName.
	IndexSignerName = "spec.signerName"
)

// AddIndexes registers the indexes the reconciler queries.
func AddIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	for _, ix := range []struct {
		obj     client.Object
		field   string
		extract client.IndexerFunc
	}{
		{&ichorv1alpha1.TalosMachine{}, IndexNodeName, func(o client.Object) []string {
			m := o.(*ichorv1alpha1.TalosMachine)
			names := []string{}
			for _, n := range []string{m.Status.NodeName, m.Spec.Hostname} {
				if n != "" && (len(names) == 0 || names[0] != n) {
					names = append(names, n)
				}
			}
			return names
		}},
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

// FindMachine is the managed machine answering to node name node (its
// status.nodeName or, before that is known, its spec.hostname) among those
// keep accepts; nil when none does. A recorded node name is a stronger match
// than a hostname; among equals the order is fixed (namespace, name), so the
// same request always meets the same machine. Both approvers find machines
// this way.
func FindMachine(ctx context.Context, reader client.Reader, node string, keep func(*ichorv1alpha1.TalosMachine) (bool, error)) (*ichorv1alpha1.TalosMachine, error) {
	found, err := FindMachines(ctx, reader, node, keep)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	if len(found) > 1 {
		log.FromContext(ctx).Info("several machines have this node name; using the first",
			"node", node, "machine", client.ObjectKeyFromObject(&found[0]))
	}
	return &found[0], nil
}

// FindMachines is every machine FindMachine chooses among, in its order.
func FindMachines(ctx context.Context, reader client.Reader, node string, keep func(*ichorv1alpha1.TalosMachine) (bool, error)) ([]ichorv1alpha1.TalosMachine, error) {
	if node == "" {
		return nil, nil
	}
	var machines ichorv1alpha1.TalosMachineList
	if err := reader.List(ctx, &machines, client.MatchingFields{IndexNodeName: node}); err != nil {
		return nil, fmt.Errorf("list machines with node name %q: %w", node, err)
	}
	var found []ichorv1alpha1.TalosMachine
	for i := range machines.Items {
		ok, err := keep(&machines.Items[i])
		if err != nil {
			return nil, err
		}
		if ok {
			found = append(found, machines.Items[i])
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	sort.Slice(found, func(i, j int) bool {
		if (found[i].Status.NodeName == node) != (found[j].Status.NodeName == node) {
			return found[i].Status.NodeName == node
		}
		if found[i].Namespace != found[j].Namespace {
			return found[i].Namespace < found[j].Namespace
		}
		return found[i].Name < found[j].Name
	})
	return found, nil
}
