package credclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/execcache"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// DefaultExecTTL is the lifetime the exec credential plugin asks for: short,
// since asking again costs the person nothing.
const DefaultExecTTL = time.Hour

// execKubeconfigSuffix is the suffix of the default output of
// `ichor cluster kubeconfig --exec`.
const execKubeconfigSuffix = ".ichor-admin-exec"

// ExecInfoEnv is the variable kubectl passes the exec plugin's input in.
const ExecInfoEnv = "KUBERNETES_EXEC_INFO"

// ExecRunningEnv marks the processes a run of the plugin starts (the
// management kubeconfig's own credential plugin, through whatever wrapper):
// a run that finds it set was started by another, and refuses at once
// rather than start the next (refuseNested knows the plugin only by its
// arguments; a shell or a script in between hides them).
const ExecRunningEnv = "ICHOR_EXEC_CREDENTIAL_RUNNING"

// ExecCredentialCommand is the plugin's subcommand: an argument of every
// exec kubeconfig Ichor writes, and how a management kubeconfig that would
// run the plugin itself is recognized.
const ExecCredentialCommand = "exec-credential" //nolint:gosec // a subcommand's name, not a credential

// maxExecInfo bounds KUBERNETES_EXEC_INFO: it holds a few flags, or a
// cluster's CA with provideClusterInfo, which Ichor does not ask for.
const maxExecInfo = 1 << 20

// ExecPlugin is the command kubectl runs for an exec kubeconfig: never key
// material, only what reaches the management API server.
type ExecPlugin struct {
	// Command is the program: the name or path ichor was run as.
	Command string
	// Args are its arguments: cluster exec-credential NAME and the flags.
	Args []string
	// Env is added to its environment (KUBECONFIG, when the management
	// kubeconfig is several files).
	Env []clientcmdapi.ExecEnvVar
}

// ExecKubeconfig writes an admin kubeconfig whose user is an exec plugin,
// plugin, that asks for a short-lived admin certificate when kubectl needs
// one. Nothing is requested now; the lifetime is checked against the
// embedded policy, so that a kubeconfig that can never work is not written.
func ExecKubeconfig(ctx context.Context, o Request, plugin ExecPlugin) (Written, error) {
	if o.BreakGlass {
		return Written{}, usage.Errorf("--exec does not apply to --break-glass: the super-admin credential is asked for by a person, each time, never renewed by kubectl")
	}
	if o.TTL == nil {
		ttl := DefaultExecTTL
		o.TTL = &ttl
	}
	out, protected, err := kubeconfigOutput(o, execKubeconfigSuffix)
	if err != nil {
		return Written{}, err
	}
	restCfg, err := o.Kube.ToRESTConfig()
	if err != nil {
		return Written{}, kube.ConfigError(err)
	}
	if err := refuseNested(restCfg); err != nil {
		return Written{}, err
	}
	key, err := newKey()
	if err != nil {
		return Written{}, err
	}
	if _, err := checkLocally(ctx, o, ichorv1alpha1.PurposeKubeconfigAdmin, key); err != nil {
		return Written{}, err
	}
	caData, err := serverCA(restCfg)
	if err != nil {
		return Written{}, err
	}

	cluster := o.Cluster
	auth := &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: clientauthv1.SchemeGroupVersion.String(),
		Command:    plugin.Command,
		Args:       plugin.Args,
		Env:        plugin.Env,
		// The plugin never reads standard input: it runs under k9s, CI and
		// scripts as under a terminal.
		InteractiveMode:    clientcmdapi.NeverExecInteractiveMode,
		ProvideClusterInfo: false,
		InstallHint: "ichor runs this kubeconfig's credential plugin: install the ichor binary as " +
			plugin.Command + " (on your PATH as kubectl-ichor, for instance), see docs/credentials.md",
	}}
	if err := writeKubeconfig(out, protected, o.Force, cluster, cluster+"-admin", restCfg, caData, auth); err != nil {
		return Written{}, err
	}
	return Written{
		Path:        out,
		Description: "an admin kubeconfig for " + restCfg.Host,
		// Each credential's lifetime: the file holds none.
		Expires: o.TTL.String(),
		UseWith: "kubectl --kubeconfig " + out + " get nodes",
	}, nil
}

// refuseNested refuses a management kubeconfig whose context runs the plugin
// itself: it would ask for an admin credential with another admin
// credential, as nobody, or run itself without end.
func refuseNested(cfg *rest.Config) error {
	if cfg.ExecProvider != nil && slices.Contains(cfg.ExecProvider.Args, ExecCredentialCommand) {
		return usage.Errorf("the kubeconfig context used to ask runs %q %s itself: ask with your own kubeconfig (pass --kubeconfig and --context)",
			cfg.ExecProvider.Command, ExecCredentialCommand)
	}
	return nil
}

// CheckExecInfo reads what kubectl passes the plugin (KUBERNETES_EXEC_INFO),
// with client-go's own types: an ExecCredential of
// client.authentication.k8s.io/v1, the version Ichor's kubeconfigs name.
// Empty, when the plugin is run by hand, is accepted. A field this build's
// types do not know is not refused: a newer kubectl may send one (as
// interactive and cluster were added before), and the plugin reads none of
// them (review 186: a strict decode would have failed every kubectl call).
func CheckExecInfo(info string) error {
	if info == "" {
		return nil
	}
	if len(info) > maxExecInfo {
		return usage.Errorf("%s is larger than %d bytes", ExecInfoEnv, maxExecInfo)
	}
	scheme := runtime.NewScheme()
	if err := clientauthv1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	obj, gvk, err := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode([]byte(info), nil, nil)
	if err != nil {
		return usage.Errorf("%s is not an ExecCredential of %s (write the kubeconfig again with ichor cluster kubeconfig --exec): %v",
			ExecInfoEnv, clientauthv1.SchemeGroupVersion, err)
	}
	if _, ok := obj.(*clientauthv1.ExecCredential); !ok {
		return usage.Errorf("%s holds a %s, not an ExecCredential", ExecInfoEnv, gvk)
	}
	return nil
}

// ExecCredential is the plugin: the cached admin credential for the cluster,
// if one is usable, else one asked for exactly as `ichor cluster kubeconfig`
// asks, cached in cacheDir. What the cache refuses or fails at is said on
// warn and costs a request, never the credential.
func ExecCredential(ctx context.Context, o Request, cacheDir string, warn io.Writer) (*clientauthv1.ExecCredential, error) {
	if o.TTL == nil {
		ttl := DefaultExecTTL
		o.TTL = &ttl
	}
	restCfg, err := o.Kube.ToRESTConfig()
	if err != nil {
		return nil, kube.ConfigError(err)
	}
	if err := refuseNested(restCfg); err != nil {
		return nil, err
	}
	key, err := cacheKey(o, restCfg)
	if err != nil {
		return nil, err
	}
	var cache *execcache.Cache
	if cacheDir != "" {
		if cache, err = execcache.Open(cacheDir); err != nil {
			fmt.Fprintf(warn, "ichor: %v; the credential is not cached\n", err)
		}
	}
	if cache != nil {
		cred, err := cache.Load(key, time.Now())
		if cred != nil {
			return cred, nil
		}
		if err != nil {
			fmt.Fprintf(warn, "ichor: %v\n", err)
		}
		if err := heldRefusal(cache, key, warn); err != nil {
			return nil, err
		}
		lockCtx, cancel := context.WithTimeout(ctx, o.Timeout)
		unlock, err := cache.Lock(lockCtx, key)
		cancel()
		if err != nil {
			fmt.Fprintf(warn, "ichor: %v\n", err)
		} else {
			defer unlock()
			// Another run may have asked while this one waited, and been
			// issued or refused.
			if cred, _ := cache.Load(key, time.Now()); cred != nil {
				return cred, nil
			}
			if err := heldRefusal(cache, key, io.Discard); err != nil {
				return nil, err
			}
		}
	}

	asked := time.Now()
	issued, err := requestKubeCredential(ctx, o, ichorv1alpha1.PurposeKubeconfigAdmin, nil)
	if err != nil {
		err = fmt.Errorf("no admin credential for cluster %s: %w", o.Cluster, err)
		if cache != nil {
			holdRefusal(cache, key, err, warn)
		}
		return nil, err
	}
	// The certificate checked, and nothing around it, is what kubectl and
	// the cache get (requestKubeCredential).
	leaf, certPEM := issued.leaf, issued.certPEM
	// Reused for the shorter of the certificate's lifetime and the one asked
	// for, counted on this machine's clock from the request: the
	// certificate's dates are its signer's word, and its signer's clock. A
	// certificate of a century (a forged answer) or a clock here behind the
	// issuer's would otherwise be served after the API server refuses it,
	// and kubectl asks the plugin again only on a 401; a clock here ahead
	// of the issuer's by more than the lifetime would make every credential
	// due at once, and kubectl ask for a new one before each of its
	// requests (review 164).
	lifetime := min(*o.TTL, leaf.NotAfter.Sub(leaf.NotBefore))
	if lifetime <= 0 {
		return nil, fmt.Errorf("the issued certificate is valid for no time (from %s to %s)",
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	renewAt := execcache.RenewWithin(asked, asked.Add(lifetime))
	cred := execcache.Credential(certPEM, issued.keyPEM, renewAt)
	if cache != nil {
		if err := cache.Store(key, cred); err != nil {
			fmt.Fprintf(warn, "ichor: %v\n", err)
		}
	}
	return cred, nil
}

// holdRefusal keeps err in the cache for execcache.RefusalHold, if it is a
// refusal by the rules. Its text is escaped now, as the live error is when
// it is printed: held, it is plain text, and the server's newlines would be
// printed as lines of ichor's own (review 259 F1). Held from the answer,
// not from the asking: a refusal slower than the hold is held too.
func holdRefusal(cache *execcache.Cache, key execcache.Key, err error, warn io.Writer) {
	if !errors.As(err, new(RefusedError)) {
		return
	}
	if err := cache.StoreRefusal(key, termsafe.ErrorText(err), time.Now()); err != nil {
		fmt.Fprintf(warn, "ichor: %v\n", err)
	}
}

// heldRefusal is the refusal the cache holds for key, as the error of this
// run: no request is made until it is over. What the cache cannot tell is
// said on warn, and asked.
func heldRefusal(cache *execcache.Cache, key execcache.Key, warn io.Writer) error {
	r, err := cache.LoadRefusal(key, time.Now())
	if err != nil {
		fmt.Fprintf(warn, "ichor: %v\n", err)
	}
	if r == nil {
		return nil
	}
	return RefusedError{err: fmt.Errorf("%s\n(refused at %s, and held: asked again from %s on; remove %s to ask at once)",
		r.Message, r.Asked.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339), cache.RefusalPath(key))}
}

// cacheKey is what the credential of o is cached under: the management
// server, the TalosCluster, the purpose, the kubeconfig's files, context and
// user, the impersonation and a digest of the identity that asks. It reads
// only the local configuration: a cached credential costs no request.
func cacheKey(o Request, cfg *rest.Config) (execcache.Key, error) {
	loader := o.Kube.ToRawKubeConfigLoader()
	namespace, _, err := loader.Namespace()
	if err != nil {
		return execcache.Key{}, fmt.Errorf("kubeconfig namespace: %w", err)
	}
	raw, err := loader.RawConfig()
	if err != nil {
		return execcache.Key{}, kube.ConfigError(err)
	}
	contextName := raw.CurrentContext
	var userFlag string
	if f, ok := o.Kube.(*genericclioptions.ConfigFlags); ok {
		if f.Context != nil && *f.Context != "" {
			contextName = *f.Context
		}
		if f.AuthInfoName != nil {
			userFlag = *f.AuthInfoName
		}
	}
	user := userFlag
	if c, ok := raw.Contexts[contextName]; ok && user == "" {
		user = c.AuthInfo
	}
	files := slices.Clone(kube.KubeconfigFiles(o.Kube))
	for i, f := range files {
		if abs, err := filepath.Abs(f); err == nil {
			files[i] = abs
		}
	}
	impersonate, err := json.Marshal(cfg.Impersonate)
	if err != nil {
		return execcache.Key{}, fmt.Errorf("encode the impersonation: %w", err)
	}
	return execcache.Key{
		Server:        cfg.Host,
		TLSServerName: cfg.TLSClientConfig.ServerName,
		Namespace:     namespace,
		Cluster:       o.Cluster,
		Purpose:       string(ichorv1alpha1.PurposeKubeconfigAdmin),
		Kubeconfig:    files,
		Context:       contextName,
		User:          user,
		Impersonate:   string(impersonate),
		Identity:      identityDigest(cfg),
		TTL:           ttlKey(o.TTL),
	}, nil
}

// ttlKey is the lifetime asked for as the cache key holds it; "" for the
// policy's default.
func ttlKey(ttl *time.Duration) string {
	if ttl == nil {
		return ""
	}
	return ttl.String()
}

// identityDigest is a SHA-256 of what cfg authenticates with: certificate,
// token and their files (names and contents, so that a file rewritten for
// another person is another identity), a user name, an exec plugin (its
// command, arguments and environment) or auth provider. A password is left
// out (it may be guessable, and the digest names a file). What an exec
// plugin reads from the rest of the environment (a cloud profile, an OIDC
// login) it cannot see: docs/credentials.md says to clear the cache when
// switching identity that way.
func identityDigest(cfg *rest.Config) string {
	id := struct {
		CertData, CertFile, KeyFile, Token, TokenFile, Username string
		CertFileSum, TokenFileSum                               string
		ExecCommand                                             string
		ExecArgs                                                []string
		ExecEnv                                                 []string
		AuthProvider                                            string
	}{
		CertData: string(cfg.TLSClientConfig.CertData), CertFile: cfg.TLSClientConfig.CertFile, KeyFile: cfg.TLSClientConfig.KeyFile,
		Token: cfg.BearerToken, TokenFile: cfg.BearerTokenFile, Username: cfg.Username,
		CertFileSum: fileSum(cfg.TLSClientConfig.CertFile), TokenFileSum: fileSum(cfg.BearerTokenFile),
	}
	if cfg.ExecProvider != nil {
		id.ExecCommand, id.ExecArgs = cfg.ExecProvider.Command, cfg.ExecProvider.Args
		for _, v := range cfg.ExecProvider.Env {
			id.ExecEnv = append(id.ExecEnv, v.Name+"="+v.Value)
		}
	}
	if cfg.AuthProvider != nil {
		id.AuthProvider = cfg.AuthProvider.Name
	}
	data, err := json.Marshal(id)
	if err != nil {
		panic(err) // strings always marshal
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// maxIdentityFile bounds what fileSum reads: a certificate or a token.
const maxIdentityFile = 1 << 20

// fileSum is a SHA-256 of a file's first maxIdentityFile bytes, "" when
// there is no file or it cannot be read (the request then fails on its own).
func fileSum(path string) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxIdentityFile)); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}
