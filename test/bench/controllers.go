package bench

import (
	"context"
	"fmt"
	"io"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ichor-dev/ichor-policy/internal/kube"
)

// ControllerOptions configure the rubber stamp's process.
type ControllerOptions struct {
	Kubeconfig string
	// Workers is the rubber stamp's concurrent reconciles.
	Workers int
	// Log is where its logs go.
	Log io.Writer
}

func (o ControllerOptions) restConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	// No client-side throttling: the rubber stamp is the API server's
	// ceiling.
	cfg.QPS = -1
	return cfg, nil
}

// RunRubberStamp runs the rubber stamp until ctx ends.
func RunRubberStamp(ctx context.Context, o ControllerOptions) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(o.Log), zap.JSONEncoder()))
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	scheme, err := kube.Scheme()
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
