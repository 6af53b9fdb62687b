package talosnode

import (
	"testing"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A watch takes in only the three resources' arrivals, changes and ends:
// an event of another kind that carries one (Bootstrapped, Noop) is not its
// arrival, nor is a resource of another ID or namespace (review 261 F5, T4).
// The Talos API test server sends none of these: the events are made here.
func TestAWatchTakesInOnlyTheResourcesNews(t *testing.T) {
	nodeIP := k8s.NewNodeIP(k8s.NamespaceName, k8s.KubeletID)
	nodeIP.TypedSpec().Addresses = nil
	nodename := k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID)
	nodename.TypedSpec().Nodename = "worker-1"
	hostname := network.NewHostnameStatus(network.NamespaceName, network.HostnameID)
	hostname.TypedSpec().Hostname = "worker-1"
	etcd := k8s.NewNodeIP(k8s.NamespaceName, "etcd")
	elsewhere := k8s.NewNodename(network.NamespaceName, k8s.NodenameID)

	var n nodeWatch
	for _, ev := range []state.Event{
		{Type: state.Bootstrapped, Resource: nodeIP},
		{Type: state.Noop, Resource: nodename},
		{Type: state.Created, Resource: etcd},
		{Type: state.Created, Resource: elsewhere},
		{Type: state.Created, Resource: hostname},
	} {
		require.NoError(t, n.apply(ev))
	}
	assert.False(t, n.complete(), "an event that is no news of a resource was taken for its arrival")

	require.NoError(t, n.apply(state.Event{Type: state.Created, Resource: nodeIP}))
	require.NoError(t, n.apply(state.Event{Type: state.Updated, Resource: nodename}))
	assert.True(t, n.complete())
	require.NoError(t, n.apply(state.Event{Type: state.Destroyed, Resource: nodename}))
	assert.False(t, n.complete(), "a resource destroyed was kept")
}

// A direct read refuses an answer that is not the resource asked for, as a
// watch ignores one (review 261 F2).
func TestAReadRefusesAnotherResourceForTheOneAsked(t *testing.T) {
	asked := []*resource.Metadata{
		k8s.NewNodeIP(k8s.NamespaceName, k8s.KubeletID).Metadata(),
		k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID).Metadata(),
		network.NewHostnameStatus(network.NamespaceName, network.HostnameID).Metadata(),
	}
	require.NoError(t, answeredAsAsked(asked...))
	assert.ErrorContains(t, answeredAsAsked(k8s.NewNodeIP(k8s.NamespaceName, "etcd").Metadata(), asked[1], asked[2]),
		"answered NodeIPs.kubernetes.talos.dev k8s/etcd")
	assert.Error(t, answeredAsAsked(asked[0], k8s.NewNodename(network.NamespaceName, k8s.NodenameID).Metadata(), asked[2]))
}
