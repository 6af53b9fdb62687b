package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/talosnode"
)

type managerOptions struct {
	metricsAddr    string
	probeAddr      string
	leaderElect    bool
	bundle         string
	resync         time.Duration
	talosTimeout   time.Duration
	readerLifetime time.Duration
	kubeconfig     string
}

func newManagerCommand(s streams) *cobra.Command {
	var o managerOptions
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the controllers: the kubelet serving certificate approver",
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
	f.StringVar(&o.bundle, "bundle", "", "a policy directory or bundle tarball to serve (default: the embedded bundle)")
	f.DurationVar(&o.resync, "resync-interval", kubeletserving.DefaultResyncInterval, "how often every cluster is looked at again in full")
	f.DurationVar(&o.talosTimeout, "talos-timeout", kubeletserving.DefaultTalosTimeout, "bound on reading one node's identity from its Talos API")
	f.DurationVar(&o.readerLifetime, "talos-reader-lifetime", talosnode.DefaultCertificateLifetime, "lifetime of the manager's own os:reader Talos certificate (at most 15m)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to run against (default: in-cluster, then $KUBECONFIG)")
	return cmd
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
	if o.readerLifetime <= 0 || o.readerLifetime > talosnode.MaxCertificateLifetime {
		return usagef("--talos-reader-lifetime %s is outside (0, %s]", o.readerLifetime, talosnode.MaxCertificateLifetime)
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(s.err), zap.JSONEncoder()))
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	scheme, err := Scheme()
	if err != nil {
		return fmt.Errorf("scheme: %w", err)
	}

	var opts engine.Options
	opts.DecisionLog = s.out
	opts.Log = s.err
	if o.bundle != "" {
		if opts.Bundle, err = bundles.Load(o.bundle); err != nil {
			return err
		}
	}
	eng, err := engine.New(ctx, opts)
	if err != nil {
		return err
	}
	defer eng.Stop(ctx)

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		LeaderElection:         o.leaderElect,
		LeaderElectionID:       "ichor-policy.ichor.dev",
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
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
		NodeReaders:    &kubeletserving.NodeReaders{Reader: mgr.GetAPIReader(), Lifetime: o.readerLifetime, Timeout: o.talosTimeout},
		ResyncInterval: o.resync,
	}
	if err := serving.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("set up the kubelet serving approver: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.WithName("manager").Info("starting", "bundle", o.bundle)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}
