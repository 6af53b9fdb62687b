package kubeletserving_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// TestReadyFollowsTheConfigurationNotTheNodes: Ready is what kubectl wait,
// Flux and Argo CD gate on. A node joining (its request pending until its
// Talos API answers) and a node the rule denies for good are node progress,
// which KubeletServingCertificates says; Ready stays True through both, for
// the current generation. A configuration Ichor refuses (a kubeconfigRef it
// cannot read, a secrets bundle it cannot use) makes it False with the
// refusal's reason, and putting it right makes it True again.
func TestReadyFollowsTheConfigurationNotTheNodes(t *testing.T) {
	f := newFixture(t, false)
	f.machine("ready-1", "10.29.0.2")
	k1, err := env.StartKubelet(f.ctx, harness.KubeletOptions{NodeName: "ready-1", IPs: []net.IP{net.ParseIP("10.29.0.2")}})
	require.NoError(t, err)
	t.Cleanup(k1.Stop)
	f.waitCondition(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionTrue)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// A node joins: its machine is registered and its kubelet asks before
	// its Talos API answers, so its request is pending (NodeUnreadable).
	joining := f.machine("ready-2", "10.29.0.3")
	joining.SetUnavailable(true)
	pending := submit(t, nodeClient(t, "system:node:ready-2", "system:nodes"), "ready-join",
		csrgen.Request{Subject: csrgen.NodeSubject("ready-2"), IPs: []net.IP{net.ParseIP("10.29.0.3")}})
	loggedPending(t, pending, "NodeUnreadable")
	ready := f.readyWhen(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, "ready-2")
	assert.Equal(t, metav1.ConditionTrue, ready.Status, "a node join made Ready %s: %s", ready.Status, ready.Message)
	assert.Equal(t, ichorv1alpha1.ReasonServing, ready.Reason)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// A node the rule denies (it asks for another node's address) stays
	// without a certificate for ever: node progress again, not a fault of
	// the cluster's service.
	f.machine("ready-3", "10.29.0.4")
	denied := submit(t, nodeClient(t, "system:node:ready-3", "system:nodes"), "ready-denied",
		csrgen.Request{Subject: csrgen.NodeSubject("ready-3"), IPs: []net.IP{net.ParseIP("10.29.0.2")}})
	requireDenied(t, denied, "IPNotNode")
	ready = f.readyWhen(ichorv1alpha1.ConditionKubeletServingCertificates, metav1.ConditionFalse, "ready-3")
	assert.Equal(t, metav1.ConditionTrue, ready.Status, "a denied node made Ready %s: %s", ready.Status, ready.Message)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// The configuration refused: a kubeconfigRef naming a Secret that does
	// not exist. Nothing is judged, and Ready says so for the new generation.
	c := f.get()
	c.Spec.KubeconfigRef = &ichorv1alpha1.KubeconfigReference{Name: "no-such-kubeconfig"}
	require.NoError(t, env.Client.Update(f.ctx, c))
	ready = f.waitReady(metav1.ConditionFalse, kubeletserving.ReasonKubeconfigUnreadable)
	assert.Contains(t, ready.Message, "the configuration is refused: ")
	assert.Contains(t, ready.Message, `"no-such-kubeconfig"`)
	// What its requests were is of a look no longer made (review 169).
	assert.Nil(t, meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingRequests))

	// Put right: served again, though two nodes still have no certificate.
	c = f.get()
	c.Spec.KubeconfigRef = nil
	require.NoError(t, env.Client.Update(f.ctx, c))
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)

	// A secrets bundle that cannot be used: no node's identity can be
	// read, so nothing is approved, whatever the nodes' certificates say
	// (review 169: Ready stayed True, Serving).
	c = f.get()
	c.Spec.SecretsRef.Name = "no-such-secrets"
	require.NoError(t, env.Client.Update(f.ctx, c))
	ready = f.waitReady(metav1.ConditionFalse, ichorv1alpha1.ReasonSecretsUnusable)
	assert.Contains(t, ready.Message, "the configuration is refused: the secrets bundle cannot be used")
	assert.Contains(t, ready.Message, `"no-such-secrets"`)
	c = f.get()
	c.Spec.SecretsRef.Name = "talos-secrets"
	require.NoError(t, env.Client.Update(f.ctx, c))
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)
	assert.False(t, meta.IsStatusConditionTrue(f.get().Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates))
	assert.Nil(t, harness.Verdict(env.GetCSR(t, pending)), "the joining node's request is still pending")
	assert.Equal(t, certificatesv1.CertificateDenied, decided(t, denied).Type)
}

// TestReadyIsFalseWhileNoMachinesTalosAPIAnswers: Ichor serves a cluster
// only through its machines' Talos API. When every machine it had to read
// has failed for UnreachableAfter, Ready is False (TalosAPIUnreachable,
// naming the machine and the error); when the node answers again its
// request is approved and Ready is True.
func TestReadyIsFalseWhileNoMachinesTalosAPIAnswers(t *testing.T) {
	f := newFixture(t, false)
	dark := f.machine("dark-1", "10.31.0.2")
	dark.SetUnavailable(true)
	pending := submit(t, nodeClient(t, "system:node:dark-1", "system:nodes"), "dark-1",
		csrgen.Request{Subject: csrgen.NodeSubject("dark-1"), IPs: []net.IP{net.ParseIP("10.31.0.2")}})
	loggedPending(t, pending, "NodeUnreadable")
	ready := f.waitReady(metav1.ConditionFalse, ichorv1alpha1.ReasonTalosAPIUnreachable)
	assert.Contains(t, ready.Message, "no machine's Talos API answered")
	assert.Contains(t, ready.Message, "dark-1: ")

	dark.SetUnavailable(false)
	assert.Equal(t, certificatesv1.CertificateApproved, decided(t, pending).Type)
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)
}

// TestARequestOfAnotherRequesterDoesNotTurnReadyFalse: anyone may ask in a
// node's name, and the machine that name picks is read (the rule then
// denies the requester); such a read, failing, says nothing of whether
// Ichor reaches the cluster, so Ready stays True however long it fails
// (hostile review F1).
func TestARequestOfAnotherRequesterDoesNotTurnReadyFalse(t *testing.T) {
	f := newFixture(t, false)
	dark := f.machine("dark-2", "10.31.1.2")
	dark.SetUnavailable(true)
	other := submit(t, nodeClient(t, "system:node:elsewhere", "system:nodes"), "dark-2-foreign",
		csrgen.Request{Subject: csrgen.NodeSubject("dark-2"), IPs: []net.IP{net.ParseIP("10.31.1.2")}})
	loggedPending(t, other, "NodeUnreadable")
	// Read again and again, well past UnreachableAfter (two seconds here),
	// each pass writing the conditions: Ready is True all along.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		ready := meta.FindStatusCondition(f.get().Status.Conditions, ichorv1alpha1.ConditionReady)
		if ready != nil {
			require.Equal(t, metav1.ConditionTrue, ready.Status, "a foreign requester's request made Ready %s: %s", ready.Status, ready.Message)
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.waitReady(metav1.ConditionTrue, ichorv1alpha1.ReasonServing)
}

// readyWhen waits until the condition typ has the status and its message
// names name, and returns Ready as the same object has it: the approver
// writes both in one status update, so this is Ready while that holds.
func (f *fixture) readyWhen(typ string, status metav1.ConditionStatus, name string) metav1.Condition {
	f.t.Helper()
	var ready *metav1.Condition
	require.Eventually(f.t, func() bool {
		cluster := f.get()
		c := meta.FindStatusCondition(cluster.Status.Conditions, typ)
		if c == nil || c.Status != status || !strings.Contains(c.Message, name) || c.ObservedGeneration != cluster.Generation {
			return false
		}
		ready = meta.FindStatusCondition(cluster.Status.Conditions, ichorv1alpha1.ConditionReady)
		return ready != nil
	}, wait, 100*time.Millisecond, "condition %s did not become %s naming %s", typ, status, name)
	assert.Equal(f.t, f.get().Generation, ready.ObservedGeneration)
	return *ready
}
