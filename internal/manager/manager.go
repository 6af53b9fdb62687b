// Package manager is the composition root of `ichor manager`: it makes the
// policy engine, the controller-runtime manager, the approvers, the admission
// webhook and the issuer from Options, and runs them until the context ends.
// The CLI parses flags into Options; the chart's manager test and the
// benchmarks run this same code through the CLI.
package manager

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/controllers/credentials"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletaudit"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletclient"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/bundleepoch"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/exepages"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/facts/kubeconfig"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/manualact"
	"github.com/ichor-dev/ichor-policy/internal/memlimit"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
	"github.com/ichor-dev/ichor-policy/internal/version"
	credwebhook "github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/apiserverauth"
	"github.com/ichor-dev/ichor-policy/webhook/reviewbounds"
	"github.com/ichor-dev/ichor-policy/webhook/webhookcerts"
)

// LeaderElectionID is the name of the manager's leader-election Lease; the
// chart's leader-election Role grants update on that name alone.
const LeaderElectionID = "ichor-policy.ichor.dev"

// Options are the manager's settings, as the flags of `ichor manager` set
// them.
type Options struct {
	// Config is the API server's client configuration, QPS and burst
	// included.
	Config *rest.Config
	// Log receives the controllers' own logs (JSON lines).
	Log io.Writer
	// LogOptions are controller-runtime's zap options as the --zap-* flags
	// set them (level, encoder, stack traces, time encoding); nil for the
	// defaults: JSON, info, epoch seconds. Their destination is Log.
	LogOptions *zap.Options

	// Engine is the bundle and the decision log; Run sets its Metrics and
	// OnBundleStatus.
	Engine engine.Options
	// BundleName is what the bundle was named by (--bundle), for the log;
	// empty for the embedded bundle.
	BundleName string
	// ShadowBundle is a candidate bundle evaluated beside the active one,
	// never acted on; empty for none.
	ShadowBundle string
	// DecisionLogFlushTimeout bounds, at shutdown, how long the upload sink
	// may take to send what it holds.
	DecisionLogFlushTimeout time.Duration

	MetricsAddr string
	ProbeAddr   string

	LeaderElect   bool
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration

	// Namespace and PodName are the manager's own (the downward API's
	// POD_NAMESPACE and POD_NAME): the namespace of the admission key,
	// the webhook's certificates and the lease, and the Pod the bundle's
	// Events are about. Either may be empty outside a pod.
	Namespace string
	PodName   string

	// Webhook serves the admission webhook and runs the issuer beside it.
	Webhook        bool
	WebhookPort    int
	WebhookCertDir string
	// WebhookClientAuth, when set, has the webhook answer only the API
	// server's client certificate (--webhook-client-ca).
	WebhookClientAuth *apiserverauth.Auth
	// WebhookCerts, when set, makes and renews the webhook's CA and serving
	// certificate (its Namespace is Options.Namespace).
	WebhookCerts *webhookcerts.Options
	// AdmissionKeySecret is the Secret of the admission records' key.
	AdmissionKeySecret string
	AdminKubeconfigs   bool
	// AdmissionPolicyBindings are the ValidatingAdmissionPolicyBindings that
	// hold the manager's rights to their shape: it is not ready until each
	// exists (--admission-policy-bindings; policyBindings).
	AdmissionPolicyBindings []string
	// ComponentNamespaces are the namespaces of Ichor's own
	// ServiceAccounts, the only requesters of the purposes not for people
	// (--component-namespaces); none given, Namespace.
	ComponentNamespaces []string
	// AcceptUnpinnedAdmissions accepts admission records without the
	// lifetime and credential pins (--require-admission-pins=false).
	AcceptUnpinnedAdmissions bool
	// AllowUnclaimedSecrets uses a secretsRef or kubeconfigRef Secret
	// without the annotation that names its clusters
	// (--require-secrets-claim=false, for an upgrade):
	// clustersecrets.ClaimIfAnnotated.
	AllowUnclaimedSecrets bool

	KubeletClientApprover bool
	// LocalClusters are the clusters whose machines are nodes of the API
	// server the manager runs against.
	LocalClusters *cluster.Local
	// RemoteKubeconfigAllowInsecure lets a TalosCluster's kubeconfigRef set
	// insecure-skip-tls-verify; the rule ichor/kubeconfig refuses it otherwise.
	RemoteKubeconfigAllowInsecure bool
	// RemoteKubeconfigDenied are the networks no connection to a
	// kubeconfigRef's server may reach (--remote-kubeconfig-denied-networks;
	// nil denies none).
	RemoteKubeconfigDenied netguard.Denied

	ResyncInterval time.Duration
	TalosTimeout   time.Duration
	// TalosWatch keeps live identity watches of the machines expected to
	// ask soon; TalosWatchMaxAge is their freshness bound.
	TalosWatch       bool
	TalosWatchMaxAge time.Duration
	// TalosWatchMax bounds the watches held at once.
	TalosWatchMax int
	// NodeDenied are the networks no Talos API read or watch, and no
	// kubelet the audit reaches, connects to (--node-denied-networks; nil
	// denies none).
	NodeDenied netguard.Denied
	// TenantMaxCSRs and TenantMaxCSRBytes bound what the manager keeps of
	// the API servers a tenant's kubeconfigRefs name, together; zero for
	// the defaults.
	TenantMaxCSRs     int
	TenantMaxCSRBytes int64
	// ReaderLifetime is the lifetime asked for the manager's own os:reader
	// Talos certificate; zero for the policy's default.
	ReaderLifetime time.Duration

	// KubeletServingAuditInterval is how often the kubelet serving
	// certificates in service are audited (kubeletaudit.Runner); zero turns
	// the audit off.
	KubeletServingAuditInterval time.Duration
	// KubeletPort is the port the kubelets serve on; servingcert.DefaultPort
	// if zero.
	KubeletPort int

	// Sharding, when its Shards is above zero, shares the TalosClusters out
	// among the replicas (internal/shard): each serves the kubelet serving
	// approvals of the clusters whose shard it holds, leader or not.
	Sharding Sharding
}

// Sharding are the sharding's settings; zero Shards for none.
type Sharding struct {
	Shards        int
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Identity names this replica; the Pod's name if empty.
	Identity string
}

// checkTalosReader refuses Talos reader and watch options no reader could
// use, before the manager serves: a negative timeout, a lifetime above the
// reader's maximum or a watch bound not longer than one read's timeout
// would otherwise be refused by every cluster's reader later, each logging
// it while its nodes go unread (or, for the watch, are read directly).
func checkTalosReader(o Options, readerLifetime time.Duration) error {
	switch {
	case o.TalosTimeout < 0:
		return usage.Errorf("--talos-timeout %s is negative", o.TalosTimeout)
	case readerLifetime > talosnode.MaxCertificateLifetime:
		return usage.Errorf("the Talos reader lifetime %s exceeds the reader's maximum of %s", readerLifetime, talosnode.MaxCertificateLifetime)
	case o.TalosWatchMaxAge < 0:
		return usage.Errorf("--talos-watch-max-age %s is negative", o.TalosWatchMaxAge)
	case o.TalosWatchMax < 0:
		return usage.Errorf("--talos-watch-max %d is negative", o.TalosWatchMax)
	case !o.TalosWatch:
		return nil
	}
	if err := talosnode.CheckWatchMaxAge(o.TalosWatchMaxAge, readerLifetime, o.TalosTimeout); err != nil {
		return usage.Errorf("--talos-watch-max-age %s with --talos-timeout %s and a reader lifetime of %s: %w", o.TalosWatchMaxAge, o.TalosTimeout, readerLifetime, err)
	}
	return nil
}

// Run runs the manager until ctx ends. An error marked by package usage is
// in the options (or refused by the policy), not in the cluster.
// GracefulShutdown is how long the controllers, the webhook and the shard
// releases may take to stop, before the decision log's flush
// (--decision-log-flush-timeout): the pod's terminationGracePeriodSeconds
// must cover both.
const GracefulShutdown = 15 * time.Second

func Run(ctx context.Context, o Options) error {
	if o.ReaderLifetime < 0 {
		return usage.Errorf("the Talos reader lifetime %s is negative", o.ReaderLifetime)
	}
	if o.LocalClusters == nil {
		o.LocalClusters = &cluster.Local{}
	}
	setLoggers(newLogger(o.Log, o.LogOptions))
	fitMemoryLimit(ctrl.Log.WithName("manager"))
	if err := registerBuildInfo(ctrlmetrics.Registry, version.Get()); err != nil {
		return err
	}
	scheme, err := kube.Scheme()
	if err != nil {
		return err
	}
	eng, stop, bundleChanges, err := newEngine(ctx, o)
	if err != nil {
		return err
	}
	// After the controllers stopped (and the lease was released): what the
	// upload sink holds is sent within the flush timeout.
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.DecisionLogFlushTimeout)
		defer cancel()
		stop(flushCtx)
	}()
	lifetime, err := ReaderLifetime(ctx, eng, o.ReaderLifetime)
	if err != nil {
		return err
	}
	if err := checkTalosReader(o, lifetime); err != nil {
		return err
	}
	if o.AllowUnclaimedSecrets {
		// Meant for the time of an upgrade only: said at every start, so
		// that it is not left on unnoticed.
		ctrl.Log.WithName("manager").Info("WARNING: a TalosCluster's secretsRef or kubeconfigRef Secret is used without the annotation " + ichorv1alpha1.SecretsClaimAnnotation +
			" that names the clusters that may use it (--require-secrets-claim=false): whoever may write a TalosCluster can point it at another cluster's CAs or API server; annotate the Secrets and turn it back on")
	}
	if o.TenantMaxCSRs < 0 || o.TenantMaxCSRBytes < 0 {
		return usage.Errorf("the bounds of a tenant's API servers, %d CSRs and %d bytes, are negative", o.TenantMaxCSRs, o.TenantMaxCSRBytes)
	}

	webhookServer, err := newWebhookServer(o, ctrlmetrics.Registry)
	if err != nil {
		return err
	}

	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme: scheme,
		// Nothing here reads managedFields; at thousands of CSRs and
		// machines they are a large part of the cache.
		Cache: cache.Options{
			DefaultTransform: cache.TransformStripManagedFields(),
			// Only the admins' own bindings (controllers/credentials), not
			// every binding of the cluster.
			ByObject: map[client.Object]cache.ByObject{
				&rbacv1.ClusterRoleBinding{}: {Label: labels.SelectorFromSet(labels.Set{credentials.LabelAdminBinding: "true"})},
			},
		},
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress: o.ProbeAddr,
		LeaderElection:         o.LeaderElect,
		LeaderElectionID:       LeaderElectionID,
		// Released once the controllers have stopped, so a standby takes
		// over within a retry period rather than a whole lease duration.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.LeaseDuration,
		RenewDeadline:                 &o.RenewDeadline,
		RetryPeriod:                   &o.RetryPeriod,
		// Optional: lets the manager run outside a pod.
		LeaderElectionNamespace: o.Namespace,
		WebhookServer:           webhookServer,
		// Named, not controller-runtime's 30 s: with the decision log's
		// flush after it, a stop must fit the pod's grace period (30 s in
		// the chart), or the kill lands during the flush (review 168). The
		// longest wait inside is a decision's finish (approval.FinishGrace).
		GracefulShutdownTimeout: ptr.To(GracefulShutdown),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	activated, err := setUp(ctx, mgr, eng, o, lifetime)
	if err != nil {
		return err
	}
	var podEvents func(engine.BundleStatus)
	if o.PodName != "" && o.Namespace != "" {
		podEvents = bundleEvents(mgr, o.Namespace, o.PodName, eng.Revision())
	}
	notify := func(st engine.BundleStatus) {
		if podEvents != nil {
			podEvents(st)
		}
		if st.Err == nil {
			for _, a := range activated {
				a(st.ActiveRevision)
			}
		}
	}
	bundleChanges.set(notify)
	// A bundle activated since the approvers were set up told nobody.
	for _, a := range activated {
		a(eng.Revision())
	}
	if err := mgr.Add(startPages{cache: mgr.GetCache()}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	if len(o.AdmissionPolicyBindings) > 0 {
		for _, name := range o.AdmissionPolicyBindings {
			if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
				return usage.Errorf("--admission-policy-bindings: %q is no binding's name: %s", name, strings.Join(errs, "; "))
			}
		}
		check := &policyBindings{reader: mgr.GetAPIReader(), names: o.AdmissionPolicyBindings, log: ctrl.Log.WithName("admission-policies")}
		if err := mgr.Add(check); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("admission-policies", check.Check); err != nil {
			return err
		}
	}
	ctrl.Log.WithName("manager").Info("starting", "bundle", bundles.RedactedSource(o.BundleName), "revision", eng.Revision())
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}

// fitMemoryLimit lowers GOMEMLIMIT to fit the container's memory limit when
// it was set above the limit less the binary's pages (memlimit.Target), and
// says so at every start: the chart sets the two apart and cannot compare
// them.
func fitMemoryLimit(logger logr.Logger) {
	container, err := memlimit.ContainerLimit()
	if err != nil {
		logger.V(1).Info("GOMEMLIMIT is kept: the container's memory limit is not known", "reason", err.Error())
		return
	}
	if fit := memlimit.Apply(container); fit.Lowered() {
		logger.Info("WARNING: GOMEMLIMIT was not below the container's memory limit by the binary's pages, so the kernel would kill the manager before the garbage collector worked harder; it is lowered: set manager.goMemLimit to at most loweredToBytes",
			"containerLimitBytes", fit.Container, "goMemLimitBytes", fit.Before, "loweredToBytes", fit.After)
	}
}

// startPages gives back the binary's pages that only the start touched
// (package exepages), once the caches are synced: what the controllers use
// from then on is faulted back, the rest (some 50 MiB of init functions
// and tables) is left out of the resident set. Every replica does it.
type startPages struct {
	cache interface{ WaitForCacheSync(context.Context) bool }
}

func (p startPages) Start(ctx context.Context) error {
	if !p.cache.WaitForCacheSync(ctx) {
		return nil
	}
	logger := ctrl.Log.WithName("manager")
	r, err := exepages.Release()
	switch {
	case errors.Is(err, exepages.ErrUnsupported):
		logger.V(1).Info("the binary's start-up pages are kept", "reason", err.Error())
	case err != nil:
		// Memory only: nothing the manager decides depends on it.
		logger.Error(err, "could not give back the binary's start-up pages")
	default:
		logger.Info("gave back the binary's start-up pages", "residentFileMiBBefore", r.FileBefore>>20, "residentFileMiBAfter", r.FileAfter>>20)
	}
	return nil
}

// NeedLeaderElection is false: a standby's memory counts too.
func (startPages) NeedLeaderElection() bool { return false }

// setLoggers makes logger the controllers' and client-go's: client-go logs
// through klog, whose text lines would otherwise reach stderr raw, with
// whatever a tenant's API server put in an error message (escape sequences
// for the operator's terminal included); the JSON lines escape them.
//
// Go's standard logger goes through it too: the net/http servers that
// controller-runtime builds without an ErrorLog (the webhook's, the
// metrics', the probes') log what fails on a connection (a TLS handshake, a
// client's malformed request, a handler's panic) through it, as text lines
// that reached stderr beside the JSON ones, naming the client.
func setLoggers(logger logr.Logger) {
	ctrl.SetLogger(logger)
	klog.SetLogger(logger.WithName("client-go"))
	stdlog.SetFlags(0)
	stdlog.SetPrefix("")
	stdlog.SetOutput(stdLogWriter{logger.WithName("stdlog")})
}

// stdLogWriter writes each line of Go's standard logger as an entry of the
// manager's log.
type stdLogWriter struct{ logr.Logger }

func (w stdLogWriter) Write(p []byte) (int, error) {
	w.Info(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// newLogger is the controllers' logger: the options the flags set, writing to
// w. Without flags it logs as the manager always has, JSON lines at info with
// the time in epoch seconds (controller-runtime's flag defaults would switch
// the time to RFC 3339, which readers of today's logs do not expect). Its
// values wait for a line to be written (lazyValues).
func newLogger(w io.Writer, flags *zap.Options) logr.Logger {
	var o zap.Options
	if flags != nil {
		o = *flags
	}
	o.DestWriter = w
	if o.TimeEncoder == nil {
		o.TimeEncoder = zapcore.EpochTimeEncoder
	}
	return withLazyValues(zap.New(zap.UseFlagOptions(&o)))
}

// newEngine makes the policy engine with the manager's metrics and, if asked,
// its shadow, and the function that stops both. The returned relay is given
// the function told of bundle changes once the manager is set up (Events on
// its Pod, the approvers' pending requests judged again).
func newEngine(ctx context.Context, o Options) (*engine.Engine, func(context.Context), *statusRelay, error) {
	var shadowBundle *bundle.Bundle
	if o.ShadowBundle != "" {
		b, err := bundles.Load(o.ShadowBundle)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--shadow-bundle: %w", err)
		}
		// The shadow sees every live input, before the mask: a candidate
		// that could reach the network (net.lookup_ip_addr is not
		// http.send, which the engine refuses) or read the clock is
		// refused, as replay refuses it.
		if err := decisionlog.CheckReplayable(b); err != nil {
			return nil, nil, nil, fmt.Errorf("--shadow-bundle: %w", err)
		}
		shadowBundle = b
	}
	metrics, err := engine.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("metrics: %w", err)
	}
	opts := o.Engine
	opts.Metrics = metrics
	if len(opts.VerificationKeys) > 0 {
		epochs, err := bundleEpochs(o)
		if err != nil {
			return nil, nil, nil, err
		}
		opts.Epochs = epochs
	}
	var shadow *engine.Engine
	if shadowBundle != nil {
		shadow, err = engine.New(ctx, engine.Options{Bundle: shadowBundle, DecisionLog: io.Discard, Log: o.Log})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--shadow-bundle: %w", err)
		}
		opts.Shadow = shadow
	}
	// A refused bundle is an Event on the manager's own Pod (named through
	// the downward API), where an operator looks, besides the log and the
	// ichor_policy_bundle_load_failures_total metric; an activated one wakes
	// the approvers (Run sets the function once they are set up).
	changes := &statusRelay{}
	opts.OnBundleStatus = changes.deliver
	eng, err := engine.New(ctx, opts)
	if err != nil {
		if shadow != nil {
			shadow.Stop(context.WithoutCancel(ctx))
		}
		return nil, nil, nil, err
	}
	stop := func(ctx context.Context) {
		eng.Stop(ctx)
		if shadow != nil {
			shadow.Stop(ctx)
		}
	}
	return eng, stop, changes, nil
}

// newWebhookServer is the webhook's server: every handler registered on it
// held to reviewbounds' limits, and with a client CA answering only the API
// server's client certificate, checked before anything else. HTTP/1.1
// only: over HTTP/2 one connection carries hundreds of reviews at once, and
// its streams can be opened and reset faster than they are answered
// (CVE-2023-44487; controller-runtime's and kubebuilder's advice); the API
// server speaks either.
func newWebhookServer(o Options, reg prometheus.Registerer) (crwebhook.Server, error) {
	opts := crwebhook.Options{Port: o.WebhookPort, CertDir: o.WebhookCertDir, TLSOpts: []func(*tls.Config){noHTTP2}}
	limits := reviewbounds.Defaults
	var err error
	if limits.Refused, err = reviewbounds.NewRefused(reg); err != nil {
		return nil, err
	}
	auth := o.WebhookClientAuth
	if auth == nil {
		return reviewbounds.Server(crwebhook.NewServer(opts), limits), nil
	}
	auth.Log = ctrl.Log.WithName("webhook")
	if err := auth.Register(reg); err != nil {
		return nil, err
	}
	opts.TLSOpts = append(opts.TLSOpts, auth.TLS)
	return reviewbounds.Server(auth.Server(crwebhook.NewServer(opts)), limits), nil
}

func noHTTP2(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }

// setUp adds the approvers, the webhook and the issuer to mgr; lifetime is
// that of the manager's own Talos reader credential. It returns the
// approvers' hooks for a bundle activated (BundleActivated).
func setUp(ctx context.Context, mgr ctrl.Manager, eng *engine.Engine, o Options, lifetime time.Duration) (activated []func(revision string), _ error) {
	if o.Webhook && o.WebhookCerts != nil {
		certs := *o.WebhookCerts
		certs.Namespace = o.Namespace
		metrics, err := webhookcerts.NewMetrics(ctrlmetrics.Registry)
		if err != nil {
			return nil, err
		}
		certs.Metrics = metrics
		if err := webhookcerts.Setup(mgr, certs); err != nil {
			return nil, fmt.Errorf("set up the webhook certificates: %w", err)
		}
	}
	if o.LocalClusters.Len() == 0 {
		ctrl.Log.WithName("manager").Info("no TalosCluster judges the kubelets of the API server the manager runs against: --local-clusters names none")
	}
	// The approvers read and write single requests, each bounded (the API
	// server is told the bound, and gives the request up at it), as the
	// tenants' are: a write answered with nothing is then done or undone
	// well within the time its outcome is held uncertain
	// (approval.UncertainWriteMaxAge), whatever the API server's own
	// --request-timeout.
	bounded := rest.CopyConfig(o.Config)
	bounded.Timeout = kubeletserving.DefaultTenantRequestTimeout
	clientset, err := kubernetes.NewForConfig(bounded)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	servingMetrics, err := kubeletserving.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return nil, err
	}
	nodeReaders := &kubeletserving.NodeReaders{Reader: mgr.GetAPIReader(), SecretsClaims: o.secretsClaims(), Lifetime: lifetime, Timeout: o.TalosTimeout,
		Watch: o.TalosWatch, WatchMaxAge: o.TalosWatchMaxAge, WatchMax: o.TalosWatchMax, Denied: o.NodeDenied}
	if err := kubeletserving.RegisterWatchMetrics(ctrlmetrics.Registry, nodeReaders); err != nil {
		return nil, err
	}
	follow := followReaderLifetime(decideReaderLifetime(ctx, eng, o), nodeReaders.SetLifetime, readerIdentityRefused(mgr, o.Namespace, o.PodName))
	// Not in the bundle plugin's own call: the decision waits for nothing
	// the activation holds.
	activated = append(activated, func(revision string) { go follow(revision) })
	serving := &kubeletserving.Reconciler{
		Metrics:        servingMetrics,
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		SecretsClaims:  o.secretsClaims(),
		Clientset:      clientset,
		Engine:         eng,
		Recorder:       mgr.GetEventRecorder("ichor-kubelet-serving"),
		NodeReaders:    nodeReaders,
		LocalClusters:  o.LocalClusters,
		ResyncInterval: o.ResyncInterval,
		// A kubeconfigRef whose server is this API server is refused.
		LocalAPIServer:          &kubeconfig.Local{Config: o.Config, Denied: o.RemoteKubeconfigDenied},
		AllowInsecureKubeconfig: o.RemoteKubeconfigAllowInsecure,
		TenantMaxCSRs:           o.TenantMaxCSRs,
		TenantMaxCSRBytes:       o.TenantMaxCSRBytes,
	}
	if err := setUpSharding(mgr, serving, o); err != nil {
		return nil, err
	}
	if err := serving.SetupWithManager(ctx, mgr); err != nil {
		return nil, fmt.Errorf("set up the kubelet serving approver: %w", err)
	}
	activated = append(activated, serving.BundleActivated)
	if err := setUpAudit(mgr, eng, nodeReaders, o); err != nil {
		return nil, err
	}
	recorder := &manualact.Recorder{Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Engine: eng, Namespace: o.Namespace}
	// One queue of revocations' records for the webhook and the watch, its
	// worker on every replica.
	revocations := &manualact.Revocations{Recorder: recorder}
	if err := mgr.Add(revocations); err != nil {
		return nil, fmt.Errorf("set up the revocations' records: %w", err)
	}
	if o.Webhook {
		if err := setUpCredentials(ctx, mgr, eng, o, recorder, revocations); err != nil {
			return nil, err
		}
	}
	if err := setUpManualDecisions(mgr, recorder, o); err != nil {
		return nil, err
	}
	// Without the webhook nothing is issued, but the admins' bindings are
	// still watched: --admin-kubeconfigs=false removes them either way.
	admins := &credentials.AdminBindings{
		Client: mgr.GetClient(), Engine: eng, Recorder: mgr.GetEventRecorder("ichor-credentials"), AdminKubeconfigs: o.AdminKubeconfigs,
		Revocations: revocations,
	}
	if err := admins.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the admin bindings' watch: %w", err)
	}
	if o.KubeletClientApprover {
		clientApprover := &kubeletclient.Reconciler{
			Client:    mgr.GetClient(),
			Clientset: clientset,
			Engine:    eng,
			// The same clusters as the serving approver's.
			LocalClusters: o.LocalClusters,
			Recorder:      mgr.GetEventRecorder("ichor-kubelet-client"),
		}
		// The serving approver has registered the machine index (kubeletserving.AddIndexes).
		if err := clientApprover.SetupWithManager(ctx, mgr, kubeletclient.SetupOptions{NodeNameIndexRegistered: true}); err != nil {
			return nil, fmt.Errorf("set up the kubelet client approver: %w", err)
		}
		activated = append(activated, clientApprover.BundleActivated)
	}
	return activated, nil
}

// componentNamespaces are the namespaces whose ServiceAccounts may be issued
// the purposes not for people: those given, else the manager's own. A
// person who may make a ServiceAccount in a namespace of theirs, bind it the
// verb issue and take its token would otherwise be issued, through it,
// what is never a person's (review 254 F4). With neither, none is guessed:
// the webhook and the issuer cannot run without the manager's namespace
// (the admission key's Secret is there), so "any namespace" had no caller
// (review 258 F8) and is not offered.
func componentNamespaces(o Options) ([]string, error) {
	for _, ns := range o.ComponentNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, usage.Errorf("--component-namespaces: %q is no namespace name: %s", ns, strings.Join(errs, "; "))
		}
	}
	switch {
	case len(o.ComponentNamespaces) > 0:
		return o.ComponentNamespaces, nil
	case o.Namespace != "":
		return []string{o.Namespace}, nil
	}
	return nil, usage.Errorf("the manager's namespace is unknown: set POD_NAMESPACE (the chart does) or --component-namespaces, the namespaces whose ServiceAccounts may be issued Ichor's own purposes")
}

// setUpSharding makes this replica's part of the sharding, when it is on,
// and gives it to the serving approver, whose shard changes it reports.
func setUpSharding(mgr ctrl.Manager, serving *kubeletserving.Reconciler, o Options) error {
	if o.Sharding.Shards == 0 {
		return nil
	}
	if o.Sharding.Shards < 0 {
		return usage.Errorf("--shards %d is negative", o.Sharding.Shards)
	}
	if o.Sharding.Shards > shard.MaxShards {
		return usage.Errorf("--shards %d is above %d: each shard is a Lease every replica watches; give a few times the most replicas you will run", o.Sharding.Shards, shard.MaxShards)
	}
	identity := o.Sharding.Identity
	if identity == "" {
		identity = o.PodName
	}
	// The Leases get a clientset of their own, so a token bucket of their
	// own (--kube-api-qps and --kube-api-burst each): sharing the
	// approvals' would queue a renewal behind a mass reboot's approvals
	// until the shards lapse, while approvals that passed the fence wait
	// in the same queue (review 5, F2).
	leases, err := kubernetes.NewForConfig(rest.CopyConfig(o.Config))
	if err != nil {
		return fmt.Errorf("the shard Leases' clientset: %w", err)
	}
	metrics, err := shard.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return err
	}
	set, err := shard.New(shard.Options{
		Client: leases, Namespace: o.Namespace, Identity: identity, Shards: o.Sharding.Shards,
		LeaseDuration: o.Sharding.LeaseDuration, RenewDeadline: o.Sharding.RenewDeadline, RetryPeriod: o.Sharding.RetryPeriod,
		Log: ctrl.Log.WithName("shard"), Metrics: metrics, OnChange: serving.ShardChanged,
		OnCountMismatch: shardCountEvents(mgr, o.Namespace, o.PodName, o.Sharding.Shards),
	})
	if err != nil {
		return usage.Errorf("sharding: %v", err)
	}
	serving.Shards = set
	if err := mgr.Add(set); err != nil {
		return fmt.Errorf("set up the sharding: %w", err)
	}
	return nil
}

// setUpAudit adds the periodic audit of the kubelet serving certificates in
// service, when it is on. It reads nodes with the approver's readers, so one
// os:reader credential per cluster serves both.
func setUpAudit(mgr ctrl.Manager, eng *engine.Engine, nodeReaders *kubeletserving.NodeReaders, o Options) error {
	if o.KubeletServingAuditInterval < 0 {
		return usage.Errorf("the kubelet serving audit interval %s is negative", o.KubeletServingAuditInterval)
	}
	if o.KubeletServingAuditInterval == 0 {
		return nil
	}
	metrics, err := kubeletaudit.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return err
	}
	runner := &kubeletaudit.Runner{
		Auditor: &kubeletaudit.Auditor{
			Reader: mgr.GetAPIReader(), SecretsClaims: o.secretsClaims(), NodeReaders: nodeReaders, Engine: eng,
			Port: o.KubeletPort, Timeout: o.TalosTimeout, Denied: o.NodeDenied,
		},
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("ichor-kubelet-serving-audit"),
		Metrics:  metrics,
		Interval: o.KubeletServingAuditInterval,
	}
	if err := mgr.Add(runner); err != nil {
		return fmt.Errorf("set up the kubelet serving audit: %w", err)
	}
	return nil
}

// decidedSigners are the signers whose requests Ichor decides in the API
// server the manager runs against: the kubelet serving signer when the
// operator named the clusters that judge it (--local-clusters); the kubelet
// client signer whenever its approver runs, which it does with no cluster
// named too (a person's approval there makes a node credential, and was not
// recorded: review of 2026-12-06).
func decidedSigners(o Options) []string {
	var signers []string
	if o.LocalClusters.Len() > 0 {
		signers = append(signers, certificatesv1.KubeletServingSignerName)
	}
	if o.KubeletClientApprover {
		signers = append(signers, kubeletclient.SignerName)
	}
	return signers
}

// setUpManualDecisions adds the watch that records a CSR decided by hand
// when the webhook did not (internal/manualact), for the signers Ichor
// decides here.
func setUpManualDecisions(mgr ctrl.Manager, recorder *manualact.Recorder, o Options) error {
	signers := decidedSigners(o)
	if len(signers) == 0 {
		return nil
	}
	if err := (&manualact.CSRDecisions{Recorder: recorder, Signers: signers}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the watch of decisions made by hand: %w", err)
	}
	return nil
}

// setUpCredentials adds the admission webhooks and the issuer, which share the
// admission records' key, and the webhook that records a person's acts
// (which signs its records with the same key).
func setUpCredentials(ctx context.Context, mgr ctrl.Manager, eng *engine.Engine, o Options, recorder *manualact.Recorder, revocations *manualact.Revocations) error {
	keys, err := admissionKeys(mgr, o.Namespace, o.AdmissionKeySecret)
	if err != nil {
		return err
	}
	// Read (or make) the key now, so a missing Secret stops the manager
	// with the reason instead of refusing every request later.
	if _, err := keys.Key(ctx); err != nil {
		return err
	}
	if o.AcceptUnpinnedAdmissions {
		// Meant for the time of an upgrade only: said at every start, so
		// that it is not left on unnoticed.
		ctrl.Log.WithName("manager").Info("WARNING: admission records without the lifetime and credential pins are accepted (--require-admission-pins=false): whoever may edit Events can take the pins away from a record; turn it back on once the requests of the release before the pins are answered")
	}
	components, err := componentNamespaces(o)
	if err != nil {
		return err
	}
	validator := &credwebhook.CredentialRequestValidator{
		Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Engine: eng, Keys: keys, LocalClusters: o.LocalClusters,
		AcceptUnpinned: o.AcceptUnpinnedAdmissions, ComponentNamespaces: components,
	}
	if err := validator.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the credential request webhook: %w", err)
	}
	recorder.Keys = keys
	if err := (&credwebhook.ActRecorder{Recorder: recorder, Signers: decidedSigners(o), Revocations: revocations}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the webhook that records a person's acts: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	// The issuer signs only requests whose admission by this webhook it
	// can prove (admission records made with the same key), so it runs
	// only beside the webhook.
	issuer := &credentials.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Engine: eng, Keys: keys,
		AdminKubeconfigs: o.AdminKubeconfigs, AcceptUnpinned: o.AcceptUnpinnedAdmissions, SecretsClaims: o.secretsClaims(),
		Recorder: mgr.GetEventRecorder("ichor-credentials"), LocalClusters: o.LocalClusters,
		ComponentNamespaces: components,
	}
	if err := issuer.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the credential issuer: %w", err)
	}
	return nil
}

// ReaderLifetime asks the policy (purpose node-reader) for the lifetime of
// the manager's own Talos identity: its default, or the one asked for if the
// cap allows it. talosnode refuses anything above 15 minutes on its own too.
// `ichor audit` asks the same for the identity it reads nodes with.
func ReaderLifetime(ctx context.Context, eng *engine.Engine, asked time.Duration) (time.Duration, error) {
	lifetime, _, err := readerLifetimeOf(ctx, eng, asked)
	return lifetime, err
}

// readerLifetimeOf is ReaderLifetime, with the revision of the bundle that
// decided it (none when there was no decision).
func readerLifetimeOf(ctx context.Context, eng *engine.Engine, asked time.Duration) (time.Duration, string, error) {
	in := engine.CredentialCheckInput{
		Purpose:   "node-reader",
		PublicKey: engine.PublicKeyFacts{Parsed: true, Algorithm: "Ed25519", Bits: 256},
	}
	if asked > 0 {
		secs := asked.Seconds()
		in.TTLSeconds = &secs
	}
	d, err := eng.CheckCredential(ctx, in)
	if err != nil {
		return 0, "", fmt.Errorf("lifetime of the manager's Talos identity: %w", err)
	}
	if !d.Allowed || d.Certificate == nil || d.Certificate.TalosRole != talosnode.ReaderRole {
		return 0, d.Revision, usage.Errorf("the policy refuses the manager's Talos identity: %s", d.Reasons.String())
	}
	return time.Duration(d.LifetimeSeconds * float64(time.Second)), d.Revision, nil
}

// decideReaderLifetime is the decision followReaderLifetime asks at each
// revision activated: the lifetime the bundle in service gives the
// manager's Talos identity, checked against the reader's flags as the start
// checks it: a lifetime the reader refuses, or one no watch could keep,
// would leave every node unread (review 200 F2).
func decideReaderLifetime(ctx context.Context, eng *engine.Engine, o Options) func() (time.Duration, string, error) {
	return func() (time.Duration, string, error) {
		lifetime, revision, err := readerLifetimeOf(ctx, eng, o.ReaderLifetime)
		if err == nil {
			err = checkTalosReader(o, lifetime)
		}
		return lifetime, revision, err
	}
}

// followReaderLifetime has the manager's own Talos identity follow the
// bundle in service: at each revision activated, its lifetime as that
// bundle caps it (decide: ReaderLifetime), given to set. Decided once at
// start, a bundle that lowered the cap took effect at the next restart only
// (review 197B F3). A bundle that refuses the identity leaves the lifetime
// as it was, and refused says so: no replica would start with it.
// The revision refused is the one decide decided under, which may be later
// than the activation's. An error that is no decision (an evaluation that
// failed, a stop) changes nothing and is asked again at the next poll:
// refused names usage errors only (review 200 F5).
func followReaderLifetime(decide func() (time.Duration, string, error), set func(time.Duration), refused func(revision string, err error)) func(revision string) {
	var mu sync.Mutex
	last := ""
	return func(revision string) {
		mu.Lock()
		defer mu.Unlock()
		if revision == last {
			return // OPA says every poll that found the bundle unchanged
		}
		lifetime, decided, err := decide()
		switch {
		case err != nil && !usage.Is(err):
			ctrl.Log.WithName("manager").Error(err, "the lifetime of the manager's Talos identity was not decided for the bundle activated; asked again at the next poll", "revision", revision)
			return
		case err != nil:
			refused(decided, err)
		default:
			set(lifetime)
		}
		last = revision
	}
}

// readerIdentityRefused says, in the log and on the manager's own Pod, that
// the bundle in service refuses the manager's Talos identity.
func readerIdentityRefused(mgr ctrl.Manager, namespace, pod string) func(revision string, err error) {
	logger := ctrl.Log.WithName("manager")
	rec := mgr.GetEventRecorder("ichor-policy")
	self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace}}
	return func(revision string, err error) {
		logger.Error(err, "under the policy bundle in service the manager's own Talos identity cannot be used (the policy refuses it, or the lifetime it decides does not suit the reader's flags): nodes are read with the lifetime decided before, and no replica starts with this bundle", "revision", revision)
		if pod != "" {
			rec.Eventf(self, nil, corev1.EventTypeWarning, "ReaderIdentityRefused", engine.EventAction("LoadBundle", revision, err.Error()), "%s",
				engine.Clip(fmt.Sprintf("under policy bundle revision %s the manager's Talos identity (purpose node-reader) cannot be used: %v", revision, err),
					"; nodes are read with the lifetime decided before, and no replica starts with this bundle", engine.MaxEventNote))
		}
	}
}

// admissionKeys is the admission key in the Secret name of the manager's
// namespace, read uncached: the manager needs get and update on that one
// Secret, never list or watch.
func admissionKeys(mgr ctrl.Manager, namespace, name string) (*credential.Keys, error) {
	if namespace == "" {
		return nil, usage.Errorf("the manager's namespace is unknown: set POD_NAMESPACE (the chart does), where the Secret --admission-key-secret %s is", name)
	}
	c, err := client.New(mgr.GetConfig(), client.Options{HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("admission key client: %w", err)
	}
	return &credential.Keys{Client: c, Namespace: namespace, Name: name}, nil
}

// bundleEpochs is where the highest bundle epoch activated in the cluster is
// kept, read uncached (get and update on one ConfigMap): without it a
// restart would accept any signed bundle down to the binary's floor.
func bundleEpochs(o Options) (engine.EpochStore, error) {
	if o.Namespace == "" {
		return nil, usage.Errorf("the manager's namespace is unknown: set POD_NAMESPACE (the chart does), where the ConfigMap %s keeps the highest bundle epoch a signed --bundle may not go below", bundleepoch.ConfigMapName)
	}
	scheme, err := kube.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(o.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("bundle epoch client: %w", err)
	}
	return &bundleepoch.Store{Client: c, Namespace: o.Namespace}, nil
}

// statusRelay hands the engine's bundle statuses to the function set once
// the manager is set up. A refusal before then is kept and handed over when
// it is set (review 178: a file source refuses a file once, so a refusal
// while the manager was being set up never became its Event).
type statusRelay struct {
	mu sync.Mutex
	f  func(engine.BundleStatus)
	// refused is the last status before f was set, when it was a refusal.
	refused *engine.BundleStatus
}

func (r *statusRelay) deliver(st engine.BundleStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.f != nil:
		r.f(st)
	case st.Err != nil:
		r.refused = &st
	default:
		// A bundle activated since: the refusal is no longer the latest.
		r.refused = nil
	}
}

// set hands every status from now on to f, the last refusal before first.
func (r *statusRelay) set(f func(engine.BundleStatus)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.f = f
	if r.refused != nil {
		f(*r.refused)
		r.refused = nil
	}
}

// bundleEvents turns the engine's bundle changes into Events on the manager's
// own Pod; inService is the revision serving when it is set up.
func bundleEvents(mgr ctrl.Manager, namespace, pod, inService string) func(engine.BundleStatus) {
	return bundleEventsTo(mgr.GetEventRecorder("ichor-policy"), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace}}, inService)
}

// bundleEventsTo records bundle changes as Events regarding self: each
// refusal, and each activation of another revision than the one in service.
// OPA tells of every poll of a URL or a registry that found the bundle
// unchanged (every 30 s by default) as it tells of an activation: an Event
// for each said "activated" of a bundle that had served for days.
func bundleEventsTo(rec events.EventRecorder, self runtime.Object, inService string) func(engine.BundleStatus) {
	var mu sync.Mutex
	last := inService
	return func(st engine.BundleStatus) {
		if st.Err != nil {
			// The recorder keeps one Event series per reason and action:
			// the cause goes in the action, so that each distinct cause
			// is an Event of its own with its own count and note.
			rec.Eventf(self, nil, corev1.EventTypeWarning, "BundleRefused", bundleRefusalAction(st.Err), "%s",
				engine.Clip(fmt.Sprintf("policy bundle refused: %v", st.Err), fmt.Sprintf("; revision %s keeps serving", st.ActiveRevision), engine.MaxEventNote))
			return
		}
		mu.Lock()
		changed := st.ActiveRevision != last
		last = st.ActiveRevision
		mu.Unlock()
		if changed {
			rec.Eventf(self, nil, corev1.EventTypeNormal, "BundleActivated", engine.EventAction("LoadBundle", st.ActiveRevision), "policy bundle revision %s active", st.ActiveRevision)
		}
	}
}

// shardCountEvents says on the manager's own Pod when live replicas
// announce another shard count than this one's, and when they agree again:
// meanwhile this replica serves no cluster (internal/shard).
func shardCountEvents(mgr ctrl.Manager, namespace, pod string, shards int) func(map[string]string) {
	if pod == "" {
		return nil
	}
	rec := mgr.GetEventRecorder("ichor-policy")
	self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace}}
	return func(others map[string]string) {
		if len(others) == 0 {
			rec.Eventf(self, nil, corev1.EventTypeNormal, "ShardCountAgreed", engine.EventAction("Shard", strconv.Itoa(shards)), "the live replicas agree on --shards=%d: this replica serves its shards again", shards)
			return
		}
		note := shardCountMismatchNote(shards, others)
		rec.Eventf(self, nil, corev1.EventTypeWarning, "ShardCountMismatch", engine.EventAction("Shard", note), "%s", note)
	}
}

// shardCountMismatchNote names the replicas announcing another shard count,
// by their Leases' holder identities and labels: whoever may write Leases in
// the namespace chooses those, so each is escaped as one line (termsafe)
// before it reaches kubectl describe, and the note is cut to an Event's size.
func shardCountMismatchNote(shards int, others map[string]string) string {
	named := make([]string, 0, len(others))
	for id, n := range others {
		if n == "" {
			n = "none announced"
		}
		named = append(named, termsafe.EscapeLine(id)+" ("+termsafe.EscapeLine(n)+")")
	}
	slices.Sort(named)
	return engine.Clip(fmt.Sprintf("this replica (--shards=%d) serves no cluster while live replicas announce another shard count: %s", shards, strings.Join(named, ", ")),
		"; give every replica the same --shards", engine.MaxEventNote)
}

// bundleRefusalAction names a refusal's cause for its Event: the same cause
// (one bundle refused again and again) is one series, another cause another.
func bundleRefusalAction(err error) string {
	return engine.EventAction("LoadBundle", err.Error())
}

// secretsClaims is what a Secret a TalosCluster names must say of the
// clusters that use it.
func (o Options) secretsClaims() clustersecrets.Claims {
	return clustersecrets.ClaimsOf(!o.AllowUnclaimedSecrets)
}
