package chart

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// chartNamespace is where this test installs the chart: not the harness's
// ichor-system, whose admission key Secret Helm would not adopt.
const chartNamespace = "ichor-chart"

// TestTheManagerWorksWithTheChartsRightsAndPolicy installs the chart into a
// real control plane (with kube-controller-manager's signer, Talos API test
// servers and kubelets), then runs the real `ichor manager` as the chart's
// ServiceAccount, with exactly the RBAC the chart renders, the admission key
// Secret it creates and the ValidatingAdmissionPolicy it installs, serving
// the chart's webhook configuration (pointed at the test's loopback address,
// where a Service would lead in a cluster). The kubelet serving approver
// approves, the webhook admits and the issuer issues, and the policy refuses
// a forged requester. The cluster lives in its own namespace, which the
// operator names for the manager's Secret reads (rbac.secretsNamespaces): by
// default it reads Secrets in the release namespace only.
func TestTheManagerWorksWithTheChartsRightsAndPolicy(t *testing.T) {
	ctx := t.Context()
	// The API server authenticates to the webhook, as an operator who
	// follows docs/hardening.md configures it, and the manager answers it
	// alone.
	env := harness.StartForTest(t, harness.Options{WebhookClient: apiServerWebhookClient})
	admin := writeKubeconfig(t, env.AdminKubeconfig)
	// The harness has installed the CRDs (from deploy/crds, which the
	// chart's are held identical to).
	// The cluster's namespace, where the chart puts the Role that reads its Secrets.
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}))
	helm(t, nil, "install", release, chartDir(t), "--kubeconfig", admin, "--namespace", chartNamespace, "--create-namespace",
		"--set", "manager.localClusters={demo/demo}", "--set", "manager.kubeletClientApprover=true", "--set", "rbac.secretsNamespaces={demo}", "--set", "crds.install=false", "--wait=false")
	require.NoError(t, webhooktest.WaitRequesterPolicy(ctx, env.Client, "default", true))

	// The webhook configuration the chart made, pointed here.
	serving := &envtest.WebhookInstallOptions{LocalServingHost: "127.0.0.1"}
	require.NoError(t, serving.PrepWithoutInstalling())
	t.Cleanup(func() { _ = serving.Cleanup() })
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Name: "ichor-policy-webhook"}, &vwc))
	for i := range vwc.Webhooks {
		path := *vwc.Webhooks[i].ClientConfig.Service.Path
		vwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{
			URL:      ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", serving.LocalServingPort, path)),
			CABundle: serving.LocalServingCAData,
		}
	}
	require.NoError(t, env.Client.Update(ctx, &vwc))

	// The manager, as the chart's ServiceAccount.
	token, err := env.Clientset.CoreV1().ServiceAccounts(chartNamespace).CreateToken(ctx, release, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	saKubeconfig := tokenKubeconfig(t, env, token.Status.Token)
	t.Setenv("POD_NAMESPACE", chartNamespace)
	// Its readiness, with the policy bindings the chart names.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	probeAddr := probe.Addr().String()
	require.NoError(t, probe.Close())
	bindings := argValue(t, render(t).deployment(t), "--admission-policy-bindings")
	managerLog := filepath.Join(t.TempDir(), "manager.log")
	logFile, err := os.Create(managerLog)
	require.NoError(t, err)
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"manager", "--kubeconfig", saKubeconfig,
			"--metrics-bind-address", "0", "--health-probe-bind-address", probeAddr, "--resync-interval", "2s",
			"--admission-policy-bindings", bindings,
			"--webhook-port", fmt.Sprint(serving.LocalServingPort), "--webhook-cert-dir", serving.LocalServingCertDir,
			"--local-clusters", "demo/demo", "--kubelet-client-approver",
			"--webhook-client-ca", env.ClientCAPath, "--webhook-client-names", "someone-else," + apiServerWebhookClient,
			// The test's Talos API answers on loopback, which the
			// manager denies by default.
			"--node-denied-networks="}, nil, io.Discard, logFile)
	}()
	// t.Context() ends before the cleanups run, and the manager with it.
	t.Cleanup(func() {
		<-done
		_ = logFile.Close()
		if t.Failed() {
			data, _ := os.ReadFile(managerLog)
			t.Logf("manager log:\n%s", data)
		}
	})
	require.NoError(t, webhooktest.WaitWebhook(ctx, env.Client, "default", true))

	// A cluster whose kubelet serving certificates the manager approves.
	require.NoError(t, env.Client.Create(ctx, env.SecretsBundleSecret("demo", "talos-secrets")))
	require.NoError(t, env.Client.Create(ctx, &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo"},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: "v1.14", SecretsRef: ichorv1alpha1.SecretsBundleReference{Name: "talos-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{Enabled: true}},
		},
	}))
	node, err := env.StartTalosNode(ctx, harness.NodeOptions{Name: "worker-1", Addresses: []netip.Addr{netip.MustParseAddr("10.5.0.2")}})
	require.NoError(t, err)
	t.Cleanup(node.Stop)
	machine := &ichorv1alpha1.TalosMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "worker-1"},
		Spec:       ichorv1alpha1.TalosMachineSpec{ClusterName: "demo", Hostname: "worker-1", Endpoint: node.Endpoint(), Role: ichorv1alpha1.MachineRoleWorker},
	}
	require.NoError(t, env.Client.Create(ctx, machine))
	machine.Status.NodeName = "worker-1"
	require.NoError(t, env.Client.Status().Update(ctx, machine))
	kubelet, err := env.StartKubelet(ctx, harness.KubeletOptions{NodeName: "worker-1", DNSNames: []string{"worker-1"}, IPs: []net.IP{net.ParseIP("10.5.0.2")}})
	require.NoError(t, err)
	t.Cleanup(kubelet.Stop)
	waitCtx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	_, err = kubelet.WaitForCertificate(waitCtx)
	require.NoError(t, err, "the kubelet serving approver did not approve with the chart's rights")

	// The node renews its own client certificate: the client approver, with
	// the approve right the chart grants it because it is on.
	require.NoError(t, env.Client.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "selfnodeclient"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests/selfnodeclient"}, Verbs: []string{"create"}}},
	}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "selfnodeclient"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "selfnodeclient"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: harness.NodesGroup}},
	}))
	nodeCfg, err := env.UserConfig("system:node:worker-1", harness.NodesGroup)
	require.NoError(t, err)
	nodeClient, err := kubernetes.NewForConfig(nodeCfg)
	require.NoError(t, err)
	clientCSR, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-1")})
	require.NoError(t, err)
	_, err = nodeClient.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-1-client"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: clientCSR, SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		csr, err := env.Clientset.CertificatesV1().CertificateSigningRequests().Get(ctx, "worker-1-client", metav1.GetOptions{})
		require.NoError(t, err)
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved {
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "the kubelet client approver did not approve with the chart's rights")

	aPersonsApprovalIsRecorded(ctx, t, env, nodeClient)

	// A person's read-only talosconfig, through the webhook and the issuer.
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "alice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-operator"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:alice"}},
	}))
	cfg, err := env.UserConfig("ichor:alice")
	require.NoError(t, err)
	raw, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	alice, err := webhooktest.Requesting(ctx, raw)
	require.NoError(t, err)
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", GenerateName: "demo-talosconfig-reader-"},
		Spec:       ichorv1alpha1.TalosCredentialRequestSpec{ClusterName: "demo", Purpose: ichorv1alpha1.PurposeTalosconfigReader, PublicKey: publicKeyPEM(t)},
	}
	require.Eventually(t, func() bool { return alice.Create(ctx, tcr.DeepCopy()) == nil }, 30*time.Second, 200*time.Millisecond,
		"alice's request was never admitted (RBAC takes a moment to see her binding)")
	var list ichorv1alpha1.TalosCredentialRequestList
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.List(ctx, &list, client.InNamespace("demo")))
		if len(list.Items) != 1 {
			return false
		}
		ready := meta.FindStatusCondition(list.Items[0].Status.Conditions, ichorv1alpha1.ConditionReady)
		return ready != nil
	}, time.Minute, 200*time.Millisecond)
	ready := meta.FindStatusCondition(list.Items[0].Status.Conditions, ichorv1alpha1.ConditionReady)
	assert.Equal(t, ichorv1alpha1.ReasonIssued, ready.Reason, ready.Message)
	assert.NotEmpty(t, list.Items[0].Status.Certificate)

	adminKubeconfigUnderThePolicy(t, env)

	// The chart's policy refuses a requester who writes someone else in.
	forged := tcr.DeepCopy()
	forged.Spec.Requester = ichorv1alpha1.Requester{Username: "ichor:bob", Groups: []string{"system:authenticated"}}
	err = raw.Create(ctx, forged)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidatingAdmissionPolicy 'ichor-credential-requester'")

	onlyTheManagerAnswersARequest(t, env, &list.Items[0])
	onlyTheAPIServerIsAnswered(t, env, serving, vwc)
	readyOnlyWithThePolicyBindings(t, env, probeAddr)
}

// readyOnlyWithThePolicyBindings: with the chart's rights the manager reads
// the admission policies and bindings the chart installed, and is ready; one
// of them gone (an install that failed on them, a hand that deleted it) or a
// binding that only warns, it is not, so its webhook admits nothing (review
// 256 F1, 258 F5).
func readyOnlyWithThePolicyBindings(t *testing.T, env *harness.Env, probeAddr string) {
	t.Helper()
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + probeAddr + "/readyz?verbose") //nolint:noctx // a test's probe, bounded by Eventually
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	require.Eventually(t, func() bool { code, _ := readyz(); return code == http.StatusOK }, 30*time.Second, 100*time.Millisecond, "never ready")
	_, body := readyz()
	assert.Contains(t, body, "[+]admission-policies ok")

	ready := func(want bool, why string) {
		t.Helper()
		code := http.StatusInternalServerError
		if want {
			code = http.StatusOK
		}
		require.Eventually(t, func() bool { got, _ := readyz(); return got == code }, 30*time.Second, 100*time.Millisecond, "%s: readyz not %d", why, code)
		_, body := readyz()
		if !want {
			assert.Contains(t, body, "[-]admission-policies failed", why)
		}
	}
	ctx := t.Context()
	name := release + "-credential-answers"

	// A binding that only warns refuses nothing (review 258 F5).
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, &binding))
	actions := binding.Spec.ValidationActions
	binding.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}
	require.NoError(t, env.Client.Update(ctx, &binding))
	ready(false, "the binding only warns")
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, &binding))
	binding.Spec.ValidationActions = actions
	require.NoError(t, env.Client.Update(ctx, &binding))
	ready(true, "the binding denies again")

	// A binding whose policy is gone is ignored by the API server.
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, &policy))
	require.NoError(t, env.Client.Delete(ctx, &policy))
	ready(false, "the policy is gone")
	policy.ResourceVersion, policy.UID, policy.ManagedFields, policy.Status = "", "", nil, admissionregistrationv1.ValidatingAdmissionPolicyStatus{}
	require.NoError(t, env.Client.Create(ctx, &policy))
	ready(true, "the policy is back")

	require.NoError(t, env.Client.Delete(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	ready(false, "the binding is gone")
}

// onlyTheManagerAnswersARequest: the manager wrote the answer above under the
// chart's policy `<release>-credential-answers`, and a tenant with every right
// in the request's namespace cannot write one (review 176 F2): its CA as the
// trust bundle, with a certificate of that CA for the requester's key, would
// have the requester's talosctl or kubectl trust a server the tenant runs.
func onlyTheManagerAnswersARequest(t *testing.T, env *harness.Env, answered *ichorv1alpha1.TalosCredentialRequest) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: answered.Namespace, Name: "tenant-admin"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: answered.Namespace, Name: "mallory"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:mallory"}},
	}))
	cfg, err := env.UserConfig("ichor:mallory")
	require.NoError(t, err)
	mallory, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var tcr ichorv1alpha1.TalosCredentialRequest
		if err := mallory.Get(ctx, client.ObjectKeyFromObject(answered), &tcr); err != nil {
			return false // RBAC takes a moment to see her binding
		}
		tcr.Status.TrustBundle = "-----BEGIN CERTIFICATE-----\nmallory\n-----END CERTIFICATE-----\n"
		err := mallory.Status().Update(ctx, &tcr)
		if err != nil {
			t.Logf("mallory's answer: %v", err)
		}
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+release+"-credential-answers'")
	}, 30*time.Second, 200*time.Millisecond, "a tenant's answer was not refused by the policy")
	var now ichorv1alpha1.TalosCredentialRequest
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(answered), &now))
	assert.Equal(t, answered.Status.TrustBundle, now.Status.TrustBundle, "the manager's answer was rewritten")
}

// apiServerWebhookClient is the common name of the API server's webhook
// client certificate in these tests.
const apiServerWebhookClient = "kube-apiserver-webhook-client"

// onlyTheAPIServerIsAnswered posts a review of its own to each of the
// manager's webhooks, as a pod that reaches the port would: without a client
// certificate, and with one of the API server's client CA under another name
// (the harness's admin's; a cluster's client CA signs every kubelet's). The
// API server's own reviews went through above (the issuance, the recorded
// approval).
func onlyTheAPIServerIsAnswered(t *testing.T, env *harness.Env, serving *envtest.WebhookInstallOptions, vwc admissionregistrationv1.ValidatingWebhookConfiguration) {
	t.Helper()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(serving.LocalServingCAData))
	adminCert, err := tls.X509KeyPair(env.Config.CertData, env.Config.KeyData)
	require.NoError(t, err)
	require.NotEmpty(t, vwc.Webhooks)
	for _, wh := range vwc.Webhooks {
		for name, tc := range map[string]struct {
			certs []tls.Certificate
			want  string
		}{
			"no certificate":         {nil, "without a client certificate of the webhook's client CA"},
			"another name of the CA": {[]tls.Certificate{adminCert}, "common name is not one of the API server's"},
		} {
			certs := tc.certs
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs, MinVersion: tls.VersionTLS12}}}
			review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"forged","operation":"DELETE","userInfo":{"username":"ichor:mallory"}}}`
			resp, err := c.Post(*wh.ClientConfig.URL, "application/json", strings.NewReader(review))
			require.NoError(t, err, "%s, %s", wh.Name, name)
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s, %s: %s", wh.Name, name, body)
			assert.Contains(t, string(body), tc.want, "%s, %s", wh.Name, name)
		}
	}
}

func writeKubeconfig(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

// tokenKubeconfig is a kubeconfig of the harness's API server with a bearer
// token.
func tokenKubeconfig(t *testing.T, env *harness.Env, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["env"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "env", AuthInfo: "sa"}
	cfg.CurrentContext = "sa"
	data, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	return writeKubeconfig(t, data)
}

func publicKeyPEM(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// adminKubeconfigUnderThePolicy: a person's admin kubeconfig, issued by the
// running manager. It makes their binding and records the certificate's
// expiry on it under the chart's ValidatingAdmissionPolicy of its
// ClusterRoleBinding writes (review 2, F3), which would refuse anything but
// Ichor's shape.
func adminKubeconfigUnderThePolicy(t *testing.T, env *harness.Env) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "ada"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ichor-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:ada"}},
	}))
	adaCfg, err := env.UserConfig("ichor:ada")
	require.NoError(t, err)
	adaRaw, err := client.New(adaCfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	ada, err := webhooktest.Requesting(ctx, adaRaw)
	require.NoError(t, err)
	adminTCR := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo-kubeconfig-admin-ada"},
		Spec:       ichorv1alpha1.TalosCredentialRequestSpec{ClusterName: "demo", Purpose: ichorv1alpha1.PurposeKubeconfigAdmin, PublicKey: publicKeyPEM(t)},
	}
	require.Eventually(t, func() bool { return ada.Create(ctx, adminTCR.DeepCopy()) == nil }, 30*time.Second, 200*time.Millisecond,
		"ada's request was never admitted")
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(adminTCR), adminTCR))
		return meta.FindStatusCondition(adminTCR.Status.Conditions, ichorv1alpha1.ConditionReady) != nil
	}, time.Minute, 200*time.Millisecond)
	ready := meta.FindStatusCondition(adminTCR.Status.Conditions, ichorv1alpha1.ConditionReady)
	require.Equal(t, ichorv1alpha1.ReasonIssued, ready.Reason, ready.Message)
	var bindings rbacv1.ClusterRoleBindingList
	require.NoError(t, env.Client.List(ctx, &bindings, client.MatchingLabels{"ichor.dev/admin-binding": "true"}))
	require.Len(t, bindings.Items, 1)
	assert.True(t, strings.HasPrefix(bindings.Items[0].Name, "ichor-admin:u:ichor:ada:"), bindings.Items[0].Name)
	require.Eventually(t, func() bool {
		var b rbacv1.ClusterRoleBinding
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(&bindings.Items[0]), &b))
		return b.Annotations["ichor.dev/certificate-expiry"] != ""
	}, 30*time.Second, 200*time.Millisecond, "the manager could not record the expiry on the binding")

}

// aPersonsApprovalIsRecorded: a person's approval by hand, of a request the
// manager leaves pending (no machine answers to worker-9), is kept as an
// attempt through the chart's webhook and recorded by the manager's watch as
// stored, with the chart's rights, naming the person; the manager's own
// approvals are not.
func aPersonsApprovalIsRecorded(ctx context.Context, t *testing.T, env *harness.Env, nodeClient kubernetes.Interface) {
	t.Helper()
	worker9, err := csrgen.PEM(csrgen.Request{Subject: csrgen.NodeSubject("worker-9"), DNSNames: []string{"worker-9"}})
	require.NoError(t, err)
	byHand := env.SubmitCSR(t, nodeClient, csrgen.ServingObject("worker-9-serving", "worker-9", worker9))
	csr := env.GetCSR(t, byHand)
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "IchorManualApproval", Message: "checked by hand",
	})
	_, err = env.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, byHand, csr, metav1.UpdateOptions{})
	require.NoError(t, err)
	// The attempt's Event is named with the manager's key: found by what it
	// says instead.
	var events corev1.EventList
	require.NoError(t, env.Client.List(ctx, &events, client.InNamespace(manualact.EventNamespace)))
	kept := slices.ContainsFunc(events.Items, func(ev corev1.Event) bool {
		return ev.Reason == manualact.ReasonAttempt && ev.Annotations[manualact.AnnotationObjectUID] == string(csr.UID)
	})
	assert.True(t, kept, "the webhook keeps the attempt within the write")
	var manual []corev1.Event
	require.Eventually(t, func() bool {
		var events corev1.EventList
		require.NoError(t, env.Client.List(ctx, &events, client.InNamespace(manualact.EventNamespace)))
		manual = nil
		for _, e := range events.Items {
			if strings.HasPrefix(e.Name, "ichor-act-") {
				manual = append(manual, e)
			}
		}
		return len(manual) > 0
	}, 30*time.Second, 200*time.Millisecond, "the watch did not record the approval stored")
	// The watch saw the manager's approvals before this one, in order.
	require.Len(t, manual, 1, "one act by hand; the manager's approvals are none")
	assert.Equal(t, manualact.EventName(csr.UID), manual[0].Name)
	assert.Equal(t, "ManualApproval", manual[0].Reason)
	assert.Contains(t, manual[0].Message, "approved by hand by ")
	// Marked recorded, with the chart's rights (get and update on the
	// ConfigMap the chart creates), so that a restart does not record it
	// again once the Event has expired (review 4, R3).
	var marks corev1.ConfigMap
	require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: chartNamespace, Name: manualact.MarksConfigMapName}, &marks))
	marked := 0
	for _, v := range marks.Data {
		if strings.Contains(v, string(csr.UID)) {
			marked++
		}
	}
	assert.Equal(t, 1, marked, "the act's mark: %v", marks.Data)
}
