package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/test/talosapi"
)

const (
	// defaultStartTimeout bounds Start when ctx has no deadline. A warm start
	// takes a few seconds; the margin is for a loaded CI machine.
	defaultStartTimeout = 2 * time.Minute

	// pollInterval is how often a readiness condition is checked. The checks
	// are cheap local requests; a short interval keeps Start fast.
	pollInterval = 50 * time.Millisecond

	// signerUser is the identity the CSR signer runs as.
	signerUser = "ichor-harness:csr-signer"
)

// Options configures Start. The zero value is a working environment.
type Options struct {
	// AssetsDir holds kube-apiserver, etcd and csrsigner. Empty:
	// $KUBEBUILDER_ASSETS, else DefaultAssetsDir().
	AssetsDir string

	// CRDDir holds the CRD manifests to install. Empty: deploy/crds of this
	// repository, found above this source file or the working directory.
	CRDDir string

	// WorkDir receives the secrets bundle, the CSR signer's files,
	// the kubelets' certificates and the logs. Empty: a fresh temporary
	// directory that Stop removes; a directory given here is kept, logs
	// included, for a person to read after the run.
	WorkDir string

	// AuditLog has the API server write an audit log (level Metadata, every
	// request) to Env.AuditLogPath, which AuditEvents reads: what the API
	// server recorded as each request's user.
	AuditLog bool

	// WebhookClient, when set, is the common name of a client certificate
	// the API server presents to every webhook it calls (an admission
	// configuration's kubeConfigFile, as an operator gives it), signed by
	// the harness's client CA, whose certificate Env.ClientCAPath holds.
	WebhookClient string
}

// Env is a running environment. Its fields are set by Start and read-only.
type Env struct {
	// Config is a system:masters user's client configuration.
	Config *rest.Config
	// AdminKubeconfig is Config as a kubeconfig file's content, for kubectl.
	AdminKubeconfig []byte
	// Scheme has the client-go types and ichor.dev/v1alpha1.
	Scheme *runtime.Scheme
	// Client is a controller-runtime client (uncached) on Config and Scheme.
	Client client.Client
	// Clientset is a client-go clientset on Config.
	Clientset kubernetes.Interface

	// SecretsBundle is the cluster's Talos secrets bundle as
	// secrets.LoadBundle parses it, SecretsBundleYAML the bytes `talosctl gen
	// secrets` would have written, and SecretsBundlePath a file holding them.
	SecretsBundle     *secrets.Bundle
	SecretsBundleYAML []byte
	SecretsBundlePath string

	// AssetsDir is where the control-plane binaries were found.
	AssetsDir string
	// WorkDir holds this environment's files (see Options.WorkDir).
	WorkDir string
	// Logs of the three control-plane processes, for a failing test to show.
	SignerLogPath    string
	APIServerLogPath string
	EtcdLogPath      string
	// AuditLogPath is the API server's audit log, with Options.AuditLog.
	AuditLogPath string
	// ClientCAPath is a PEM file of the CA that signs the harness's users'
	// certificates and, with Options.WebhookClient, the API server's webhook
	// client certificate.
	ClientCAPath string

	osCA       *talosapi.CA
	authn      *clientCertAuthn
	testEnv    *envtest.Environment
	signer     *csrSigner
	removeWork bool
	logFiles   []*os.File

	mu       sync.Mutex
	stopped  bool
	nodes    []*TalosNode
	kubelets []*Kubelet
	atStop   []func()

	stopOnce sync.Once
	stopErr  error
}

// Start runs the environment and returns once the kube-apiserver answers with
// the CRDs established and their resources served without delay, RBAC lets
// nodes request certificates, and the CSR signer has signed a probe
// certificate.
//
// ctx bounds the start only (defaultStartTimeout when it has no deadline):
// the processes run until Stop, which the caller must call. On error nothing
// is left running.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}

	assets, err := resolveAssetsDir(opts.AssetsDir)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}

	crdDir, err := resolveCRDDir(opts.CRDDir)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}

	e := &Env{AssetsDir: assets, WorkDir: opts.WorkDir}

	if e.WorkDir == "" {
		if e.WorkDir, err = os.MkdirTemp("", "ichor-harness-"); err != nil {
			return nil, fmt.Errorf("harness: work directory: %w", err)
		}

		e.removeWork = true
	} else if err = os.MkdirAll(e.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("harness: work directory: %w", err)
	}

	defer func() {
		if err != nil {
			err = errors.Join(err, e.Stop())
		}
	}()

	if opts.AuditLog {
		e.AuditLogPath = filepath.Join(e.WorkDir, "audit.log")
	}

	if err = e.startControlPlane(crdDir, opts.WebhookClient); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}

	if err = e.bindNodeRole(ctx); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}

	if err = e.createManagerNamespace(ctx); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}

	if err = e.startSigner(ctx); err != nil {
		return nil, fmt.Errorf("harness: %w\n%s", err, tailFile(e.SignerLogPath, 30))
	}

	// Last, so the time the CSR signer took to start counts towards
	// the CRDs' create grace period.
	if err = e.warmCRDs(ctx); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}

	return e, nil
}

// startControlPlane generates the secrets bundle (its Kubernetes CA becomes a
// client CA of the apiserver), then starts etcd and the apiserver with RBAC
// and installs the CRDs.
func (e *Env) startControlPlane(crdDir, webhookClient string) error {
	bundle, data, osCA, err := newSecretsBundle(e.WorkDir)
	if err != nil {
		return err
	}

	e.SecretsBundle, e.SecretsBundleYAML, e.osCA = bundle, data, osCA
	e.SecretsBundlePath = filepath.Join(e.WorkDir, secretsFileName)

	if e.authn, err = newClientCertAuthn(bundle.Certs.K8s.Crt); err != nil {
		return err
	}

	if e.Scheme, err = kube.Scheme(); err != nil {
		return err
	}

	e.SignerLogPath = filepath.Join(e.WorkDir, signerBinary+".log")
	e.APIServerLogPath = filepath.Join(e.WorkDir, "kube-apiserver.log")
	e.EtcdLogPath = filepath.Join(e.WorkDir, "etcd.log")

	apiLog, err := e.openLog(e.APIServerLogPath)
	if err != nil {
		return err
	}

	etcdLog, err := e.openLog(e.EtcdLogPath)
	if err != nil {
		return err
	}

	apiServer := &envtest.APIServer{
		Path:          filepath.Join(e.AssetsDir, "kube-apiserver"),
		SecureServing: envtest.SecureServing{Authn: e.authn},
		Out:           apiLog,
		Err:           apiLog,
	}
	// RBAC is envtest's default too; it is set here so the environment
	// authorizes like a cluster whatever envtest's defaults become. There is
	// no Node authorizer: bindNodeRole grants nodes the role instead.
	apiServer.Configure().Set("authorization-mode", "RBAC")
	e.ClientCAPath = filepath.Join(e.WorkDir, "harness-client-ca.crt")
	if err := os.WriteFile(e.ClientCAPath, e.authn.caPEM, 0o600); err != nil {
		return fmt.Errorf("harness client CA: %w", err)
	}
	if webhookClient != "" {
		config, err := e.authn.webhookAdmissionConfig(e.WorkDir, webhookClient)
		if err != nil {
			return err
		}
		apiServer.Configure().Set("admission-control-config-file", config)
	}
	if e.AuditLogPath != "" {
		policy := filepath.Join(e.WorkDir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return fmt.Errorf("audit policy: %w", err)
		}
		apiServer.Configure().Set("audit-policy-file", policy).Set("audit-log-path", e.AuditLogPath).Set("audit-log-format", "json")
	}

	e.testEnv = &envtest.Environment{
		ControlPlane: envtest.ControlPlane{
			APIServer: apiServer,
			Etcd: &envtest.Etcd{
				Path: filepath.Join(e.AssetsDir, "etcd"),
				Out:  etcdLog,
				Err:  etcdLog,
			},
		},
		Scheme:                e.Scheme,
		CRDDirectoryPaths:     []string{crdDir},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: e.AssetsDir,
		// The harness is its own cluster; USE_EXISTING_CLUSTER in the
		// environment must not point tests at a real one.
		UseExistingCluster: ptr.To(false),
	}

	if e.Config, err = e.testEnv.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver and etcd: %w\n%s", err, tailFile(e.APIServerLogPath, 30))
	}

	e.AdminKubeconfig = e.testEnv.KubeConfig

	if e.Client, err = client.New(e.Config, client.Options{Scheme: e.Scheme}); err != nil {
		return fmt.Errorf("controller-runtime client: %w", err)
	}

	if e.Clientset, err = kubernetes.NewForConfig(e.Config); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}

	return nil
}

func (e *Env) openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}

	e.logFiles = append(e.logFiles, f)

	return f, nil
}

// Stop stops every node, kubelet and process the environment started, waits
// for the processes to be reaped, and removes a temporary WorkDir. It is
// idempotent and safe on a partly started Env.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		e.mu.Lock()
		e.stopped = true
		kubelets, nodes, atStop := e.kubelets, e.nodes, e.atStop
		e.kubelets, e.nodes, e.atStop = nil, nil, nil
		e.mu.Unlock()

		var errs []error

		for _, f := range slices.Backward(atStop) {
			f()
		}

		for _, k := range kubelets {
			k.Stop()
		}

		for _, n := range nodes {
			n.Stop()
		}

		// The CSR signer first: stopped after the apiserver it would
		// spend its stop timeout retrying a vanished server.
		if e.signer != nil {
			errs = append(errs, e.signer.stop())
		}

		if e.testEnv != nil {
			if err := e.testEnv.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("stop kube-apiserver and etcd: %w", err))
			}
		}

		for _, f := range e.logFiles {
			f.Close() //nolint:errcheck // the writers have exited; nothing is buffered
		}

		if e.removeWork {
			if err := os.RemoveAll(e.WorkDir); err != nil {
				errs = append(errs, fmt.Errorf("remove work directory: %w", err))
			}
		}

		if err := errors.Join(errs...); err != nil {
			e.stopErr = fmt.Errorf("harness: stop: %w", err)
		}
	})

	return e.stopErr
}

// UserConfig is a client configuration authenticating as name in groups, with
// a client certificate from the harness's own CA (not the bundle's: a
// certificate from the bundle's Kubernetes CA is always one Ichor or
// the CSR signer signed). RBAC applies: bind roles as needed.
func (e *Env) UserConfig(name string, groups ...string) (*rest.Config, error) {
	user, err := e.testEnv.AddUser(envtest.User{Name: name, Groups: slices.Clone(groups)}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return nil, fmt.Errorf("harness: user %q: %w", name, err)
	}

	return user.Config(), nil
}

// KubernetesCA is the bundle's Kubernetes CA (certs.k8s): kube-controller-
// manager signs with it and the apiserver accepts client certificates from it.
func (e *Env) KubernetesCA() (certPEM, keyPEM []byte) {
	return slices.Clone(e.SecretsBundle.Certs.K8s.Crt), slices.Clone(e.SecretsBundle.Certs.K8s.Key)
}

// OSCA is the bundle's Talos OS CA (certs.os): every TalosNode serves with it
// and accepts client certificates from it, as talosnode.Options wants it.
func (e *Env) OSCA() (certPEM, keyPEM []byte) {
	return slices.Clone(e.SecretsBundle.Certs.OS.Crt), slices.Clone(e.SecretsBundle.Certs.OS.Key)
}

// TalosCA is the OS CA as the Talos API test server's type, for tests that
// need client certificates with an arbitrary role (talosapi.CA.ClientTLSConfig).
func (e *Env) TalosCA() *talosapi.CA {
	return e.osCA
}

// SecretsBundleSecret is a Secret holding the bundle under the key a
// TalosCluster's secretsRef defaults to, which every TalosCluster of its
// namespace may use (ichorv1alpha1.SecretsClaimAnnotation "*": a test's
// clusters share it); the caller creates it.
func (e *Env) SecretsBundleSecret(namespace, name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: everyCluster()},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{ichorv1alpha1.DefaultSecretsBundleKey: slices.Clone(e.SecretsBundleYAML)},
	}
}

// TailLogs is the last lines of each control-plane log, for a failing test to
// print (t.Log(env.TailLogs(40))) before Stop removes a temporary WorkDir.
func (e *Env) TailLogs(lines int) string {
	var b strings.Builder

	for _, path := range []string{e.SignerLogPath, e.APIServerLogPath, e.EtcdLogPath} {
		if path != "" {
			b.WriteString(tailFile(path, lines))
		}
	}

	return b.String()
}

// tailFile reads the whole log: they stay small for a test's lifetime, and a
// failing test is the only reader.
func tailFile(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("==> %s: %v\n", path, err)
	}

	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}

	return fmt.Sprintf("==> %s (last %d lines) <==\n%s\n", path, len(all), strings.Join(all, "\n"))
}

// AtStop registers f to run first when the environment stops (the last
// registered first): what a package's set-up made beside the control plane,
// such as an engine, whose temporary bundle directory its Stop removes. It
// refuses once Stop has begun.
func (e *Env) AtStop(f func()) error {
	return e.track(func() { e.atStop = append(e.atStop, f) })
}

// track registers a node or kubelet for Stop; it refuses once Stop has begun,
// so nothing started concurrently with Stop is left running.
func (e *Env) track(add func()) error {
	e.mu.Lock()
	defer e.mu.Unlock()

	if e.stopped {
		return errors.New("harness: environment is stopped")
	}

	add()

	return nil
}

// everyCluster is the claim of a secrets Secret that every TalosCluster of
// its namespace may use.
func everyCluster() map[string]string {
	return map[string]string{ichorv1alpha1.SecretsClaimAnnotation: "*"}
}
