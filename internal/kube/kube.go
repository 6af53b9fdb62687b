// Package kube is how Ichor's programs reach an API server: the client
// configuration, read the way kubectl and controllers read it, and the scheme
// of the types they use, Kubernetes' and Ichor's.
package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/internal/usage"

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

// NewConfigFlags are kubectl's client flags (--kubeconfig, --context,
// -n/--namespace, --as, --as-group, --request-timeout, ...), read the way
// kubectl reads them, for the commands that speak to an API server as the
// person running them. Add them with AddFlags; read them with Client.
func NewConfigFlags() *genericclioptions.ConfigFlags {
	f := genericclioptions.NewConfigFlags(true)
	// Only discovery reads the cache directory, and no command discovers.
	f.CacheDir = nil
	return f
}

// Client is a client of the API server the flags name, the namespace to use
// (-n, else the kubeconfig context's, else "default", as kubectl) and the
// client configuration.
func Client(flags genericclioptions.RESTClientGetter) (client.Client, string, *rest.Config, error) {
	return ClientWithin(flags, 0)
}

// ClientWithin is Client whose every request is cut off after timeout when
// the kubeconfig and --request-timeout set no bound of their own (kubectl's
// default: none). The client's discovery of the API, on its first request
// of a kind, takes no context: only this bounds it against a server that
// accepts the connection and never answers.
func ClientWithin(flags genericclioptions.RESTClientGetter, timeout time.Duration) (client.Client, string, *rest.Config, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, "", nil, ConfigError(err)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = timeout
	}
	namespace, _, err := flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", nil, fmt.Errorf("kubeconfig namespace: %w", err)
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, "", nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", nil, fmt.Errorf("client: %w", err)
	}
	return c, namespace, cfg, nil
}

// KubeconfigFiles are the files the flags' kubeconfig is read from:
// --kubeconfig, else $KUBECONFIG's files, else ~/.kube/config.
func KubeconfigFiles(flags genericclioptions.RESTClientGetter) []string {
	return flags.ToRawKubeConfigLoader().ConfigAccess().GetLoadingPrecedence()
}

// ConfigError is an error of loading the client configuration, said as
// such: a usage error (exit 2) when the flags name what is not there or not
// valid (a --kubeconfig file that does not exist, a --context it does not
// hold, a kubeconfig that fails clientcmd's validation, a --request-timeout
// that is no duration), as the CLI's exit statuses say; any other stays an
// error (exit 1).
func ConfigError(err error) error {
	err = fmt.Errorf("kubeconfig: %w", err)
	if flagError(err) {
		return usage.Wrap(err)
	}
	return err
}

// flagError reports whether a configuration loading error comes from what
// the flags named.
func flagError(err error) bool {
	// clientcmd's own predicates look at the error itself, not through
	// wrapping.
	for e := err; e != nil; e = errors.Unwrap(e) {
		if clientcmd.IsEmptyConfig(e) {
			// No kubeconfig at all: nothing the flags named.
			return false
		}
		if clientcmd.IsContextNotFound(e) || clientcmd.IsConfigurationInvalid(e) {
			return true
		}
	}
	// clientcmd's messages, errors of their own: a --request-timeout that
	// is no duration; a --context, --cluster or --user the kubeconfig does
	// not hold.
	return errors.Is(err, fs.ErrNotExist) || strings.Contains(err.Error(), "Invalid timeout value") || namedNotHeld.MatchString(err.Error())
}

// namedNotHeld is clientcmd's message for a context, cluster or user the
// flags name and the kubeconfig does not hold.
var namedNotHeld = regexp.MustCompile(`(context|cluster|auth info) ".*" does not exist$`)
