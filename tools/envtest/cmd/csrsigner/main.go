// Command csrsigner runs kube-controller-manager's CSR signing controller
// (its "csrsigning" controller) and nothing else: the one part of
// kube-controller-manager the integration tests need (test/harness). It is
// the same code, from the pinned k8s.io/kubernetes module, set up as
// kube-controller-manager sets it up with --controllers=csrsigning and one CA
// (--cluster-signing-cert-file, --cluster-signing-key-file): the
// kubernetes.io/kubelet-serving, kube-apiserver-client-kubelet,
// kube-apiserver-client and legacy-unknown signers, each with five workers,
// certificates valid for --cluster-signing-duration (kube-controller-manager's
// default: a year) or the shorter spec.expirationSeconds (10 minutes at
// least). A binary of this controller alone compiles some 360 fewer packages
// than kube-controller-manager (every other controller, the cloud providers,
// the volume plugins), minutes of CPU in a cold build.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/certificates/signer"
)

// kube-controller-manager's defaults (pkg/controller/apis/config/v1alpha1,
// k8s.io/component-base/config/v1alpha1, signer/config/v1alpha1).
const (
	clientQPS       = 20
	clientBurst     = 30
	contentType     = "application/vnd.kubernetes.protobuf"
	minResyncPeriod = 12 * time.Hour
	defaultDuration = 365 * 24 * time.Hour
	workers         = 5
)

func main() {
	if err := run(); err != nil {
		klog.ErrorS(err, "csrsigner failed")
		klog.Flush()
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig of the identity the signer runs as (required)")
		certFile    = flag.String("cluster-signing-cert-file", "", "PEM CA certificate the signers sign with (required)")
		keyFile     = flag.String("cluster-signing-key-file", "", "PEM CA private key the signers sign with (required)")
		duration    = flag.Duration("cluster-signing-duration", defaultDuration, "the longest validity of a signed certificate")
		showVersion = flag.Bool("version", false, "print the Kubernetes version this signer is built from and exit")
	)

	klog.InitFlags(nil)
	flag.Parse()

	if *showVersion {
		// kube-controller-manager's --version output, which tools/envtest/build.sh checks.
		fmt.Printf("Kubernetes %s\n", version.Get().GitVersion)

		return nil
	}

	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}

	if *kubeconfig == "" || *certFile == "" || *keyFile == "" {
		return errors.New("--kubeconfig, --cluster-signing-cert-file and --cluster-signing-key-file are required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}

	config.QPS, config.Burst, config.ContentType = clientQPS, clientBurst, contentType

	klog.InfoS("Starting the CSR signing controller alone", "version", version.Get().GitVersion, "cluster_signing_duration", *duration)

	return runSigners(ctx, config, *certFile, *keyFile, *duration)
}

// runSigners is kube-controller-manager's newCertificateSigningRequestSigningController
// with one CA for every signer, on a shared informer factory set up as
// kube-controller-manager's (managed fields trimmed, resync between one and
// two minimum resync periods).
func runSigners(ctx context.Context, config *rest.Config, certFile, keyFile string, ttl time.Duration) error {
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(rest.CopyConfig(config), "certificate-controller"))
	if err != nil {
		return fmt.Errorf("certificate-controller client: %w", err)
	}

	informerClient, err := kubernetes.NewForConfig(rest.AddUserAgent(rest.CopyConfig(config), "shared-informers"))
	if err != nil {
		return fmt.Errorf("shared-informers client: %w", err)
	}

	resync := time.Duration(float64(minResyncPeriod) * (1 + rand.Float64())) //nolint:gosec // jitter, as kube-controller-manager's
	factory := informers.NewSharedInformerFactoryWithOptions(informerClient, resync, informers.WithTransform(trimManagedFields))
	csrInformer := factory.Certificates().V1().CertificateSigningRequests()

	constructors := []func(context.Context, kubernetes.Interface, certificatesinformers.CertificateSigningRequestInformer, string, string, time.Duration) (*signer.CSRSigningController, error){
		signer.NewKubeletServingCSRSigningController,
		signer.NewKubeletClientCSRSigningController,
		signer.NewKubeAPIServerClientCSRSigningController,
		signer.NewLegacyUnknownCSRSigningController,
	}

	controllers := make([]*signer.CSRSigningController, 0, len(constructors))

	for _, newController := range constructors {
		c, err := newController(ctx, client, csrInformer, certFile, keyFile, ttl)
		if err != nil {
			return fmt.Errorf("CSR signing controller: %w", err)
		}

		controllers = append(controllers, c)
	}

	factory.Start(ctx.Done())
	defer factory.Shutdown()

	var wg sync.WaitGroup
	for _, c := range controllers {
		wg.Go(func() { c.Run(ctx, workers) })
	}

	wg.Wait()

	return nil
}

// trimManagedFields drops the objects' managed fields from the informer's
// cache, as kube-controller-manager's informers do.
func trimManagedFields(obj any) (any, error) {
	if accessor, err := meta.Accessor(obj); err == nil && accessor.GetManagedFields() != nil {
		accessor.SetManagedFields(nil)
	}

	return obj, nil
}
