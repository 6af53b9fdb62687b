package cli

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// The real `ichor manager` with its default denied networks connects to
// nothing on its own loopback that a tenant or a machine names: neither the
// API server a kubeconfigRef names (the cluster says RemoteServerAddressRefused)
// nor the Talos API a TalosMachine's endpoint names (its node's request stays
// pending, the decision saying why), and neither server sees a connection.
// The flags' defaults, the manager's options and the dialers are the ones
// an operator runs.
func TestTheManagerReachesNothingOnItsLoopbackForATenantOrAMachine(t *testing.T) {
	ctx := t.Context()
	// A local cluster whose machine's endpoint is a Talos API on loopback.
	const local = "netguard-local"
	w := startWorker(t, local)
	env, node := w.env, w.node

	// A tenant's cluster whose kubeconfig names an API server on loopback.
	var conns atomic.Int32
	tenantServer := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "{}", http.StatusForbidden)
	}))
	tenantServer.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	tenantServer.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	tenantServer.StartTLS()
	t.Cleanup(tenantServer.Close)
	const tenant = "netguard-tenant"
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}))
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret(tenant, "talos-secrets")))
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tenantServer.Certificate().Raw}))
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "kubeconfig", Annotations: map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "tenant"}},
		Data: map[string][]byte{ichorv1alpha1.DefaultKubeconfigKey: []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: ` + tenantServer.URL + `
    certificate-authority-data: ` + ca + `
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user:
    token: tenant-token
`)},
	}))
	require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "tenant"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			KubeconfigRef: &ichorv1alpha1.KubeconfigReference{Name: "kubeconfig"},
			Security:      ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{Enabled: true}},
		},
	}))

	// The harness lets its managers reach the tests' Talos APIs on
	// loopback; this one is given the default back (the flag's values add
	// up after the first).
	m, err := harness.StartManager(harness.ManagerOptions{
		Binary: w.ichor, Dir: w.dir, Name: "manager", Kubeconfig: w.kubeconfig,
		Args: []string{"--webhook=false", "--metrics-bind-address=0", "--health-probe-bind-address=0", "--local-clusters=" + local + "/demo", "--node-denied-networks=default"},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = m.Stop(15 * time.Second)
		if t.Failed() {
			t.Logf("manager log:\n%s", m.TailLog(40))
		}
	})

	var cond *metav1.Condition
	require.Eventually(t, func() bool {
		var c ichorv1alpha1.TalosCluster
		require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: tenant, Name: "tenant"}, &c))
		cond = meta.FindStatusCondition(c.Status.Conditions, ichorv1alpha1.ConditionKubeletServingCertificates)
		return cond != nil && cond.Reason == kubeletserving.ReasonRemoteServerAddressRefused
	}, 2*time.Minute, 100*time.Millisecond, "the tenant's cluster does not say its server is refused: %+v", cond)
	assert.Equal(t, metav1.ConditionFalse, cond.Status)
	assert.Contains(t, cond.Message, "is in 127.0.0.0/8, a network the manager does not connect to: nothing was sent to it")

	name := submitAs(t, env, "system:node:worker-1", csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), IPs: []net.IP{net.ParseIP("10.5.0.2")}})
	var nodeError string
	require.Eventually(t, func() bool {
		nodeError = decidedNodeError(t, m.DecisionLog, name)
		return nodeError != ""
	}, 2*time.Minute, 100*time.Millisecond, "worker-1's request is never decided")
	assert.Contains(t, nodeError, "is in 127.0.0.0/8, a network the manager does not connect to: nothing was sent to it")
	assert.Nil(t, harness.Verdict(env.GetCSR(t, name)), "the request is left pending")

	assert.Zero(t, conns.Load(), "the tenant's server on loopback was connected to")
	assert.Zero(t, node.Connections(), "the Talos API on loopback was connected to")
}

// decidedNodeError is the node's error in the last kubelet serving decision
// of csr in the decision log at path, or "" when there is none yet.
func decidedNodeError(t *testing.T, path, csr string) string {
	t.Helper()
	f, err := os.Open(path) //nolint:gosec // G304: the test's own log
	require.NoError(t, err)
	defer f.Close()
	entries, _, err := decisionlog.Read(f)
	if err != nil {
		return "" // nothing logged yet
	}
	last := ""
	for _, e := range entries {
		var in struct {
			Node struct{ Error string } `json:"node"`
		}
		if e.Path == engine.PathKubeletServing && e.Object() == "csr/"+csr && json.Unmarshal(e.Input, &in) == nil {
			last = in.Node.Error
		}
	}
	return last
}
