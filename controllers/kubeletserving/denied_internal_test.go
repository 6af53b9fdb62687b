package kubeletserving

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/kube"
)

// A denial is said of a machine only for a request of its own name that no
// other judging machine answers to, made since the machine was (review 251
// F2: on an API server two clusters judge, a shared name showed the other
// cluster's request and its message); and briefly, whatever the tenant's
// server wrote (review 251 F1).
func TestADenialIsSaidOnlyOfTheMachinesOwnRequestAndBriefly(t *testing.T) {
	ctx := context.Background()
	scheme, err := kube.Scheme()
	require.NoError(t, err)
	t0 := time.Unix(1_000_000, 0)
	clusterObj := func(ns, name string) *ichorv1alpha1.TalosCluster {
		c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), Generation: 1}}
		c.Spec.Security.KubeletServingCertificates.Enabled = true
		return c
	}
	machine := func(ns, name, hostname, clusterName string, created time.Time) *ichorv1alpha1.TalosMachine {
		m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), CreationTimestamp: metav1.NewTime(created)}}
		m.Spec.ClusterName, m.Spec.Hostname = clusterName, hostname
		return m
	}
	denied := func(node, name, message string, created time.Time) *certificatesv1.CertificateSigningRequest {
		csr := csrOf("system:node:"+node, name, created)
		csr.UID = types.UID("uid-" + name)
		csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: "True", Reason: "IPNotNode", Message: message}}
		return &csr
	}
	alpha := clusterObj("a", "alpha")
	own := machine("a", "own", "node-1", "alpha", t0)
	shared := machine("a", "shared", "node-2", "alpha", t0)
	remade := machine("a", "remade", "node-3", "alpha", t0.Add(time.Hour))
	loud := machine("a", "loud", "node-4", "alpha", t0)
	huge := strings.Repeat("\xff\x1b", 1<<20)
	objs := []client.Object{alpha, clusterObj("b", "beta"), own, shared, remade, loud,
		// Beta's machine answers to node-2 as well.
		machine("b", "theirs", "node-2", "beta", t0),
		denied("node-1", "csr-own", "IPNotNode: not its address", t0.Add(time.Minute)),
		denied("node-2", "csr-theirs", "IPNotNode: beta's secret addresses", t0.Add(time.Minute)),
		denied("node-3", "csr-before-the-machine", "IPNotNode: an older machine's", t0.Add(time.Minute)),
		denied("node-4", "csr-"+strings.Repeat("n", 4096), huge, t0.Add(time.Minute)),
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	require.NoError(t, AddIndexes(ctx, indexerOf{b}))
	c := b.Build()
	local, err := cluster.ParseLocal([]string{"a/alpha", "b/beta"})
	require.NoError(t, err)
	r := &Reconciler{Client: c, Engine: &decider{}, LocalClusters: local, Clock: clocktesting.NewFakeClock(t0.Add(2 * time.Hour))}
	p := &pass{r: r, cluster: alpha, now: r.Clock.Now(), target: &target{reader: c, local: true, names: &r.localNames}}

	got := deniedOf(ctx, p, []*ichorv1alpha1.TalosMachine{loud, own, remade, shared})
	t.Log(got)
	assert.Contains(t, got, `; own: its node's newest request, CSR "csr-own", was denied (IPNotNode): IPNotNode: not its address`)
	assert.NotContains(t, got, "beta's secret", "another cluster's machine's request")
	assert.NotContains(t, got, "shared:")
	assert.NotContains(t, got, "remade:", "a request older than the machine")
	assert.Contains(t, got, "; loud: its node's newest request")
	assert.True(t, utf8.ValidString(got))
	assert.NotContains(t, got, "\x1b", "a control character reaches the condition")
	assert.Less(t, len(got), 2*maxNotRecordedNote+200, "the notes are not cut")

	assert.Empty(t, deniedOf(ctx, nil, []*ichorv1alpha1.TalosMachine{own}), "without a pass")
}
