package kubeletclient

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// A machine or cluster that goes changes no epoch, and is forgotten: the
// epoch keeps nothing of deleted objects for the life of the process.
func TestADeletedMachineOrClusterIsForgottenWithoutANewEpoch(t *testing.T) {
	r := &Reconciler{}
	ctx := context.Background()
	machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID("uid-m")}}
	machine.Spec.ClusterName, machine.Status.NodeName, machine.Spec.Hostname = "demo", "worker-1", "worker-1"
	machineState := "ns/demo/worker-1/worker-1"
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo", UID: types.UID("uid-c")}}
	clusterState := "true" // no kubeconfigRef

	// No request is pending, so no event enqueues one: the queue is unused.
	machines, clusters := enqueueNoting(r.machineToRequests), enqueueNoting(r.clusterToRequests)
	machines.Create(ctx, event.CreateEvent{Object: machine}, nil)
	clusters.Create(ctx, event.CreateEvent{Object: cluster}, nil)
	assert.Equal(t, uint64(2), r.machineEpoch.Get())
	assert.False(t, r.machineEpoch.Note(machine.UID, machineState), "the machine's state is not the one noted")
	assert.False(t, r.machineEpoch.Note(cluster.UID, clusterState), "the cluster's state is not the one noted")

	machines.Delete(ctx, event.DeleteEvent{Object: machine}, nil)
	clusters.Delete(ctx, event.DeleteEvent{Object: cluster}, nil)
	assert.Equal(t, uint64(2), r.machineEpoch.Get(), "a deletion changed the epoch")
	assert.True(t, r.machineEpoch.Note(machine.UID, machineState), "a deleted machine is still remembered")
	assert.True(t, r.machineEpoch.Note(cluster.UID, clusterState), "a deleted cluster is still remembered")

	// Deleted and made again under its name while the watch was down: the
	// informer's relist tells it as an update, and the old one is forgotten.
	again := machine.DeepCopy()
	again.UID = "uid-m-again"
	machines.Update(ctx, event.UpdateEvent{ObjectOld: machine, ObjectNew: again}, nil)
	assert.False(t, r.machineEpoch.Note(again.UID, machineState), "the new machine is not remembered")
	assert.True(t, r.machineEpoch.Note(machine.UID, machineState), "the machine replaced is still remembered")
}
