package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ichor-dev/ichor-policy/cli"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/talosnode"
)

// ControllerOptions configure a controller process of the benchmark.
type ControllerOptions struct {
	Kubeconfig string
	// QPS and Burst of the client configuration; QPS 0 is client-go's
	// default (5 per second, burst 10), QPS -1 turns client-side throttling
	// off.
	QPS   float32
	Burst int
	// Workers is the rubber stamp's concurrent reconciles.
	Workers int
	// DecisionLog and Log are the manager's standard output and error.
	DecisionLog, Log io.Writer
}

func (o ControllerOptions) restConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	return cfg, nil
}

// RunManager runs the kubelet serving approver wired as `ichor manager`
// wires it (cli/manager.go: the embedded bundle, the decision log on
// DecisionLog, the engine's metrics, the reader lifetime from the policy, the
// default resync and Talos timeout), with two differences: the client
// configuration's QPS and Burst are the options' (the benchmark turns
// client-side throttling off), where `ichor manager` sets its own; and it
// runs that approver alone, without the kubelet-client approver, the
// credential webhook and the issuer, which a kubelet-serving load does not
// exercise. It shows what the approver and the API server can do whatever
// the client's limits; the manager as shipped is run through cli.Run.
func RunManager(ctx context.Context, o ControllerOptions) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(o.Log), zap.JSONEncoder()))
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	scheme, err := cli.Scheme()
	if err != nil {
		return err
	}
	metrics, err := engine.NewMetrics(ctrlmetrics.Registry)
	if err != nil {
		return err
	}
	eng, err := engine.New(ctx, engine.Options{DecisionLog: o.DecisionLog, Log: o.Log, Metrics: metrics})
	if err != nil {
		return err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	lifetime, err := readerLifetime(ctx, eng)
	if err != nil {
		return err
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	serving := &kubeletserving.Reconciler{
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		Clientset:      clientset,
		Engine:         eng,
		Recorder:       mgr.GetEventRecorder("ichor-kubelet-serving"),
		NodeReaders:    &kubeletserving.NodeReaders{Reader: mgr.GetAPIReader(), Lifetime: lifetime, Timeout: kubeletserving.DefaultTalosTimeout},
		ResyncInterval: kubeletserving.DefaultResyncInterval,
	}
	if err := serving.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// readerLifetime is the policy's default lifetime of the manager's Talos
// identity, asked for as cli/manager.go asks.
func readerLifetime(ctx context.Context, eng *engine.Engine) (time.Duration, error) {
	d, err := eng.Issuance(ctx, engine.CredentialIssuanceInput{
		Purpose:   "node-reader",
		PublicKey: engine.PublicKeyFacts{Parsed: true, Algorithm: "Ed25519", Bits: 256},
	})
	if err != nil {
		return 0, err
	}
	if !d.Allowed || d.Certificate == nil || d.Certificate.TalosRole != talosnode.ReaderRole {
		return 0, fmt.Errorf("the policy refuses the manager's Talos identity: %s", engine.Messages(d.Reasons))
	}
	return time.Duration(d.LifetimeSeconds * float64(time.Second)), nil
}

// RunRubberStamp runs the rubber stamp until ctx ends.
func RunRubberStamp(ctx context.Context, o ControllerOptions) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(o.Log), zap.JSONEncoder()))
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	scheme, err := cli.Scheme()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	rs := &RubberStamp{Client: mgr.GetClient(), Clientset: clientset}
	if err := rs.SetupWithManager(mgr, max(o.Workers, 1)); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
