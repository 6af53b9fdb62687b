package kube_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// kubeconfig writes a kubeconfig with two contexts, each with its namespace.
func kubeconfig(t *testing.T) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["a"] = &clientcmdapi.Cluster{Server: "https://a.example:6443"}
	kc.Clusters["b"] = &clientcmdapi.Cluster{Server: "https://b.example:6443"}
	kc.AuthInfos["me"] = &clientcmdapi.AuthInfo{Token: "t"}
	kc.Contexts["a"] = &clientcmdapi.Context{Cluster: "a", AuthInfo: "me", Namespace: "team-a"}
	kc.Contexts["b"] = &clientcmdapi.Context{Cluster: "b", AuthInfo: "me", Namespace: "team-b"}
	kc.CurrentContext = "a"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// TestConfigFlagsReachTheClientConfig: kubectl's flags, parsed as a command
// parses them, are what the client is configured with.
func TestConfigFlagsReachTheClientConfig(t *testing.T) {
	path := kubeconfig(t)
	for _, tc := range []struct {
		name      string
		args      []string
		host      string
		namespace string
		as        string
		groups    []string
		timeout   time.Duration
	}{
		{name: "the current context and its namespace", args: nil, host: "https://a.example:6443", namespace: "team-a"},
		{name: "another context, its namespace", args: []string{"--context", "b"}, host: "https://b.example:6443", namespace: "team-b"},
		{name: "-n over the context's", args: []string{"--context", "b", "-n", "other"}, host: "https://b.example:6443", namespace: "other"},
		{
			name: "impersonation and a request timeout",
			args: []string{"--as", "ichor:vera", "--as-group", "ichor:viewers", "--as-group", "system:authenticated", "--request-timeout", "7s"},
			host: "https://a.example:6443", namespace: "team-a",
			as: "ichor:vera", groups: []string{"ichor:viewers", "system:authenticated"}, timeout: 7 * time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := kube.NewConfigFlags()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			flags.AddFlags(fs)
			require.NoError(t, fs.Parse(append([]string{"--kubeconfig", path}, tc.args...)))

			_, namespace, cfg, err := kube.Client(flags)
			require.NoError(t, err)
			assert.Equal(t, tc.host, cfg.Host)
			assert.Equal(t, tc.namespace, namespace)
			assert.Equal(t, tc.as, cfg.Impersonate.UserName)
			assert.Equal(t, tc.groups, cfg.Impersonate.Groups)
			assert.Equal(t, tc.timeout, cfg.Timeout)
			assert.Equal(t, []string{path}, kube.KubeconfigFiles(flags))
		})
	}
}

// TestConfigFlagsKubeconfigFromTheEnvironment: without --kubeconfig, the
// files of $KUBECONFIG, as kubectl reads them.
func TestConfigFlagsKubeconfigFromTheEnvironment(t *testing.T) {
	path := kubeconfig(t)
	t.Setenv("KUBECONFIG", path)
	flags := kube.NewConfigFlags()
	_, namespace, cfg, err := kube.Client(flags)
	require.NoError(t, err)
	assert.Equal(t, "https://a.example:6443", cfg.Host)
	assert.Equal(t, "team-a", namespace)
	assert.Equal(t, []string{path}, kube.KubeconfigFiles(flags))
}

// TestConfigFlagsLeaveOutTheCacheDirectory: nothing discovers, so the flag
// would do nothing.
func TestConfigFlagsLeaveOutTheCacheDirectory(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	kube.NewConfigFlags().AddFlags(fs)
	assert.Nil(t, fs.Lookup("cache-dir"))
	for _, name := range []string{"kubeconfig", "context", "namespace", "as", "as-group", "request-timeout", "token", "server"} {
		assert.NotNil(t, fs.Lookup(name), name)
	}
}

// A flag naming what is not there or not valid is a usage error (exit 2),
// as the CLI's exit statuses say; before, each was a plain error (exit 1).
// A kubeconfig that loads is not refused here, whatever its server.
func TestAKubeconfigFlagNamingWhatIsNotThereIsAUsageError(t *testing.T) {
	path := kubeconfig(t)
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
	}{
		{"a --kubeconfig that does not exist", []string{"--kubeconfig", filepath.Join(t.TempDir(), "none")}, true},
		{"a --context the kubeconfig does not hold", []string{"--kubeconfig", path, "--context", "nope"}, true},
		{"a --cluster the kubeconfig does not hold", []string{"--kubeconfig", path, "--cluster", "nope"}, true},
		{"a --user the kubeconfig does not hold", []string{"--kubeconfig", path, "--user", "nope"}, true},
		{"a --request-timeout that is no duration", []string{"--kubeconfig", path, "--request-timeout", "3x"}, true},
		{"flags that load", []string{"--kubeconfig", path, "--context", "b", "--request-timeout", "3s"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := kube.NewConfigFlags()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			flags.AddFlags(fs)
			require.NoError(t, fs.Parse(tc.args))
			_, _, _, err := kube.Client(flags)
			if !tc.usage {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, usage.Is(err), "%v is not a usage error", err)
			assert.Contains(t, err.Error(), "kubeconfig: ")
		})
	}
	assert.False(t, usage.Is(kube.ConfigError(errors.New("exec plugin: no such credential"))), "any other loading error is a usage error")

	// No kubeconfig at all (none named, none in $KUBECONFIG or ~/.kube, not
	// in a pod) names nothing wrong: kubectl's defaults (localhost:8080)
	// load, and the connection fails later, exit 1.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	_, _, _, err := kube.Client(kube.NewConfigFlags())
	assert.False(t, usage.Is(err), "%v is a usage error", err)
	assert.False(t, usage.Is(kube.ConfigError(clientcmd.ErrEmptyConfig)), "an empty configuration is a usage error")
}
