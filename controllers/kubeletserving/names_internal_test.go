package kubeletserving

import (
	"context"
	"slices"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// A cluster's full pass looks only at the requests that are its own to
// decide or record (its machines', and those no judging cluster's machine
// answers to), the same ones machineFor leaves it: over K clusters judging
// one API server, each request is looked at by one pass, not K. Of those it
// leaves out the ones with nothing left to do.
func TestAFullPassLooksOnlyAtItsOwnRequests(t *testing.T) {
	ctx := context.Background()
	scheme, err := kube.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	clusterObj := func(ns, name string) *ichorv1alpha1.TalosCluster {
		c := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		c.Spec.Security.KubeletServingCertificates.Enabled = true
		return c
	}
	machine := func(ns, name, clusterName string) *ichorv1alpha1.TalosMachine {
		m := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		m.Spec.ClusterName, m.Spec.Hostname = clusterName, name
		return m
	}
	objs := []client.Object{
		clusterObj("a", "alpha"), clusterObj("b", "beta"), clusterObj("c", "unnamed"),
		machine("a", "node-a", "alpha"), machine("b", "node-b", "beta"), machine("c", "node-c", "unnamed"),
		// A name both judging clusters' machines answer to: both look, and
		// the rule leaves it pending (MachineAmbiguous).
		machine("a", "node-both", "alpha"), machine("b", "node-both", "beta"),
		// A judging cluster of the same name in another namespace: its
		// machine is not alpha's.
		clusterObj("b", "alpha"), machine("b", "node-b-alpha", "alpha"),
	}
	for i, node := range []string{"node-a", "node-b", "node-c", "node-both", "nobody", "node-b-alpha"} {
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject(node)})
		if err != nil {
			t.Fatal(err)
		}
		csr := csrgen.ServingObject("csr-"+node, node, req)
		csr.UID = types.UID(rune('0' + i))
		objs = append(objs, csr)
	}
	// Decided requests of alpha's machine: one whose certificate node-a has
	// recorded and one denied have nothing left to do; one approved and
	// issued but not recorded yet is looked at, to record it.
	recordedMachine := machine("a", "node-rec", "alpha")
	recordedMachine.Status.KubeletServingCertificate = &ichorv1alpha1.KubeletServingCertificateStatus{Request: "csr-recorded"}
	objs = append(objs, recordedMachine, machine("a", "node-issued", "alpha"), machine("a", "node-denied", "alpha"))
	for i, c := range []struct{ name, node, verdict string }{
		{"csr-recorded", "node-rec", "Approved"}, {"csr-issued", "node-issued", "Approved"}, {"csr-denied", "node-denied", "Denied"},
	} {
		req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject(c.node)})
		if err != nil {
			t.Fatal(err)
		}
		csr := csrgen.ServingObject(c.name, c.node, req)
		csr.UID = types.UID(rune('a' + i))
		csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
			Type: certificatesv1.RequestConditionType(c.verdict), Status: "True",
		}}
		if c.verdict == "Approved" {
			csr.Status.Certificate = []byte("issued")
		}
		objs = append(objs, csr)
	}
	other := csrgen.ServingObject("csr-client", "node-b", nil)
	other.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
	objs = append(objs, other)

	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	if err := AddIndexes(ctx, indexerOf{b}); err != nil {
		t.Fatal(err)
	}
	c := b.Build()
	local, err := cluster.ParseLocal([]string{"a/alpha", "b/beta", "b/alpha"})
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Client: c, LocalClusters: local}
	p := &pass{r: r, cluster: clusterObj("a", "alpha"), target: &target{reader: c, local: true, names: &r.localNames}}

	got, live, err := p.requestsToLookAt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The memos are kept for every request the API server holds, looked at
	// or not: a decided one may still be waited on by an older pass.
	if len(live) != 9 {
		t.Errorf("%d requests found in the API server, want every kubelet-serving one (9)", len(live))
	}
	var names []string
	for _, csr := range got {
		names = append(names, csr.Name)
	}
	slices.Sort(names)
	// node-c's machine belongs to a cluster the operator did not name: it
	// counts for nothing here, so its request is nobody's machine's.
	want := []string{"csr-issued", "csr-nobody", "csr-node-a", "csr-node-both", "csr-node-c"}
	if !slices.Equal(names, want) {
		t.Errorf("looked at %v, want %v", names, want)
	}
	for _, csr := range got {
		mine, _, others, err := p.machineFor(ctx, r.localNames.of(&csr))
		if err != nil {
			t.Fatal(err)
		}
		if mine == nil && others {
			t.Errorf("%s is looked at, but machineFor gives it to another cluster", csr.Name)
		}
	}

	// A remote API server's requests are all its one cluster's, but for
	// those settled.
	p.target = &target{reader: c, names: &nodeNames{}}
	if got, _, err = p.requestsToLookAt(ctx); err != nil || len(got) != 7 {
		t.Errorf("remote: looked at %d requests (%v), want every unsettled kubelet-serving one (7)", len(got), err)
	}
}

// Requests gone from the API server are forgotten by the next full pass.
func TestNodeNamesOfGoneRequestsAreForgotten(t *testing.T) {
	var n nodeNames
	req, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1")})
	if err != nil {
		t.Fatal(err)
	}
	csr := csrgen.ServingObject("csr-1", "worker-1", req)
	csr.UID = "uid-1"
	if got := n.of(csr); got != "worker-1" {
		t.Fatalf("node name %q, want worker-1", got)
	}
	n.keepOnly(map[types.UID]bool{"uid-1": true})
	if len(n.m) != 1 {
		t.Fatalf("%d names kept, want 1", len(n.m))
	}
	n.keepOnly(map[types.UID]bool{})
	if len(n.m) != 0 {
		t.Errorf("%d names kept after the request is gone, want 0", len(n.m))
	}
}

// indexerOf registers the reconciler's indexes on a fake client's builder.
type indexerOf struct{ b *fake.ClientBuilder }

func (i indexerOf) IndexField(_ context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	i.b.WithIndex(obj, field, extract)
	return nil
}

// A node name that a machine of a cluster being deleted answers to as well
// is the live cluster's alone: the deleting one judges nothing (review 224
// F7), so the request is neither ambiguous (MachineAmbiguous) nor left to
// the other cluster, as once that cluster is gone.
func TestANameSharedWithAClusterBeingDeletedIsTheLiveClusters(t *testing.T) {
	ctx := context.Background()
	scheme, err := kube.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, deleting := range []bool{false, true} {
		alpha := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "alpha"}}
		beta := &ichorv1alpha1.TalosCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "beta"}}
		for _, c := range []*ichorv1alpha1.TalosCluster{alpha, beta} {
			c.Spec.Security.KubeletServingCertificates.Enabled = true
		}
		if deleting {
			// Held by another controller's finalizer.
			now := metav1.Now()
			beta.DeletionTimestamp, beta.Finalizers = &now, []string{"example.com/teardown"}
		}
		objs := []client.Object{alpha, beta}
		for _, m := range []types.NamespacedName{{Namespace: "a", Name: "alpha"}, {Namespace: "b", Name: "beta"}} {
			machine := &ichorv1alpha1.TalosMachine{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: "node-shared"}}
			machine.Spec.ClusterName, machine.Spec.Hostname = m.Name, "node-shared"
			objs = append(objs, machine)
		}
		b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
		if err := AddIndexes(ctx, indexerOf{b}); err != nil {
			t.Fatal(err)
		}
		c := b.Build()
		local, err := cluster.ParseLocal([]string{"a/alpha", "b/beta"})
		if err != nil {
			t.Fatal(err)
		}
		r := &Reconciler{Client: c, LocalClusters: local}
		p := &pass{r: r, cluster: alpha, target: &target{reader: c, local: true, names: &r.localNames}}
		mine, candidates, others, err := p.machineFor(ctx, "node-shared")
		if err != nil {
			t.Fatal(err)
		}
		if mine == nil || mine.Namespace != "a" {
			t.Fatalf("beta deleting %t: alpha's own machine not found (%v)", deleting, mine)
		}
		wantCandidates, wantOthers := 2, true
		if deleting {
			wantCandidates, wantOthers = 1, false
		}
		if candidates != wantCandidates || others != wantOthers {
			t.Errorf("beta deleting %t: %d candidates (others %t), want %d (others %t)", deleting, candidates, others, wantCandidates, wantOthers)
		}
	}
}
