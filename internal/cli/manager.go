package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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
	"github.com/ichor-dev/ichor-policy/controllers/kubeletclient"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	credwebhook "github.com/ichor-dev/ichor-policy/webhook"
	"github.com/ichor-dev/ichor-policy/webhook/webhookcerts"
)

type managerOptions struct {
	metricsAddr          string
	probeAddr            string
	leaderElect          bool
	bundle               string
	bundleKeys           []string
	bundleInsecureHTTP   bool
	bundleKeyID          string
	bundleKeyAlg         string
	bundlePoll           time.Duration
	shadowBundle         string
	logFile              string
	logURL               string
	logBuffer            int64
	logFlushTimeout      time.Duration
	leaseDuration        time.Duration
	renewDeadline        time.Duration
	retryPeriod          time.Duration
	webhook              bool
	kubeletClient        bool
	admissionKeySecret   string
	localClusters        []string
	adminKubeconfigs     bool
	webhookPort          int
	webhookCertDir       string
	webhookGenerateCerts bool
	webhookCertSecret    string
	webhookService       string
	webhookConfiguration string
	webhookClusterDomain string
	resync               time.Duration
	talosTimeout         time.Duration
	readerLifetime       time.Duration
	kubeconfig           string
	qps                  float32
	burst                int
}

func newManagerCommand(s streams) *cobra.Command {
	var o managerOptions
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the controllers and the admission webhook: kubelet certificate approvers, credential issuance",
		Long: `Run the controllers against the cluster of the current kubeconfig (in a pod: its
service account). Every decision is written to standard output as one JSON line
(OPA's decision log); the controllers' own logs go to standard error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runManager(cmd, s, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	f.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader, so that of several replicas one acts")
	f.StringVar(&o.bundle, "bundle", "", "the policy bundle to serve: a tarball path or an http(s) URL, both reloaded when they change, or a policy directory (read once); default: the embedded bundle")
	f.StringArrayVar(&o.bundleKeys, "bundle-key", nil, "a public key (PEM file) bundles must be signed with; repeatable; with it an unsigned or otherwise signed bundle is refused")
	f.BoolVar(&o.bundleInsecureHTTP, "bundle-allow-insecure-http", false, "accept a --bundle URL over plain http:// (refused by default, signed or not: anyone on the path could serve an older signed bundle or none)")
	f.StringVar(&o.bundleKeyID, "bundle-key-id", "ichor", "the key id of --bundle-key (as `ichor bundle build --key-id` writes it)")
	f.StringVar(&o.bundleKeyAlg, "bundle-key-algorithm", "RS256", "the signing algorithm of --bundle-key")
	f.DurationVar(&o.bundlePoll, "bundle-poll-interval", engine.DefaultPollInterval, "how often --bundle is looked at for a new bundle")
	f.StringVar(&o.shadowBundle, "shadow-bundle", "", "a candidate bundle (directory or tarball) evaluated beside the active one on every decision, never acted on; disagreements are logged and counted")
	f.StringVar(&o.logFile, "decision-log-file", "", "also append the decision log to this file")
	f.StringVar(&o.logURL, "decision-log-url", "", "also upload the decision log to this service (OPA's decision-log API)")
	f.Int64Var(&o.logBuffer, "decision-log-buffer-events", engine.DefaultDecisionLogBufferEvents, "entries the upload buffer holds while the service is away; when it is full the oldest are dropped, counted in ichor_policy_decision_log_upload_dropped_total{cause=\"buffer_full\"}")
	f.DurationVar(&o.logFlushTimeout, "decision-log-flush-timeout", 10*time.Second, "at shutdown, how long the upload buffer may take to send what it holds; what is left is lost, logged and counted (cause shutdown). The pod's terminationGracePeriodSeconds must cover it")
	f.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the leader's last renewal before taking over when the leader dies without releasing the lease (a leader that stops cleanly releases it at once)")
	f.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it gives up leading")
	f.DurationVar(&o.retryPeriod, "leader-elect-retry-period", time.Second, "how often candidates try to take the lease, and the leader to renew it: a released lease is taken within this")
	f.BoolVar(&o.kubeletClient, "kubelet-client-approver", false, "approve kubelet client certificates (signer kubernetes.io/kube-apiserver-client-kubelet) as kube-controller-manager's csrapproving controller does; see docs/kubelet-client.md before switching it on")
	f.BoolVar(&o.webhook, "webhook", true, "serve the TalosCredentialRequest admission webhook and issue credentials (it needs a serving certificate: --webhook-cert-dir or --webhook-generate-certs); without it no credential is issued")
	f.StringSliceVar(&o.localClusters, "local-clusters", nil, "the TalosClusters (namespace/name, comma-separated or repeated) whose machines are nodes of the API server the manager runs against, and which alone judge its kubelet certificate requests; a cluster without spec.kubeconfigRef that is not named here judges nothing (condition KubeletServingCertificates, reason LocalClusterNotNamed)")
	f.StringVar(&o.admissionKeySecret, "admission-key-secret", credential.DefaultKeySecretName, "Secret in the manager's namespace ($POD_NAMESPACE), created empty, that the manager fills with the key of the admission records the webhook writes and the issuer verifies: without a record made with it no credential is issued")
	f.BoolVar(&o.adminKubeconfigs, "admin-kubeconfigs", true, "issue admin kubeconfigs (group ichor:cluster-admins); false revokes them for good: none is issued even if the ichor:cluster-admins binding is recreated (the chart's adminCredentials.enabled=false also removes the binding)")
	f.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the admission webhook server (HTTPS)")
	f.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "directory of the webhook server's tls.crt and tls.key (default: controller-runtime's, under the temporary directory)")
	f.BoolVar(&o.webhookGenerateCerts, "webhook-generate-certs", false, "make and renew the webhook's CA and serving certificate, kept in --webhook-cert-secret, and set the CA bundle of --webhook-configuration (leave off when cert-manager provides them)")
	f.StringVar(&o.webhookCertSecret, "webhook-cert-secret", webhookcerts.DefaultSecretName, "Secret in the manager's namespace ($POD_NAMESPACE) that keeps the webhook's CA and serving certificate")
	f.StringVar(&o.webhookService, "webhook-service", webhookcerts.DefaultServiceName, "the webhook's Service in the manager's namespace, which the serving certificate names")
	f.StringVar(&o.webhookConfiguration, "webhook-configuration", webhookcerts.DefaultWebhookConfigurationName, "the ValidatingWebhookConfiguration whose CA bundle the manager sets")
	f.StringVar(&o.webhookClusterDomain, "webhook-cluster-domain", webhookcerts.DefaultClusterDomain, "the cluster's DNS domain, for the serving certificate's NAME.NAMESPACE.svc.DOMAIN")
	f.DurationVar(&o.resync, "resync-interval", kubeletserving.DefaultResyncInterval, "how often every cluster is looked at again in full")
	f.DurationVar(&o.talosTimeout, "talos-timeout", kubeletserving.DefaultTalosTimeout, "bound on reading one node's identity from its Talos API")
	f.DurationVar(&o.readerLifetime, "talos-reader-lifetime", 0, "lifetime of the manager's own os:reader Talos certificate (default: the policy's default for purpose node-reader; above the policy's cap is refused)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to run against (default: in-cluster, then $KUBECONFIG)")
	f.Float32Var(&o.qps, "kube-api-qps", 300, "requests per second to the API server: an approval costs about three (the approval, its Event, the machine's record), so this sustains about 100 approvals a second; the API server's priority and fairness protects itself beyond (see docs/performance.md)")
	f.IntVar(&o.burst, "kube-api-burst", 600, "burst of requests to the API server, for a mass reboot")
	return cmd
}

// readerLifetime asks the policy (purpose node-reader) for the lifetime of
// the manager's own Talos identity: its default, or the one asked for if the
// cap allows it. talosnode refuses anything above 15 minutes on its own too.
func readerLifetime(ctx context.Context, eng *engine.Engine, asked time.Duration) (time.Duration, error) {
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
		return 0, fmt.Errorf("lifetime of the manager's Talos identity: %w", err)
	}
	if !d.Allowed || d.Certificate == nil || d.Certificate.TalosRole != talosnode.ReaderRole {
		return 0, usagef("the policy refuses the manager's Talos identity: %s", engine.Messages(d.Reasons))
	}
	return time.Duration(d.LifetimeSeconds * float64(time.Second)), nil
}

// engineOptions turns the bundle and decision-log flags into engine options.
func (o managerOptions) engineOptions(s streams) (engine.Options, error) {
	opts := engine.Options{
		DecisionLog: s.out, Log: s.err, PollInterval: o.bundlePoll,
		DecisionLogFile: o.logFile, DecisionLogURL: o.logURL, DecisionLogBufferEvents: o.logBuffer,
		AllowInsecureHTTP: o.bundleInsecureHTTP,
	}
	for _, path := range o.bundleKeys {
		key, err := os.ReadFile(path)
		if err != nil {
			return opts, fmt.Errorf("--bundle-key: %w", err)
		}
		opts.VerificationKeys = append(opts.VerificationKeys, engine.VerificationKey{ID: o.bundleKeyID, PEM: string(key), Algorithm: o.bundleKeyAlg})
	}
	if len(opts.VerificationKeys) > 1 {
		return opts, usagef("--bundle-key: one key per --bundle-key-id; give one key")
	}
	switch info, err := os.Stat(o.bundle); {
	case o.bundle == "":
	case err == nil && info.IsDir():
		if len(opts.VerificationKeys) > 0 {
			return opts, usagef("--bundle %s is a directory, which cannot be signed; give a signed tarball", o.bundle)
		}
		b, err := bundles.FromDir(o.bundle)
		if err != nil {
			return opts, err
		}
		opts.Bundle = b
	default:
		opts.Source = o.bundle
	}
	return opts, nil
}

// bundleRefusalAction names a refusal's cause for its Event: the same cause
// (one bundle refused again and again) is one series, another cause another.
func bundleRefusalAction(err error) string {
	sum := sha256.Sum256([]byte(err.Error()))
	return "LoadBundle/" + hex.EncodeToString(sum[:4])
}

// admissionKeys is the admission key in the Secret name of the manager's
// namespace, read uncached: the manager needs get and update on that one
// Secret, never list or watch.
func admissionKeys(mgr ctrl.Manager, name string) (*credential.Keys, error) {
	namespace := os.Getenv("POD_NAMESPACE")
	if namespace == "" {
		return nil, usagef("the manager's namespace is unknown: set POD_NAMESPACE (the chart does), where the Secret --admission-key-secret %s is", name)
	}
	c, err := client.New(mgr.GetConfig(), client.Options{HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("admission key client: %w", err)
	}
	return &credential.Keys{Client: c, Namespace: namespace, Name: name}, nil
}

// Scheme is the manager's scheme: the Kubernetes types and Ichor's.
func Scheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := ichorv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

func runManager(cmd *cobra.Command, s streams, o managerOptions) error {
	ctx := cmd.Context()
	if o.readerLifetime < 0 {
		return usagef("--talos-reader-lifetime %s is negative", o.readerLifetime)
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(s.err), zap.JSONEncoder()))
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst
	scheme, err := Scheme()
	if err != nil {
		return fmt.Errorf("scheme: %w", err)
	}

	metrics, err := engine.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	opts, err := o.engineOptions(s)
	if err != nil {
		return err
	}
	opts.Metrics = metrics
	if o.shadowBundle != "" {
		b, err := bundles.Load(o.shadowBundle)
		if err != nil {
			return fmt.Errorf("--shadow-bundle: %w", err)
		}
		shadow, err := engine.New(ctx, engine.Options{Bundle: b, DecisionLog: io.Discard, Log: s.err})
		if err != nil {
			return fmt.Errorf("--shadow-bundle: %w", err)
		}
		defer shadow.Stop(context.WithoutCancel(ctx))
		opts.Shadow = shadow
	}
	// A refused bundle is an Event on the manager's own Pod (named through
	// the downward API), where an operator looks, besides the log and the
	// ichor_policy_bundle_load_failures_total metric.
	var podEvents atomic.Pointer[func(engine.BundleStatus)]
	opts.OnBundleStatus = func(st engine.BundleStatus) {
		if f := podEvents.Load(); f != nil {
			(*f)(st)
		}
	}
	eng, err := engine.New(ctx, opts)
	if err != nil {
		return err
	}
	// After the controllers stopped (and the lease was released): what the
	// upload sink holds is sent within the flush timeout.
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.logFlushTimeout)
		defer cancel()
		eng.Stop(flushCtx)
	}()

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		// Nothing here reads managedFields; at thousands of CSRs and
		// machines they are a large part of the cache.
		Cache:                  cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		LeaderElection:         o.leaderElect,
		LeaderElectionID:       "ichor-policy.ichor.dev",
		// Released once the controllers have stopped, so a standby takes
		// over within a retry period rather than a whole lease duration.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		// Optional: lets the manager run outside a pod.
		LeaderElectionNamespace: os.Getenv("POD_NAMESPACE"),
		WebhookServer:           crwebhook.NewServer(crwebhook.Options{Port: o.webhookPort, CertDir: o.webhookCertDir}),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if o.webhook && o.webhookGenerateCerts {
		if err := webhookcerts.Setup(mgr, webhookcerts.Options{
			Namespace:                os.Getenv("POD_NAMESPACE"),
			ServiceName:              o.webhookService,
			ClusterDomain:            o.webhookClusterDomain,
			SecretName:               o.webhookCertSecret,
			WebhookConfigurationName: o.webhookConfiguration,
		}); err != nil {
			return fmt.Errorf("set up the webhook certificates: %w", err)
		}
	}
	lifetime, err := readerLifetime(ctx, eng, o.readerLifetime)
	if err != nil {
		return err
	}
	localClusters, err := cluster.ParseLocal(o.localClusters)
	if err != nil {
		return usagef("--local-clusters: %v", err)
	}
	if localClusters.Len() == 0 {
		ctrl.Log.WithName("manager").Info("no TalosCluster judges the kubelets of the API server the manager runs against: --local-clusters names none")
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	serving := &kubeletserving.Reconciler{
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		Clientset:      clientset,
		Engine:         eng,
		Recorder:       mgr.GetEventRecorder("ichor-kubelet-serving"),
		NodeReaders:    &kubeletserving.NodeReaders{Reader: mgr.GetAPIReader(), Lifetime: lifetime, Timeout: o.talosTimeout},
		LocalClusters:  localClusters,
		ResyncInterval: o.resync,
	}
	if err := serving.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("set up the kubelet serving approver: %w", err)
	}
	if o.webhook {
		keys, err := admissionKeys(mgr, o.admissionKeySecret)
		if err != nil {
			return err
		}
		// Read (or make) the key now, so a missing Secret stops the manager
		// with the reason instead of refusing every request later.
		if _, err := keys.Key(ctx); err != nil {
			return err
		}
		validator := &credwebhook.CredentialRequestValidator{
			Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Engine: eng, Keys: keys, LocalClusters: localClusters,
		}
		if err := validator.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the credential request webhook: %w", err)
		}
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
		// The issuer signs only requests whose admission by this webhook it
		// can prove (admission records made with the same key), so it runs
		// only beside the webhook.
		issuer := &credentials.Reconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Engine: eng, Keys: keys,
			AdminKubeconfigs: o.adminKubeconfigs, Recorder: mgr.GetEventRecorder("ichor-credentials"), LocalClusters: localClusters,
		}
		if err := issuer.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the credential issuer: %w", err)
		}
	}
	if o.kubeletClient {
		clientApprover := &kubeletclient.Reconciler{
			Client:    mgr.GetClient(),
			Clientset: clientset,
			Engine:    eng,
			// The same clusters as the serving approver's.
			LocalClusters: localClusters,
		}
		// The serving approver has registered the machine index (kubeletserving.AddIndexes).
		if err := clientApprover.SetupWithManager(ctx, mgr, kubeletclient.SetupOptions{NodeNameIndexRegistered: true}); err != nil {
			return fmt.Errorf("set up the kubelet client approver: %w", err)
		}
	}
	if pod, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE"); pod != "" && ns != "" {
		rec := mgr.GetEventRecorder("ichor-policy")
		self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns}}
		notify := func(st engine.BundleStatus) {
			if st.Err != nil {
				// The recorder keeps one Event series per reason and action:
				// the cause goes in the action, so that each distinct cause
				// is an Event of its own with its own count and note.
				rec.Eventf(self, nil, corev1.EventTypeWarning, "BundleRefused", bundleRefusalAction(st.Err), "%s",
					engine.Clip(fmt.Sprintf("policy bundle refused: %v", st.Err), fmt.Sprintf("; revision %s keeps serving", st.ActiveRevision), engine.MaxEventNote))
			} else {
				rec.Eventf(self, nil, corev1.EventTypeNormal, "BundleActivated", "LoadBundle", "policy bundle revision %s active", st.ActiveRevision)
			}
		}
		podEvents.Store(&notify)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.WithName("manager").Info("starting", "bundle", o.bundle, "revision", eng.Revision())
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}
