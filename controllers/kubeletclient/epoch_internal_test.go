package kubeletclient

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
)

// A machine or cluster that goes changes no epoch, and is forgotten: the
// epoch keeps nothing of deleted objects for the life of the process.
func TestADeletedMachineOrClusterIsForgottenWithoutANewEpoch(t *testing.T) {
	local := &cluster.Local{}
	local.Add(types.NamespacedName{Namespace: "ns", Name: "demo"})
	r := &Reconciler{LocalClusters: local}
	ctx := context.Background()
	machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", UID: types.UID("uid-m")}}
	machine.Spec.ClusterName, machine.Status.NodeName, machine.Spec.Hostname = "demo", "worker-1", "worker-1"
	machineState := "ns/demo/worker-1/worker-1"
	cluster := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "demo", UID: types.UID("uid-c")}}
	clusterState := "judges" // named, no kubeconfigRef

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

// A cluster that judges nothing here (not named in --local-clusters, or
// with a kubeconfigRef) changes no lookup: made, changed and deleted in a
// loop it moves no epoch (review of 2026-12-05). One that stops judging is
// a change.
func TestAClusterThatJudgesNothingHereMovesNoEpoch(t *testing.T) {
	local := &cluster.Local{}
	local.Add(types.NamespacedName{Namespace: "ns", Name: "named"})
	r := &Reconciler{LocalClusters: local}
	ctx := context.Background()
	clusters := enqueueNoting(r.clusterToRequests)
	for i := range 10 {
		tenant := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "t", UID: types.UID(fmt.Sprint("uid-t-", i))}}
		clusters.Create(ctx, event.CreateEvent{Object: tenant}, nil)
		changed := tenant.DeepCopy()
		changed.Spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "kc"}
		clusters.Update(ctx, event.UpdateEvent{ObjectOld: tenant, ObjectNew: changed}, nil)
		clusters.Delete(ctx, event.DeleteEvent{Object: changed}, nil)
	}
	assert.Equal(t, uint64(0), r.machineEpoch.Get())

	named := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "named", UID: "uid-named"}}
	clusters.Create(ctx, event.CreateEvent{Object: named}, nil)
	assert.Equal(t, uint64(1), r.machineEpoch.Get(), "a cluster that judges here appeared")
	remote := named.DeepCopy()
	remote.Spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "kc"}
	clusters.Update(ctx, event.UpdateEvent{ObjectOld: named, ObjectNew: remote}, nil)
	assert.Equal(t, uint64(2), r.machineEpoch.Get(), "it stopped judging here")
}
