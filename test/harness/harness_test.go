package harness_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// controlPlaneProcesses are the children Stop must leave none of.
var controlPlaneProcesses = []string{"kube-apiserver", "etcd", "csrsigner"}

// TestHarness runs every check against one environment (a start costs seconds
// on two cores), then proves Stop leaves no process behind.
func TestHarness(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	begin := time.Now()
	env, err := harness.Start(ctx, harness.Options{})
	require.NoError(t, err)
	t.Logf("Start took %s", time.Since(begin).Round(time.Millisecond))

	stopped := false
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(env.TailLogs(40))
		}

		if !stopped {
			assert.NoError(t, env.Stop())
		}
	})

	children := childProcesses(t)
	for _, name := range controlPlaneProcesses {
		require.Contains(t, children, name, "%s should be running", name)
	}

	t.Run("KubeletServingCSRApprovedByHandIsSigned", func(t *testing.T) { testKubeletServing(ctx, t, env) })
	t.Run("ClientCertificateFromBundleCAAuthenticates", func(t *testing.T) { testBundleCAClient(ctx, t, env) })
	t.Run("TalosNodeAnswersIdentityRead", func(t *testing.T) { testTalosNode(ctx, t, env) })
	t.Run("CRDsAreInstalled", func(t *testing.T) { testCRDs(ctx, t, env) })
	t.Run("RBACIsEnforced", func(t *testing.T) { testRBAC(ctx, t, env) })
	t.Run("NodeRegistersAndRewritesItsNode", func(t *testing.T) { testNodeObject(ctx, t, env) })
	t.Run("SecretsBundleIsTalosctlFormat", func(t *testing.T) { testSecretsBundle(t, env) })
	t.Run("NothingApprovesButTheTest", func(t *testing.T) { testNoApprover(ctx, t, env) })

	if t.Failed() {
		return
	}

	begin = time.Now()
	require.NoError(t, env.Stop())
	stopped = true
	t.Logf("Stop took %s", time.Since(begin).Round(time.Millisecond))

	for _, name := range controlPlaneProcesses {
		pid := children[name]
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		assert.True(t, errors.Is(err, os.ErrNotExist), "%s (pid %d) still exists after Stop", name, pid)
	}

	assert.Empty(t, childProcesses(t), "control-plane processes left after Stop")

	_, err = os.Stat(env.WorkDir)
	assert.True(t, errors.Is(err, os.ErrNotExist), "temporary work directory left after Stop")
}

func TestStartReportsMissingBinaries(t *testing.T) {
	dir := t.TempDir()

	_, err := harness.Start(t.Context(), harness.Options{AssetsDir: dir})

	var missing *harness.AssetsMissingError
	require.ErrorAs(t, err, &missing)
	assert.Equal(t, []string{"kube-apiserver", "etcd", "csrsigner"}, missing.Missing)
	assert.ErrorContains(t, err, "control-plane binaries not found in "+dir+": run `make envtest-assets`")
}

// TestFailedStartLeavesNothing starts a control plane whose
// CSR signer dies at once: Start must report it with its log and
// stop the apiserver and etcd it had started.
func TestFailedStartLeavesNothing(t *testing.T) {
	realAssets, err := harness.DefaultAssetsDir()
	require.NoError(t, err)

	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		realAssets = dir
	}

	assets := t.TempDir()
	for _, name := range []string{"kube-apiserver", "etcd"} {
		require.NoError(t, os.Symlink(filepath.Join(realAssets, name), filepath.Join(assets, name)))
	}

	require.NoError(t, os.WriteFile(filepath.Join(assets, "csrsigner"),
		[]byte("#!/bin/sh\necho 'csrsigner: refusing to start' >&2\nexit 3\n"), 0o700))

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	env, err := harness.Start(ctx, harness.Options{AssetsDir: assets})
	require.Error(t, err)
	assert.Nil(t, env)
	t.Log(err)
	assert.ErrorContains(t, err, "the CSR signer exited")
	assert.ErrorContains(t, err, "csrsigner: refusing to start", "the error carries the log's tail")
	assert.Empty(t, childProcesses(t), "control-plane processes left after a failed Start")
}

func testKubeletServing(ctx context.Context, t *testing.T, env *harness.Env) {
	ips := []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("fd00::2")}

	kubelet, err := env.StartKubelet(ctx, harness.KubeletOptions{
		NodeName: "worker-1",
		DNSNames: []string{"worker-1"},
		IPs:      ips,
	})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)

	csr, err := kubelet.WaitForPendingCSR(ctx)
	require.NoError(t, err)

	assert.Equal(t, certificatesv1.KubeletServingSignerName, csr.Spec.SignerName)
	assert.Equal(t, "system:node:worker-1", csr.Spec.Username)
	assert.Contains(t, csr.Spec.Groups, harness.NodesGroup)
	assert.ElementsMatch(t, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}, csr.Spec.Usages,
		"an ECDSA key asks for no key encipherment, as in the kubelet")

	req := parseCSR(t, csr.Spec.Request)
	assert.Equal(t, "system:node:worker-1", req.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, req.Subject.Organization)
	assert.Equal(t, []string{"worker-1"}, req.DNSNames)
	assert.Len(t, req.IPAddresses, 2)

	assert.Nil(t, kubelet.Current(), "no certificate before approval")

	approve(ctx, t, env.Clientset, csr)

	leaf, err := kubelet.WaitForCertificate(ctx)
	require.NoError(t, err)

	assert.Equal(t, "system:node:worker-1", leaf.Subject.CommonName)
	assert.Equal(t, []string{"system:nodes"}, leaf.Subject.Organization)
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, leaf.ExtKeyUsage)
	assertSignedByKubernetesCA(t, env, leaf)

	current := kubelet.Current()
	require.NotNil(t, current)
	assert.Equal(t, leaf.Raw, current.Leaf.Raw)
	assert.FileExists(t, filepath.Join(kubelet.CertificateDir(), "kubelet-server-current.pem"))
}

func testBundleCAClient(ctx context.Context, t *testing.T, env *harness.Env) {
	certPEM, keyPEM := env.KubernetesCA()
	ca, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)

	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "alice", Organization: []string{"g"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca.Leaf, key.Public(), ca.PrivateKey)
	require.NoError(t, err)

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)

	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.CertData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	cfg.KeyData = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})

	review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().
		Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)

	assert.Equal(t, "alice", review.Status.UserInfo.Username)
	assert.Contains(t, review.Status.UserInfo.Groups, "g")
}

func testTalosNode(ctx context.Context, t *testing.T, env *harness.Env) {
	addrs := []netip.Addr{netip.MustParseAddr("10.5.0.3"), netip.MustParseAddr("fd00::3")}

	node, err := env.StartTalosNode(ctx, harness.NodeOptions{Name: "worker-2", Addresses: addrs})
	require.NoError(t, err)
	t.Cleanup(node.Stop)

	certPEM, keyPEM := env.OSCA()
	reader, err := talosnode.NewReader(talosnode.Options{CACertPEM: certPEM, CAKeyPEM: keyPEM})
	require.NoError(t, err)

	id, err := reader.Read(ctx, node.Endpoint())
	require.NoError(t, err)
	assert.Equal(t, talosnode.Identity{Nodename: "worker-2", Hostname: "worker-2", Addresses: []string{"10.5.0.3", "fd00::3"}}, id)

	node.SetUnavailable(true)
	_, err = reader.Read(ctx, node.Endpoint())
	require.Error(t, err, "an unavailable node is unreadable")
	node.SetUnavailable(false)
}

func testCRDs(ctx context.Context, t *testing.T, env *harness.Env) {
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14",
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "demo-secrets"},
		},
	}
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret("default", "demo-secrets")))
	require.NoError(t, env.Client.Create(ctx, cluster))

	var got ichorv1alpha1.TalosCluster
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "demo"}, &got))
	assert.Equal(t, ichorv1alpha1.DefaultSecretsBundleKey, got.Spec.SecretsRef.Key, "the CRD's default applies")

	for _, kind := range []string{"TalosMachine", "TalosCredentialRequest"} {
		_, err := env.Client.RESTMapper().RESTMapping(ichorv1alpha1.GroupVersion.WithKind(kind).GroupKind(), "v1alpha1")
		assert.NoError(t, err, kind)
	}
}

func testRBAC(ctx context.Context, t *testing.T, env *harness.Env) {
	cfg, err := env.UserConfig("mallory", "nobodies")
	require.NoError(t, err)

	_, err = kubernetes.NewForConfigOrDie(cfg).CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a user without bindings is refused, got %v", err)
}

func testNodeObject(ctx context.Context, t *testing.T, env *harness.Env) {
	kubelet, err := env.StartKubelet(ctx, harness.KubeletOptions{
		NodeName: "worker-3",
		DNSNames: []string{"worker-3"},
		IPs:      []net.IP{net.ParseIP("10.5.0.4")},
	})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)

	node, err := kubelet.RegisterNode(ctx)
	require.NoError(t, err)
	assert.Equal(t, []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "worker-3"},
		{Type: corev1.NodeInternalIP, Address: "10.5.0.4"},
	}, node.Status.Addresses)

	forged := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.5.0.99"}}
	require.NoError(t, kubelet.SetNodeAddresses(ctx, forged...))

	got, err := env.Clientset.CoreV1().Nodes().Get(ctx, "worker-3", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, forged, got.Status.Addresses)
}

func testSecretsBundle(t *testing.T, env *harness.Env) {
	var decoded secrets.Bundle
	require.NoError(t, yaml.Unmarshal(env.SecretsBundleYAML, &decoded))

	for _, key := range []string{"cluster:", "secrets:", "trustdinfo:", "certs:", "    etcd:", "    k8s:", "    k8saggregator:", "    k8sserviceaccount:", "    os:"} {
		assert.Contains(t, string(env.SecretsBundleYAML), key)
	}

	assert.Equal(t, env.SecretsBundle.Certs.K8s.Crt, decoded.Certs.K8s.Crt)
	assert.Equal(t, env.SecretsBundle.Certs.OS.Key, decoded.Certs.OS.Key)

	onDisk, err := os.ReadFile(env.SecretsBundlePath)
	require.NoError(t, err)
	assert.Equal(t, env.SecretsBundleYAML, onDisk)

	osCert, osKey := env.OSCA()
	assert.Equal(t, env.TalosCA().CertPEM, osCert)
	assert.Equal(t, env.TalosCA().KeyPEM, osKey)
	assert.True(t, bytes.Contains(osKey, []byte("ED25519 PRIVATE KEY")), "the OS CA key is Ed25519 as Talos makes it")
}

// testNoApprover checks that the control plane approves nothing: a kubelet's
// client-certificate renewal, which kube-controller-manager's csrapproving
// controller would approve at once, stays pending while a later CSR approved
// by hand is signed.
func testNoApprover(ctx context.Context, t *testing.T, env *harness.Env) {
	clientKubelet, err := env.StartKubelet(ctx, harness.KubeletOptions{
		NodeName:   "worker-4",
		SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
	})
	require.NoError(t, err)
	t.Cleanup(clientKubelet.Stop)

	renewal, err := clientKubelet.WaitForPendingCSR(ctx)
	require.NoError(t, err)
	assert.Empty(t, parseCSR(t, renewal.Spec.Request).DNSNames, "a client CSR has no SANs")

	serving, err := env.StartKubelet(ctx, harness.KubeletOptions{NodeName: "worker-5", IPs: []net.IP{net.ParseIP("10.5.0.5")}})
	require.NoError(t, err)
	t.Cleanup(serving.Stop)

	csr, err := serving.WaitForPendingCSR(ctx)
	require.NoError(t, err)
	approve(ctx, t, env.Clientset, csr)

	_, err = serving.WaitForCertificate(ctx)
	require.NoError(t, err)

	got, err := env.Clientset.CertificatesV1().CertificateSigningRequests().Get(ctx, renewal.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Empty(t, got.Status.Conditions, "the control plane must not approve")
	assert.Nil(t, clientKubelet.Current())

	// The signer runs kube-controller-manager's four signing controllers and
	// no other certificate controller (an approver would be one).
	signerLog, err := os.ReadFile(env.SignerLogPath)
	require.NoError(t, err)
	started := regexp.MustCompile(`"Starting certificate controller" name="([^"]+)"`).FindAllStringSubmatch(string(signerLog), -1)
	names := make([]string, 0, len(started))
	for _, m := range started {
		names = append(names, m[1])
	}
	assert.ElementsMatch(t, []string{"csrsigning-kubelet-serving", "csrsigning-kubelet-client", "csrsigning-kube-apiserver-client", "csrsigning-legacy-unknown"}, names)
}

func approve(ctx context.Context, t *testing.T, cs kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest) {
	t.Helper()

	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type:    certificatesv1.CertificateApproved,
		Status:  corev1.ConditionTrue,
		Reason:  "ApprovedByTest",
		Message: "approved by hand",
	})

	_, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func parseCSR(t *testing.T, data []byte) *x509.CertificateRequest {
	t.Helper()

	block, _ := pem.Decode(data)
	require.NotNil(t, block)

	req, err := x509.ParseCertificateRequest(block.Bytes)
	require.NoError(t, err)

	return req
}

func assertSignedByKubernetesCA(t *testing.T, env *harness.Env, leaf *x509.Certificate) {
	t.Helper()

	caPEM, _ := env.KubernetesCA()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))

	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	assert.NoError(t, err, "signed by the bundle's Kubernetes CA")
}

// childProcesses maps the name of each control-plane process whose parent is
// this test binary to its pid.
func childProcesses(t *testing.T) map[string]int {
	t.Helper()

	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)

	me := os.Getpid()
	found := map[string]int{}

	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}

		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}

		// pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
		s := string(stat)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}

		fields := strings.Fields(s[closing+1:])
		if len(fields) < 2 {
			continue
		}

		if ppid, _ := strconv.Atoi(fields[1]); ppid != me {
			continue
		}

		comm := s[open+1 : closing]
		for _, name := range controlPlaneProcesses {
			// comm is truncated to 15 characters.
			if strings.HasPrefix(name, comm) && len(comm) >= min(len(name), 15) {
				found[name] = pid
			}
		}
	}

	return found
}
