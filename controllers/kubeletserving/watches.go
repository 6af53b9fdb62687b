package kubeletserving

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// renewalMark is the share of a kubelet serving certificate's lifetime after
// which its kubelet may ask for the next: client-go's certificate manager
// rotates at a jittered 70 to 90% of it.
const renewalMark = 0.7

// keepWatches watches the identity of the cluster's machines that are
// expected to ask for a certificate soon: those with no unexpired recorded
// certificate (a node joining, or one whose request is pending) and those
// past the renewal mark of theirs. The others, most of a settled fleet, hold
// no connection; a request of theirs is read from the node at once. It says
// when the next machine reaches its mark (zero: none), to look again then.
func (r *Reconciler) keepWatches(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, now time.Time) (next time.Duration, err error) {
	if !r.NodeReaders.Watch {
		return 0, nil
	}
	var machines ichorv1alpha1.TalosMachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(cluster.Namespace), client.MatchingFields{IndexCluster: cluster.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("list machines of the cluster: %w", err)
	}
	var endpoints []string
	for i := range machines.Items {
		m := &machines.Items[i]
		if m.Spec.Endpoint == "" {
			continue
		}
		mark, expected := renewalDue(m.Status.KubeletServingCertificate, now)
		if expected {
			endpoints = append(endpoints, m.Spec.Endpoint)
			continue
		}
		if d := mark.Sub(now) + time.Second; next == 0 || d < next {
			next = d
		}
	}
	if err := r.NodeReaders.Keep(ctx, cluster, endpoints); err != nil {
		return 0, fmt.Errorf("watch the machines' identities: %w", err)
	}
	return next, nil
}

// renewalDue says whether a machine with this recorded certificate is
// expected to ask for one now, and if not, from when it is.
func renewalDue(cert *ichorv1alpha1.KubeletServingCertificateStatus, now time.Time) (mark time.Time, due bool) {
	if cert == nil || !cert.NotAfter.After(now) {
		return time.Time{}, true
	}
	life := cert.NotAfter.Sub(cert.IssuedAt.Time)
	mark = cert.IssuedAt.Add(time.Duration(float64(life) * renewalMark))
	return mark, !now.Before(mark)
}

// stopWatches ends every identity watch when the manager stops, on every
// replica (a replica that is not the leader serves its shards).
type stopWatches struct{ n *NodeReaders }

func (s stopWatches) Start(ctx context.Context) error {
	<-ctx.Done()
	s.n.Stop()
	return nil
}

func (stopWatches) NeedLeaderElection() bool { return false }
