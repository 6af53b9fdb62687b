// Package kube is how Ichor's programs reach an API server: the client
// configuration, read the way kubectl and controllers read it, and the scheme
// of the types they use, Kubernetes' and Ichor's.
package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// Scheme is the Kubernetes types and Ichor's.
func Scheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	if err := ichorv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	return scheme, nil
}

// RESTConfig loads the client configuration the usual way: an explicit
// kubeconfig file, else in-cluster, else $KUBECONFIG and ~/.kube/config.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	} else if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}
