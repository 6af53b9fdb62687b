package kubeletserving

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// keepWatches watches the identity of the cluster's machines that are
// joining: no unexpired certificate recorded, and the TalosMachine made within
// joinWindow; the newest first, as many as NodeReaders.WatchMax leaves room
// for. A watch is made anew at every freshness bound, so it pays only for a
// request that comes soon: a machine that has not asked within the window
// may never ask, and one with a certificate asks again only near its
// renewal, months away (watching it until then would cost tens of thousands
// of handshakes to save one). Their requests are read from the node at once,
// as every request of a machine not watched is.
func (r *Reconciler) keepWatches(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, now time.Time) error {
	if !r.NodeReaders.Watch {
		return nil
	}
	var machines ichorv1alpha1.TalosMachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(cluster.Namespace), client.MatchingFields{IndexCluster: cluster.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list machines of the cluster: %w", err)
	}
	var expected []*ichorv1alpha1.TalosMachine
	for i := range machines.Items {
		m := &machines.Items[i]
		cert := m.Status.KubeletServingCertificate
		joining := now.Sub(m.CreationTimestamp.Time) < joinWindow
		if m.Spec.Endpoint != "" && joining && (cert == nil || !cert.NotAfter.After(now)) {
			expected = append(expected, m)
		}
	}
	// A machine that joined long ago and never asked is the first to go
	// without a watch when there is not room for all.
	slices.SortFunc(expected, func(a, b *ichorv1alpha1.TalosMachine) int {
		if c := b.CreationTimestamp.Compare(a.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	endpoints := make([]string, len(expected))
	for i, m := range expected {
		endpoints[i] = m.Spec.Endpoint
	}
	if err := r.NodeReaders.Keep(ctx, cluster, endpoints); err != nil {
		return fmt.Errorf("watch the machines' identities: %w", err)
	}
	return nil
}

// joinWindow is how long after its TalosMachine is made a machine without a
// certificate counts as joining.
const joinWindow = time.Hour

// stopWatches ends every identity watch when the manager stops, on every
// replica (a replica that is not the leader serves its shards).
type stopWatches struct{ n *NodeReaders }

func (s stopWatches) Start(ctx context.Context) error {
	<-ctx.Done()
	s.n.Stop()
	return nil
}

func (stopWatches) NeedLeaderElection() bool { return false }
