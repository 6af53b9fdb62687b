package manager

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/controllers/kubeletclient"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
)

// A person's decision is recorded for each signer whose requests Ichor
// decides here: the kubelet serving signer when a cluster judges this API
// server, and the kubelet client signer whenever its approver runs, which it
// does with no cluster named too (review of 2026-12-06: a person's approval
// of a kubelet client request, a node credential, was not recorded then).
func TestPersonsDecisionsAreRecordedForEverySignerIchorDecides(t *testing.T) {
	none, err := cluster.ParseLocal(nil)
	require.NoError(t, err)
	demo, err := cluster.ParseLocal([]string{"demo/demo"})
	require.NoError(t, err)
	for _, c := range []struct {
		local  *cluster.Local
		client bool
		want   []string
	}{
		{none, false, nil},
		{none, true, []string{kubeletclient.SignerName}},
		{demo, false, []string{certificatesv1.KubeletServingSignerName}},
		{demo, true, []string{certificatesv1.KubeletServingSignerName, kubeletclient.SignerName}},
	} {
		assert.Equal(t, c.want, decidedSigners(Options{LocalClusters: c.local, KubeletClientApprover: c.client}), "clusters %d, client approver %v", c.local.Len(), c.client)
	}
}
