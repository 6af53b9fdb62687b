package cli

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"math"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/cluster"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/manager"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/shard"
	"github.com/ichor-dev/ichor-policy/internal/smallfile"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/internal/usage"
	"github.com/ichor-dev/ichor-policy/webhook/apiserverauth"
	"github.com/ichor-dev/ichor-policy/webhook/webhookcerts"
)

type managerOptions struct {
	audit                auditManagerFlags
	metricsAddr          string
	probeAddr            string
	leaderElect          bool
	bundle               string
	bundleKeys           []string
	bundleInsecureHTTP   bool
	bundleRegistryCreds  string
	bundleKeyID          string
	bundleKeySHA256      string
	bundleKeyAlg         string
	bundlePoll           time.Duration
	bundleLimits         bundles.Limits
	shadowBundle         string
	logFile              string
	logFileMaxMiB        int
	logFileMaxBackups    int
	logURL               string
	logTokenFile         string
	logInsecureHTTP      bool
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
	componentNamespaces  []string
	policyBindings       []string
	requirePins          bool
	requireSecretsClaim  bool
	allowInsecureRemote  bool
	deniedRemote         []string
	deniedNodes          []string
	webhookPort          int
	webhookCertDir       string
	webhookClientCA      string
	webhookClientNames   []string
	webhookClientCAPin   string
	webhookGenerateCerts bool
	webhookCertSecret    string
	webhookService       string
	webhookConfiguration string
	webhookClusterDomain string
	resync               time.Duration
	talosTimeout         time.Duration
	talosWatch           bool
	talosWatchMaxAge     time.Duration
	talosWatchMax        int
	tenantMaxCSRs        int
	tenantMaxCSRMiB      int
	readerLifetime       time.Duration
	kubeconfig           string
	qps                  float32
	burst                int
	log                  zap.Options
	sharding             manager.Sharding
}

// managerCommand is the manager's command name.
const managerCommand = "manager"

func newManagerCommand(s streams) *cobra.Command {
	var o managerOptions
	cmd := &cobra.Command{
		Use:   managerCommand,
		Short: "Run the controllers and the admission webhook: kubelet certificate approvers, credential issuance",
		Long: `Run the controllers against the cluster of the current kubeconfig (in a pod: its
service account). Every decision is written to standard output as one JSON line
(OPA's decision log); the controllers' own logs go to standard error.`,
		Args: cobra.NoArgs,
		// Its decision log is flushed and its shards released at a stop,
		// however long that takes (the pod's grace period bounds it).
		Annotations: map[string]string{stopsGracefully: "true"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runManager(cmd.Context(), s, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	f.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader, so that of several replicas one acts")
	f.StringVar(&o.bundle, "bundle", "", "the policy bundle to serve: a tarball path, an http(s) URL or an OCI reference (oci://REGISTRY/REPO:TAG, or oci+http:// for a plain-HTTP registry), each reloaded when it changes, or a policy directory (read once); default: the embedded bundle")
	f.StringArrayVar(&o.bundleKeys, "bundle-key", nil, "a public key (PEM file) bundles must be signed with; repeatable; with it an unsigned or otherwise signed bundle is refused")
	f.BoolVar(&o.bundleInsecureHTTP, "bundle-allow-insecure-http", false, "accept a --bundle over plain HTTP, http:// or oci+http:// (refused by default, signed or not: anyone on the path could serve an older signed bundle or none)")
	f.StringVar(&o.bundleRegistryCreds, "bundle-registry-credentials", "", "a Docker config file (what docker login writes, or a kubernetes.io/dockerconfigjson Secret's .dockerconfigjson) whose \"auths\" hold a user name and a password or token for the registry of an oci:// --bundle, read at each pull; sent to that registry and the token service it names, never elsewhere; credential helpers are not run")
	f.StringVar(&o.bundleKeyID, "bundle-key-id", "ichor", "the key id of --bundle-key (as \"ichor bundle build --key-id\" writes it)")
	f.StringVar(&o.bundleKeySHA256, "bundle-key-sha256", "", "the SHA-256 (hex) the --bundle-key file must have: the manager refuses to start on another, so that whoever may replace the file (a ConfigMap's writers) cannot replace the trust root with it")
	f.StringVar(&o.bundleKeyAlg, "bundle-key-algorithm", "RS256", "the signing algorithm of --bundle-key")
	f.DurationVar(&o.bundlePoll, "bundle-poll-interval", engine.DefaultPollInterval, "how often --bundle is looked at for a new bundle (at least 100ms)")
	f.Int64Var(&o.bundleLimits.CompressedBytes, "bundle-max-compressed-bytes", bundles.DefaultLimits.CompressedBytes, "refuse a --bundle file, download or registry layer larger than this, before OPA reads it")
	f.Int64Var(&o.bundleLimits.UncompressedBytes, "bundle-max-uncompressed-bytes", bundles.DefaultLimits.UncompressedBytes, "refuse a --bundle larger than this once decompressed (every file and tar header together), found by a scan that keeps nothing, before OPA reads it")
	f.IntVar(&o.bundleLimits.Files, "bundle-max-files", bundles.DefaultLimits.Files, "refuse a --bundle of more files than this, before OPA reads it")
	f.StringVar(&o.shadowBundle, "shadow-bundle", "", "a candidate bundle (directory or tarball) evaluated beside the active one on every decision, never acted on; disagreements are logged and counted")
	f.StringVar(&o.logFile, "decision-log-file", "", "also append the decision log to this file, rotated by size (--decision-log-file-max-mib, --decision-log-file-max-backups)")
	f.IntVar(&o.logFileMaxMiB, "decision-log-file-max-mib", engine.DefaultDecisionLogFileMaxMiB, "rotate --decision-log-file when it reaches this many MiB: it is renamed with the time in its name (decisions-2026-12-01T15-04-05.000.log) and a new one begun")
	f.IntVar(&o.logFileMaxBackups, "decision-log-file-max-backups", engine.DefaultDecisionLogFileMaxBackups, "how many rotated --decision-log-file files are kept; the oldest beyond it are removed")
	f.StringVar(&o.logURL, "decision-log-url", "", "also upload the decision log to this service (OPA's decision-log API), an https:// URL (http:// with --decision-log-allow-insecure-http); a password in it (https://user:password@host) is never logged")
	f.StringVar(&o.logTokenFile, "decision-log-token-file", "", "send the --decision-log-url service this file's bearer token (Authorization: Bearer), read at each upload so that a rotated Secret is used at the next: a credential that, unlike a password in the URL, no container argument shows; never sent over plain http off this host's loopback")
	f.BoolVar(&o.logInsecureHTTP, "decision-log-allow-insecure-http", false, "accept a --decision-log-url over plain HTTP (refused by default: anyone on the path could read every decision, and a password in the URL, and drop entries)")
	f.Int64Var(&o.logBuffer, "decision-log-buffer-events", engine.DefaultDecisionLogBufferEvents, "entries the upload buffer holds while the service is away; when it is full the oldest are dropped, counted in ichor_policy_decision_log_upload_dropped_total{cause=\"buffer_full\"}")
	f.DurationVar(&o.logFlushTimeout, "decision-log-flush-timeout", 10*time.Second, "at shutdown, how long the upload buffer may take to send what it holds; what is left is lost, logged and counted (cause shutdown). The pod's terminationGracePeriodSeconds must cover it")
	f.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the leader's last renewal before taking over when the leader dies without releasing the lease (a leader that stops cleanly releases it at once)")
	f.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it gives up leading")
	f.DurationVar(&o.retryPeriod, "leader-elect-retry-period", time.Second, "how often candidates try to take the lease, and the leader to renew it: a released lease is taken within this")
	f.IntVar(&o.sharding.Shards, "shards", 0, "share the TalosClusters out among the replicas in this many shards, each held by one replica through a Lease (ichor-policy-shard-<shards>-<shard> in $POD_NAMESPACE) and given to the live replicas by rendezvous hashing; every replica then approves kubelet serving requests for its own shards' clusters, leader or not. 0 turns sharding off (one replica, or the leader, serves every cluster). Give every replica the same number, a few times the most replicas you will run; see docs/architecture.md#sharding")
	f.DurationVar(&o.sharding.LeaseDuration, "shard-lease-duration", shard.DefaultLeaseDuration, "how long after a replica's last renewal of its membership Lease the others take its shards when it dies without giving them up (a replica that stops cleanly gives them up at once); above --shard-renew-deadline plus --shard-retry-period")
	f.DurationVar(&o.sharding.RenewDeadline, "shard-renew-deadline", shard.DefaultRenewDeadline, "how long a replica keeps trying to renew its membership before it stops serving its shards")
	f.DurationVar(&o.sharding.RetryPeriod, "shard-retry-period", shard.DefaultRetryPeriod, "how often a replica renews its membership and looks at the shards' Leases: a shard given up is taken within this")
	f.StringVar(&o.sharding.Identity, "shard-identity", "", "this replica's name among the shards' holders (default: $POD_NAME)")
	f.BoolVar(&o.kubeletClient, "kubelet-client-approver", false, "approve kubelet client certificates (signer kubernetes.io/kube-apiserver-client-kubelet) as kube-controller-manager's csrapproving controller does; see docs/kubelet-client.md before switching it on")
	f.BoolVar(&o.webhook, "webhook", true, "serve the TalosCredentialRequest admission webhook and issue credentials (it needs a serving certificate: --webhook-cert-dir or --webhook-generate-certs); without it no credential is issued")
	f.StringSliceVar(&o.localClusters, "local-clusters", nil, "the TalosClusters (namespace/name, comma-separated or repeated) whose machines are nodes of the API server the manager runs against, and which alone judge its kubelet certificate requests; a cluster without spec.kubeconfigRef that is not named here judges nothing (condition KubeletServingCertificates, reason LocalClusterNotNamed)")
	f.BoolVar(&o.allowInsecureRemote, "remote-kubeconfig-allow-insecure", false, "let a TalosCluster's kubeconfigRef set insecure-skip-tls-verify (its server's certificate then is not verified, and anyone on the path can read its credential); without it such a kubeconfig is refused (condition KubeletServingCertificates, reason KubeconfigRefused, code InsecureSkipTLSVerify)")
	f.StringSliceVar(&o.deniedRemote, "remote-kubeconfig-denied-networks", []string{netguard.DefaultKeyword}, "networks the manager never connects to for a TalosCluster's kubeconfigRef (CIDRs, comma-separated or repeated; \"default\" stands for loopback, link-local, the clouds' instance metadata addresses, unspecified and multicast), checked on the address of every connection after DNS, before anything is sent: add this cluster's pod and service networks (default,10.244.0.0/16,10.96.0.0/12) to keep tenants from reaching or probing in-cluster services; an empty value denies none. Such a server is refused (condition KubeletServingCertificates, reason RemoteServerAddressRefused)")
	f.StringVar(&o.admissionKeySecret, "admission-key-secret", credential.DefaultKeySecretName, "Secret in the manager's namespace ($POD_NAMESPACE), created empty, that the manager fills with the key of the admission records the webhook writes and the issuer verifies: without a record made with it no credential is issued")
	f.BoolVar(&o.adminKubeconfigs, "admin-kubeconfigs", true, "issue admin kubeconfigs (each person's group bound to cluster-admin by a ClusterRoleBinding of their own); false revokes them for good: none is issued, and the manager deletes every person's binding (label ichor.dev/admin-binding) at start and whenever one appears")
	f.StringSliceVar(&o.policyBindings, "admission-policy-bindings", nil, "ValidatingAdmissionPolicyBindings that hold the manager's own rights to their shape, each named as the policy it binds (the chart names its own): until each exists, binds that policy with validationActions Deny, and the policy exists, the manager is not ready, so its webhook admits no new credential request; none named, none waited for")
	f.StringSliceVar(&o.componentNamespaces, "component-namespaces", nil, "namespaces whose ServiceAccounts may be issued Ichor's own purposes (node-reader, support-bundle, etcd-snapshot, packet-capture: never a person's); by default the manager's own ($POD_NAMESPACE). A ServiceAccount elsewhere is refused (PurposeNotForPeople) even if RBAC grants it the verb issue: whoever administers a namespace may make one, bind it and take its token")
	f.BoolVar(&o.requirePins, "require-admission-pins", true, "issue a credential only if its admission record pins the lifetime and the credential admitted, each under its MAC; false also accepts a record without them, as a webhook from before them wrote, for the time of a rolling upgrade from such a release (whoever may edit Events can take the pins away from a record)")
	f.BoolVar(&o.requireSecretsClaim, "require-secrets-claim", true, "use a Secret a TalosCluster's secretsRef or kubeconfigRef names only if its annotation "+ichorv1alpha1.SecretsClaimAnnotation+" names the cluster (or is *); false also uses a Secret without the annotation, as releases before it did, for the time of an upgrade (whoever may write a TalosCluster can then point it at another cluster's CAs or API server)")
	f.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the admission webhook server (HTTPS)")
	f.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "directory of the webhook server's tls.crt and tls.key (default: controller-runtime's, under the temporary directory)")
	f.StringVar(&o.webhookClientCA, "webhook-client-ca", "", "PEM file of the CA of the client certificate the API server presents to webhooks (its admission configuration's kubeConfigFile): with it the webhook answers only requests made with a certificate of that CA naming one of --webhook-client-names, so that no pod that reaches the port can post a review; read at start")
	f.StringVar(&o.webhookClientCAPin, "webhook-client-ca-sha256", "", "the SHA-256 (hex) the --webhook-client-ca file must have: the manager refuses to start on another (the Helm chart pins the CA it renders)")
	f.StringSliceVar(&o.webhookClientNames, "webhook-client-names", nil, "the common names the API server's webhook client certificate may carry (comma-separated or repeated); required with --webhook-client-ca. Give the API server a CA of its own, never the cluster's client CA: whoever gets a kubernetes.io/kube-apiserver-client CSR approved gets a certificate of that CA with any common name")
	f.BoolVar(&o.webhookGenerateCerts, "webhook-generate-certs", false, "make and renew the webhook's CA and serving certificate, kept in --webhook-cert-secret, and set the CA bundle of --webhook-configuration (leave off when cert-manager provides them)")
	f.StringVar(&o.webhookCertSecret, "webhook-cert-secret", webhookcerts.DefaultSecretName, "Secret in the manager's namespace ($POD_NAMESPACE) that keeps the webhook's CA and serving certificate")
	f.StringVar(&o.webhookService, "webhook-service", webhookcerts.DefaultServiceName, "the webhook's Service in the manager's namespace, which the serving certificate names")
	f.StringVar(&o.webhookConfiguration, "webhook-configuration", webhookcerts.DefaultWebhookConfigurationName, "the ValidatingWebhookConfiguration whose CA bundle the manager sets")
	f.StringVar(&o.webhookClusterDomain, "webhook-cluster-domain", webhookcerts.DefaultClusterDomain, "the cluster's DNS domain, for the serving certificate's NAME.NAMESPACE.svc.DOMAIN")
	f.DurationVar(&o.resync, "resync-interval", kubeletserving.DefaultResyncInterval, "how often every cluster is looked at again in full")
	f.DurationVar(&o.talosTimeout, "talos-timeout", kubeletserving.DefaultTalosTimeout, "bound on reading one node's identity from its Talos API")
	f.BoolVar(&o.talosWatch, "talos-watch", true, "keep a live watch of the identity of each machine expected to ask for a serving certificate soon (no unexpired certificate recorded, its TalosMachine made within the hour: a node joining), so its decision reads no node; false reads every node at decision time")
	f.StringSliceVar(&o.deniedNodes, "node-denied-networks", []string{netguard.DefaultKeyword}, "networks the manager never connects to for a node, whose addresses whoever writes a TalosMachine (its spec.endpoint) or runs the node (its kubelet's address, for the serving-certificate audit) names (CIDRs, comma-separated or repeated; \"default\" as for --remote-kubeconfig-denied-networks), checked on the address of every connection after DNS, before anything is sent; an empty value denies none. Such a machine's requests stay pending (NodeUnreadable, naming the network)")
	f.IntVar(&o.talosWatchMax, "talos-watch-max", kubeletserving.DefaultWatchMax, "most identity watches held at once, shared fairly among the clusters (about 180 KiB each); the newest machines of a cluster first, the others read at decision time")
	f.DurationVar(&o.talosWatchMaxAge, "talos-watch-max-age", talosnode.DefaultWatchMaxAge, "freshness bound of an identity watch: it is believed for at most this long after it read the node, then made anew (capped at the renewal of the os:reader certificate)")
	f.IntVar(&o.tenantMaxCSRs, "tenant-max-csrs", kubeletserving.DefaultTenantMaxCSRs, "most CSRs the manager keeps of the API servers that a tenant's TalosClusters (those of one namespace) name by kubeconfigRef, together; a cluster whose server would bring more is not watched, and says so")
	f.IntVar(&o.tenantMaxCSRMiB, "tenant-max-csr-mib", kubeletserving.DefaultTenantMaxCSRBytes>>20, "most MiB of CSRs the manager keeps of the API servers that a tenant's TalosClusters (those of one namespace) name by kubeconfigRef, together; a cluster whose server would bring more is not watched, and says so")
	f.DurationVar(&o.readerLifetime, "talos-reader-lifetime", 0, "lifetime of the manager's own os:reader Talos certificate (default: the policy's default for purpose node-reader; above the policy's cap is refused)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to run against (default: in-cluster, then $KUBECONFIG)")
	o.audit.add(f)
	f.Float32Var(&o.qps, "kube-api-qps", 300, "requests per second to the API server: an approval costs about three (the approval, its Event, the machine's record), so this sustains about 100 approvals a second; the API server's priority and fairness protects itself beyond (see docs/performance.md)")
	f.IntVar(&o.burst, "kube-api-burst", 600, "burst of requests to the API server, for a mass reboot")
	// controller-runtime's own logging flags (--zap-log-level, --zap-encoder,
	// --zap-devel, --zap-stacktrace-level, --zap-time-encoding), as every
	// kubebuilder manager takes them; the defaults stay JSON at info.
	zapFlags := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.log.BindFlags(zapFlags)
	f.AddGoFlagSet(zapFlags)
	return cmd
}

// sha256Hex is a SHA-256 written as sha256sum writes it.
var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// maxBundleKeyBytes bounds a --bundle-key file: a PEM public key (RSA of
// 8,192 bits is under 2 KiB) or a certificate chain.
const maxBundleKeyBytes = 64 << 10

// runManager turns the flags into the manager's options and runs it.
func runManager(ctx context.Context, s streams, o managerOptions) error {
	// The flags first: a wrong one is reported as such wherever it runs.
	engineOpts, err := o.engineOptions(s)
	if err != nil {
		return err
	}
	if o.tenantMaxCSRs < 1 {
		return usage.Errorf("--tenant-max-csrs %d must be at least 1", o.tenantMaxCSRs)
	}
	if o.tenantMaxCSRMiB < 1 || int64(o.tenantMaxCSRMiB) > math.MaxInt64>>20 {
		return usage.Errorf("--tenant-max-csr-mib %d must be at least 1 and at most %d", o.tenantMaxCSRMiB, int64(math.MaxInt64>>20))
	}
	if err := o.audit.validate(); err != nil {
		return err
	}
	deniedRemote, err := netguard.Parse(o.deniedRemote)
	if err != nil {
		return usage.Errorf("--remote-kubeconfig-denied-networks: %v", err)
	}
	deniedNodes, err := netguard.Parse(o.deniedNodes)
	if err != nil {
		return usage.Errorf("--node-denied-networks: %v", err)
	}
	if o.resync <= 0 {
		return usage.Errorf("--resync-interval %s: must be positive", o.resync)
	}
	// controller-runtime serves no webhook on a negative port, and says it
	// is ready (review 168): the issuer would wait for requests nothing
	// admits.
	if o.webhook && (o.webhookPort < 1 || o.webhookPort > 65535) {
		return usage.Errorf("--webhook-port %d: must be a port, 1 to 65535 (--webhook=false serves none)", o.webhookPort)
	}
	clientAuth, err := o.webhookClientAuth()
	if err != nil {
		return err
	}
	cfg, err := kube.RESTConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst
	localClusters, err := cluster.ParseLocal(o.localClusters)
	if err != nil {
		return usage.Errorf("--local-clusters: %v", err)
	}
	if o.readerLifetime < 0 {
		return usage.Errorf("--talos-reader-lifetime %s is negative", o.readerLifetime)
	}
	mo := manager.Options{
		Config:                        cfg,
		Log:                           s.err,
		LogOptions:                    &o.log,
		Engine:                        engineOpts,
		BundleName:                    o.bundle,
		ShadowBundle:                  o.shadowBundle,
		DecisionLogFlushTimeout:       o.logFlushTimeout,
		MetricsAddr:                   o.metricsAddr,
		ProbeAddr:                     o.probeAddr,
		LeaderElect:                   o.leaderElect,
		LeaseDuration:                 o.leaseDuration,
		RenewDeadline:                 o.renewDeadline,
		RetryPeriod:                   o.retryPeriod,
		Namespace:                     os.Getenv("POD_NAMESPACE"),
		PodName:                       os.Getenv("POD_NAME"),
		Webhook:                       o.webhook,
		WebhookPort:                   o.webhookPort,
		WebhookCertDir:                o.webhookCertDir,
		WebhookClientAuth:             clientAuth,
		AdmissionKeySecret:            o.admissionKeySecret,
		AdminKubeconfigs:              o.adminKubeconfigs,
		ComponentNamespaces:           o.componentNamespaces,
		AdmissionPolicyBindings:       o.policyBindings,
		AcceptUnpinnedAdmissions:      !o.requirePins,
		AllowUnclaimedSecrets:         !o.requireSecretsClaim,
		KubeletClientApprover:         o.kubeletClient,
		LocalClusters:                 localClusters,
		RemoteKubeconfigAllowInsecure: o.allowInsecureRemote,
		RemoteKubeconfigDenied:        deniedRemote,
		ResyncInterval:                o.resync,
		TalosTimeout:                  o.talosTimeout,
		TalosWatch:                    o.talosWatch,
		TalosWatchMaxAge:              o.talosWatchMaxAge,
		TalosWatchMax:                 o.talosWatchMax,
		NodeDenied:                    deniedNodes,
		TenantMaxCSRs:                 o.tenantMaxCSRs,
		TenantMaxCSRBytes:             int64(o.tenantMaxCSRMiB) << 20,
		ReaderLifetime:                o.readerLifetime,
		Sharding:                      o.sharding,
	}
	o.audit.apply(&mo)
	if o.webhookGenerateCerts {
		mo.WebhookCerts = &webhookcerts.Options{
			ServiceName:              o.webhookService,
			ClusterDomain:            o.webhookClusterDomain,
			SecretName:               o.webhookCertSecret,
			WebhookConfigurationName: o.webhookConfiguration,
		}
	}
	return manager.Run(ctx, mo)
}

// webhookClientAuth reads --webhook-client-ca and its names; nil without
// them.
func (o managerOptions) webhookClientAuth() (*apiserverauth.Auth, error) {
	if o.webhookClientCA == "" {
		if len(o.webhookClientNames) > 0 {
			return nil, usage.Errorf("--webhook-client-names without --webhook-client-ca: the names are checked only on certificates of that CA")
		}
		if o.webhookClientCAPin != "" {
			return nil, usage.Errorf("--webhook-client-ca-sha256 without --webhook-client-ca: the pin is of that file")
		}
		return nil, nil
	}
	if o.webhookClientCAPin != "" && !sha256Hex.MatchString(o.webhookClientCAPin) {
		return nil, usage.Errorf("--webhook-client-ca-sha256 %q: give the 64 hex digits of the --webhook-client-ca file's SHA-256 (sha256sum)", o.webhookClientCAPin)
	}
	auth, err := apiserverauth.Load(o.webhookClientCA, o.webhookClientNames, o.webhookClientCAPin)
	if err != nil {
		return nil, usage.Errorf("--webhook-client-ca: %v", err)
	}
	return auth, nil
}

// maxDecisionLogFileMiB is the largest --decision-log-file-max-mib.
const maxDecisionLogFileMiB = 1 << 20

// minBundlePoll is the shortest --bundle-poll-interval: the fault tests poll
// every 500ms; a URL source waits a second between fetches whatever it is.
const minBundlePoll = 100 * time.Millisecond

// engineOptions turns the bundle and decision-log flags into engine options.
func (o managerOptions) engineOptions(s streams) (engine.Options, error) {
	opts := engine.Options{
		DecisionLog: s.out, Log: s.err, PollInterval: o.bundlePoll,
		DecisionLogFile: o.logFile, DecisionLogFileMaxMiB: o.logFileMaxMiB, DecisionLogFileMaxBackups: o.logFileMaxBackups,
		DecisionLogURL: o.logURL, DecisionLogTokenFile: o.logTokenFile, DecisionLogAllowInsecureHTTP: o.logInsecureHTTP, DecisionLogBufferEvents: o.logBuffer,
		AllowInsecureHTTP: o.bundleInsecureHTTP, Limits: o.bundleLimits, RegistryCredentials: o.bundleRegistryCreds,
	}
	if o.bundlePoll < minBundlePoll {
		// A ticker refuses a non-positive interval by panicking after the
		// start, and a nanosecond would read the bundle without pause.
		return opts, usage.Errorf("--bundle-poll-interval %s: must be at least %s", o.bundlePoll, minBundlePoll)
	}
	if o.logURL != "" {
		// A URL without a scheme or host would start, and fail every
		// upload until the buffer drops what it holds. Neither message
		// quotes a password the URL may hold.
		u, err := url.Parse(o.logURL)
		if err != nil {
			return opts, usage.Errorf("--decision-log-url does not parse as a URL")
		}
		if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return opts, usage.Errorf("--decision-log-url %q: give an https:// URL with a host (http:// with --decision-log-allow-insecure-http)", u.Redacted())
		}
		if u.Scheme == "http" && !o.logInsecureHTTP {
			return opts, usage.Errorf("--decision-log-url %q is plain http: anyone on the path could read every decision (and a password in the URL) and drop entries; use https://, or allow it explicitly (--decision-log-allow-insecure-http)", u.Redacted())
		}
		if _, hasPassword := u.User.Password(); hasPassword && o.logTokenFile != "" {
			return opts, usage.Errorf("--decision-log-url %q holds a password and --decision-log-token-file is given: give the service's credential one way", u.Redacted())
		}
	}
	if o.logTokenFile != "" && o.logURL == "" {
		return opts, usage.Errorf("--decision-log-token-file is the credential of the --decision-log-url service: give the URL too")
	}
	if o.logFlushTimeout <= 0 {
		// Every stop would drop what the upload buffer holds.
		return opts, usage.Errorf("--decision-log-flush-timeout %s: must be positive", o.logFlushTimeout)
	}
	if o.logFileMaxMiB <= 0 || o.logFileMaxBackups <= 0 {
		return opts, usage.Errorf("--decision-log-file-max-mib and --decision-log-file-max-backups must be positive")
	}
	if o.logFileMaxMiB > maxDecisionLogFileMiB {
		// The rotating writer counts the size in bytes: beyond, the bound
		// overflowed, and every write, so every decision, failed
		// (review 202 F6).
		return opts, usage.Errorf("--decision-log-file-max-mib %d: at most %d (1 TiB)", o.logFileMaxMiB, maxDecisionLogFileMiB)
	}
	if o.logBuffer <= 0 {
		// Taken before for the default, without a word (review 202 F6).
		return opts, usage.Errorf("--decision-log-buffer-events %d: must be positive", o.logBuffer)
	}
	if o.bundleLimits.CompressedBytes <= 0 || o.bundleLimits.UncompressedBytes <= 0 || o.bundleLimits.Files <= 0 {
		return opts, usage.Errorf("--bundle-max-compressed-bytes, --bundle-max-uncompressed-bytes and --bundle-max-files must be positive")
	}
	if o.bundleKeySHA256 != "" && (len(o.bundleKeys) == 0 || !sha256Hex.MatchString(o.bundleKeySHA256)) {
		return opts, usage.Errorf("--bundle-key-sha256 %q: give the 64 hex digits of the --bundle-key file's SHA-256 (sha256sum), with --bundle-key", o.bundleKeySHA256)
	}
	for _, path := range o.bundleKeys {
		// A public key is a few kilobytes: a FIFO is not waited on, nor
		// /dev/zero read until memory runs out (review 168).
		key, err := smallfile.Read(path, maxBundleKeyBytes)
		if err != nil {
			return opts, usage.Errorf("--bundle-key: %w", err)
		}
		// The file's writers are not the key's (review 166: a ConfigMap
		// in the release namespace); the pin is the Deployment's.
		if got := fmt.Sprintf("%x", sha256.Sum256(key)); o.bundleKeySHA256 != "" && got != strings.ToLower(o.bundleKeySHA256) {
			return opts, fmt.Errorf("--bundle-key %s has SHA-256 %s, not the %s --bundle-key-sha256 pins (the chart's manager.bundle.verification.sha256): refusing to start with it. If you rotated the key, pin the new one's digest; if not, the key file was replaced", path, got, strings.ToLower(o.bundleKeySHA256))
		}
		opts.VerificationKeys = append(opts.VerificationKeys, engine.VerificationKey{ID: o.bundleKeyID, PEM: string(key), Algorithm: o.bundleKeyAlg})
	}
	if len(opts.VerificationKeys) > 1 {
		return opts, usage.Errorf("--bundle-key: one key per --bundle-key-id; give one key")
	}
	switch info, err := os.Stat(o.bundle); {
	case o.bundle == "":
	case err == nil && info.IsDir():
		if len(opts.VerificationKeys) > 0 {
			return opts, usage.Errorf("--bundle %s is a directory, which cannot be signed; give a signed tarball", o.bundle)
		}
		b, err := bundles.FromDir(o.bundle)
		if err != nil {
			return opts, err
		}
		opts.Bundle = b
	default:
		// A malformed OCI reference is the operator's to fix, before any
		// engine starts.
		if bundles.IsOCI(o.bundle) {
			if _, err := bundles.ParseOCIRef(o.bundle); err != nil {
				return opts, usage.Errorf("--bundle: %w", err)
			}
		}
		opts.Source = o.bundle
	}
	return opts, nil
}
