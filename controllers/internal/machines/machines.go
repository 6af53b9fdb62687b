// Package machines finds the managed machine a kubelet's request is for, by
// the node names machines answer to, as both approvers do.
package machines

import (
	"context"
	"fmt"
	"sort"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// IndexNodeName indexes TalosMachines by the node names they answer to:
// status.nodeName and spec.hostname.
const IndexNodeName = "ichor.dev/nodeName"

// AddNodeNameIndex registers IndexNodeName. Registering an index twice on
// one manager fails: a manager running both approvers registers it once.
func AddNodeNameIndex(ctx context.Context, indexer client.FieldIndexer) error {
	err := indexer.IndexField(ctx, &ichorv1alpha1.TalosMachine{}, IndexNodeName, func(o client.Object) []string {
		return NodeNames(o.(*ichorv1alpha1.TalosMachine))
	})
	if err != nil {
		return fmt.Errorf("index %s: %w", IndexNodeName, err)
	}
	return nil
}

// NodeNames are the node names a machine answers to, as IndexNodeName
// indexes it.
func NodeNames(m *ichorv1alpha1.TalosMachine) []string {
	names := []string{}
	for _, n := range []string{m.Status.NodeName, m.Spec.Hostname} {
		if n != "" && (len(names) == 0 || names[0] != n) {
			names = append(names, n)
		}
	}
	return names
}

// Find is the managed machine answering to node name node (its
// status.nodeName or, before that is known, its spec.hostname) among those
// keep accepts; nil when none does. A recorded node name is a stronger match
// than a hostname; among equals the order is fixed (namespace, name), so the
// same request always meets the same machine.
func Find(ctx context.Context, reader client.Reader, node string, keep func(*ichorv1alpha1.TalosMachine) (bool, error)) (*ichorv1alpha1.TalosMachine, error) {
	found, err := FindAll(ctx, reader, node, keep)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	if len(found) > 1 {
		log.FromContext(ctx).Info("several machines have this node name; using the first",
			"node", node, "machine", client.ObjectKeyFromObject(&found[0]))
	}
	return &found[0], nil
}

// FindAll is every machine Find chooses among, in its order.
func FindAll(ctx context.Context, reader client.Reader, node string, keep func(*ichorv1alpha1.TalosMachine) (bool, error)) ([]ichorv1alpha1.TalosMachine, error) {
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
