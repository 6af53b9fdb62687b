package webhookcerts_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ichor-dev/ichor-policy/webhook/webhookcerts"
)

const (
	ns = "ichor-system"
	// The manager's identity in this test: it holds only what the package's
	// RBAC markers ask for.
	managerUser = "system:serviceaccount:ichor-system:ichor-policy"
)

// assetsDir is where `make envtest-assets` builds kube-apiserver and etcd.
func assetsDir(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		require.NoError(t, err)
		cache = filepath.Join(home, ".cache")
	}
	dir := filepath.Join(cache, "ichor-policy", "envtest", "v1.37.2")
	_, err := os.Stat(filepath.Join(dir, "kube-apiserver"))
	require.NoError(t, err, "no control-plane binaries in %s: run `make envtest-assets`", dir)
	return dir
}

// markerRoles reads the package's +kubebuilder:rbac markers the way
// controller-gen does: a marker with namespace= goes into a Role there, the
// others into the ClusterRole.
func markerRoles(t *testing.T) (cluster []rbacv1.PolicyRule, namespaced map[string][]rbacv1.PolicyRule) {
	t.Helper()
	f, err := os.Open("webhookcerts.go")
	require.NoError(t, err)
	defer f.Close()
	namespaced = map[string][]rbacv1.PolicyRule{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		spec, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "// +kubebuilder:rbac:")
		if !ok {
			continue
		}
		var rule rbacv1.PolicyRule
		namespace := ""
		for _, field := range strings.Split(spec, ",") {
			key, value, ok := strings.Cut(field, "=")
			require.True(t, ok, field)
			values := strings.Split(strings.Trim(value, `"`), ";")
			switch key {
			case "groups":
				rule.APIGroups = values
			case "resources":
				rule.Resources = values
			case "verbs":
				rule.Verbs = values
			case "resourceNames":
				rule.ResourceNames = values
			case "namespace":
				namespace = value
			default:
				t.Fatalf("unknown marker field %q", key)
			}
		}
		if namespace == "" {
			cluster = append(cluster, rule)
		} else {
			namespaced[namespace] = append(namespaced[namespace], rule)
		}
	}
	require.NoError(t, sc.Err())
	return cluster, namespaced
}

// grantMarkers gives user what the markers ask for, and nothing else; the
// namespace of a namespaced marker is a placeholder for ns, as in the chart.
func grantMarkers(t *testing.T, admin client.Client, user string) {
	t.Helper()
	ctx := t.Context()
	cluster, namespaced := markerRoles(t)
	require.NotEmpty(t, cluster)
	require.NotEmpty(t, namespaced)
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	require.NoError(t, admin.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "webhookcerts"}, Rules: cluster}))
	require.NoError(t, admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "webhookcerts"}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "webhookcerts"},
	}))
	var rules []rbacv1.PolicyRule
	for _, r := range namespaced {
		rules = append(rules, r...)
	}
	require.NoError(t, admin.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhookcerts"}, Rules: rules}))
	require.NoError(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhookcerts"}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "webhookcerts"},
	}))
}

// chartObjects are what the Helm chart creates for this mode: the empty
// Secret and the webhook configuration without a CA bundle.
func chartObjects() []client.Object {
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNoneOnDryRun
	path := "/validate-ichor-dev-v1alpha1-taloscredentialrequest"
	return []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: webhookcerts.DefaultSecretName}, Type: corev1.SecretTypeOpaque},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: webhookcerts.DefaultWebhookConfigurationName},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name:                    "vtaloscredentialrequest.ichor.dev",
				ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: webhookcerts.DefaultServiceName, Path: &path}},
				FailurePolicy:           &fail,
				SideEffects:             &none,
				AdmissionReviewVersions: []string{"v1"},
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					// A resource nobody creates here: the API server must not
					// call a webhook this test does not route to.
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"ichor.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"taloscredentialrequests"}},
				}},
			}},
		},
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startManager is a manager as `ichor manager` builds it, with webhookcerts
// set up, running as cfg's user; it returns the webhook server's address.
func startManager(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	port := freePort(t)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 clientgoscheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          crwebhook.NewServer(crwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: t.TempDir()}),
	})
	require.NoError(t, err)
	mgr.GetWebhookServer().Register("/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "pong") }))
	// Setup provisions before the manager starts: the webhook server, started
	// first, needs the files.
	require.NoError(t, webhookcerts.Setup(mgr, webhookcerts.Options{Namespace: ns}))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// dial calls the webhook server the way the API server does: TLS verified
// against the configuration's CA bundle, for NAME.NAMESPACE.svc. It returns
// the serving certificate.
func dial(t *testing.T, admin client.Client, addr string) *x509.Certificate {
	t.Helper()
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, admin.Get(t.Context(), types.NamespacedName{Name: webhookcerts.DefaultWebhookConfigurationName}, &vwc))
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(vwc.Webhooks[0].ClientConfig.CABundle), "no CA bundle in the webhook configuration")
	httpClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: webhookcerts.DefaultServiceName + "." + ns + ".svc", MinVersion: tls.VersionTLS12,
	}}}
	var served *x509.Certificate
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := httpClient.Get("https://" + addr + "/ping")
		if !assert.NoError(c, err) {
			return
		}
		defer resp.Body.Close()
		assert.Equal(c, http.StatusOK, resp.StatusCode)
		served = resp.TLS.PeerCertificates[0]
	}, 30*time.Second, 100*time.Millisecond)
	return served
}

// TestSetupServesATrustedCertificateWithOnlyItsOwnRights runs two manager
// replicas against a real API server, each as a user holding only what the
// package's RBAC markers grant: each starts its webhook server with a
// certificate the API server would trust (the CA bundle it set), and both
// serve the same certificate from the shared Secret.
func TestSetupServesATrustedCertificateWithOnlyItsOwnRights(t *testing.T) {
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	env := &envtest.Environment{BinaryAssetsDirectory: assetsDir(t)}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(t, err)
	for _, obj := range chartObjects() {
		require.NoError(t, admin.Create(t.Context(), obj))
	}
	grantMarkers(t, admin, managerUser)
	user, err := env.AddUser(envtest.User{Name: managerUser}, cfg)
	require.NoError(t, err)

	first := dial(t, admin, startManager(t, user.Config()))
	second := dial(t, admin, startManager(t, user.Config()))
	assert.Equal(t, first.Raw, second.Raw, "the replicas serve different certificates")

	var secret corev1.Secret
	require.NoError(t, admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: webhookcerts.DefaultSecretName}, &secret))
	assert.NotEmpty(t, secret.Data[webhookcerts.KeyCAKey])

	// The rights are by name: the same user may not touch another Secret in
	// the namespace, nor create one.
	userClient, err := client.New(user.Config(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(t, err)
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}
	assert.Error(t, userClient.Create(t.Context(), other), "the manager may create Secrets")
}
