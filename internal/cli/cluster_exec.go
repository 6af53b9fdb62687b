package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ichor-dev/ichor-policy/internal/credclient"
	"github.com/ichor-dev/ichor-policy/internal/execcache"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// argv0Annotation holds, on the root command, the name or path the binary
// was run as: an exec kubeconfig runs the plugin with it.
const argv0Annotation = "ichor.dev/argv0"

// Of kubectl's flags, those an exec kubeconfig carries to the plugin as they
// were given, those that are paths (made absolute: kubectl may run the
// plugin from another directory), and those it refuses to write down.
var (
	execCarriedFlags = map[string]bool{
		"cluster": true, "user": true, "server": true, "tls-server-name": true, "insecure-skip-tls-verify": true,
		"as": true, "as-uid": true, "as-group": true, "as-user-extra": true,
		"request-timeout": true, "disable-compression": true, "proxy-url": true, "timeout": true,
	}
	execPathFlags   = map[string]bool{"certificate-authority": true, "client-certificate": true, "client-key": true}
	execSecretFlags = map[string]bool{"token": true, "username": true, "password": true}
)

// writeExecKubeconfig is `ichor cluster kubeconfig NAME --exec`.
func writeExecKubeconfig(cmd *cobra.Command, s streams, k genericclioptions.RESTClientGetter, o credentialFlags, cluster string) error {
	if err := positiveTimeout(o.timeout); err != nil {
		return err
	}
	r := o.request(cmd, k, cluster, s)
	if r.TTL == nil {
		ttl := credclient.DefaultExecTTL
		r.TTL = &ttl
	}
	plugin, err := execPlugin(cmd, k, cluster, *r.TTL, o.execCommand)
	if err != nil {
		return err
	}
	w, err := credclient.ExecKubeconfig(cmd.Context(), r, plugin)
	if err != nil {
		return err
	}
	dir, err := execcache.DefaultDir()
	if err != nil {
		dir = "(no cache directory: " + err.Error() + ")"
	}
	fmt.Fprintf(s.out, "Wrote %s to %s; it holds no credential.\nkubectl runs %s %s when it needs one: a certificate of %s, cached in %s until shortly before it expires.\nUse it with: %s\n",
		w.Description, w.Path, plugin.Command, strings.Join(plugin.Args, " "), w.Expires, dir, w.UseWith)
	return nil
}

// execPlugin is the command line kubectl runs: this binary, as it was run
// (or --exec-command), with the flags that reach the management API server
// as this command reached it. The kubeconfig file, its context and the
// namespace are pinned, so that changing your current context later, or
// running kubectl with KUBECONFIG set to the exec kubeconfig itself, does
// not change whom the plugin asks.
func execPlugin(cmd *cobra.Command, k genericclioptions.RESTClientGetter, cluster string, ttl time.Duration, command string) (credclient.ExecPlugin, error) {
	p := credclient.ExecPlugin{Command: execCommand(cmd, command), Args: []string{"cluster", credclient.ExecCredentialCommand, cluster}}
	loader := k.ToRawKubeConfigLoader()
	namespace, _, err := loader.Namespace()
	if err != nil {
		return p, fmt.Errorf("kubeconfig namespace: %w", err)
	}
	p.Args = append(p.Args, "--namespace="+namespace)
	files := kube.KubeconfigFiles(k)
	abs := make([]string, 0, len(files))
	for _, f := range files {
		a, err := filepath.Abs(f)
		if err != nil {
			return p, fmt.Errorf("kubeconfig %s: %w", f, err)
		}
		abs = append(abs, a)
	}
	switch len(abs) {
	case 0:
	case 1:
		p.Args = append(p.Args, "--kubeconfig="+abs[0])
	default:
		p.Env = append(p.Env, clientcmdapi.ExecEnvVar{Name: "KUBECONFIG", Value: strings.Join(abs, string(os.PathListSeparator))})
	}
	contextName := ""
	if f := cmd.Flags().Lookup("context"); f != nil && f.Changed {
		contextName = f.Value.String()
	} else if raw, err := loader.RawConfig(); err == nil {
		contextName = raw.CurrentContext
	}
	if contextName != "" {
		p.Args = append(p.Args, "--context="+contextName)
	}
	p.Args = append(p.Args, "--ttl="+ttl.String())
	var visitErr error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if visitErr != nil {
			return
		}
		switch {
		case execSecretFlags[f.Name]:
			visitErr = usage.Errorf("--%s would be written into the kubeconfig in clear: keep the credential in your kubeconfig (or a file it names) and pass --kubeconfig and --context", f.Name)
		case (f.Name == "proxy-url" || f.Name == "server") && urlHasUser(f.Value.String()):
			// Carried, a password in the URL would be in the kubeconfig
			// and in every run's command line, which other users of the
			// machine may read (review 253 F3, review 257).
			visitErr = usage.Errorf("--%s names a user (and perhaps a password), which would be written into the kubeconfig in clear and shown in every run's command line: set it in your kubeconfig's cluster entry and pass --kubeconfig and --context", f.Name)
		case execPathFlags[f.Name]:
			a, err := filepath.Abs(f.Value.String())
			if err != nil {
				visitErr = fmt.Errorf("--%s: %w", f.Name, err)
				return
			}
			p.Args = append(p.Args, "--"+f.Name+"="+a)
		case execCarriedFlags[f.Name]:
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				for _, v := range sv.GetSlice() {
					p.Args = append(p.Args, "--"+f.Name+"="+v)
				}
				return
			}
			p.Args = append(p.Args, "--"+f.Name+"="+f.Value.String())
		}
	})
	return p, visitErr
}

// urlHasUser: the URL may carry user information: it has some, cannot be
// read to tell, or holds an @ anywhere (a URL without a scheme, me:pw@host,
// reads as an opaque one with no user; client-go's loader refuses those it
// knows first).
func urlHasUser(raw string) bool {
	u, err := url.Parse(raw)
	return err != nil || u.User != nil || strings.Contains(raw, "@")
}

// execCommand is the program an exec kubeconfig runs: --exec-command, else
// the binary as it was run. A bare name (ichor, found on the PATH) stays a
// name, so that kubectl finds it on the PATH as the shell did; a path is made
// absolute. kubectl runs a plugin with the path it found (a krew link such as
// ~/.krew/bin/kubectl-ichor), which is kept as it is, not resolved, so that
// upgrading the plugin does not break the kubeconfig.
func execCommand(cmd *cobra.Command, flag string) string {
	name := flag
	if name == "" {
		name = cmd.Root().Annotations[argv0Annotation]
	}
	if name == "" {
		name = "ichor"
	}
	if !strings.ContainsRune(name, '/') && !strings.ContainsRune(name, filepath.Separator) {
		return name
	}
	if abs, err := filepath.Abs(name); err == nil {
		return abs
	}
	return name
}

func newExecCredentialCommand(s streams, k genericclioptions.RESTClientGetter) *cobra.Command {
	var ttl, timeout time.Duration
	cmd := &cobra.Command{
		Use:   credclient.ExecCredentialCommand + " NAME [--ttl 1h] [-n NAMESPACE] [--kubeconfig FILE] [--context NAME]",
		Short: "kubectl's credential plugin for a kubeconfig of cluster kubeconfig --exec",
		Long: `The client.authentication.k8s.io/v1 exec credential plugin that a kubeconfig
written by "cluster kubeconfig NAME --exec" runs: kubectl, client-go programs and
k9s run it when they need a credential, and read an ExecCredential from its
standard output.

It prints the admin certificate cached for this management server, namespace,
cluster, kubeconfig context and user, while it is not due for renewal (5 minutes
before it expires, or a tenth of its lifetime when that is shorter). Otherwise it
asks for a new one exactly as "cluster kubeconfig" does (a key made here, a
TalosCredentialRequest as you, the webhook's and the issuer's decisions) and
caches it under your cache directory (ichor/exec-credential, files 0600).

A refusal (NotAuthorized, AdminKubeconfigsRevoked, UsernameReserved, ...) is
written to standard error with its reason code, nothing to standard output, and
the exit status is not zero, so kubectl fails with that message. A refusal by
the rules (the webhook, an admission policy, the issuer) is held for 30
seconds: the runs within them print it again without asking (a client that
retries would ask every few seconds); a failure to issue, RBAC's or a quota's
refusal, or an unreachable server is not held. Remove the file the message names to ask
at once.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := positiveTimeout(timeout); err != nil {
				return err
			}
			if err := credclient.CheckExecInfo(os.Getenv(credclient.ExecInfoEnv)); err != nil {
				return err
			}
			// A management kubeconfig that runs this plugin through a
			// wrapper would have each run wait --timeout for the lock
			// its parent holds and then start the next, without end
			// (review 253 F2).
			if os.Getenv(credclient.ExecRunningEnv) != "" {
				return usage.Errorf("run by another %s (%s is set): the kubeconfig context used to ask runs it itself, through a wrapper; ask with your own kubeconfig (pass --kubeconfig and --context)",
					credclient.ExecCredentialCommand, credclient.ExecRunningEnv)
			}
			if err := os.Setenv(credclient.ExecRunningEnv, "1"); err != nil {
				return fmt.Errorf("mark the processes this run starts: %w", err)
			}
			// Gone with the run, for a program that runs the CLI in its
			// own process (the tests do).
			defer os.Unsetenv(credclient.ExecRunningEnv) //nolint:errcheck // only a name that is not valid fails
			dir, err := execcache.DefaultDir()
			if err != nil {
				fmt.Fprintf(s.err, "ichor: %v; the credential is not cached\n", err)
			}
			r := credclient.Request{Kube: k, Cluster: args[0], TTL: &ttl, Timeout: timeout, Progress: io.Discard}
			cred, err := credclient.ExecCredential(cmd.Context(), r, dir, s.err)
			if err != nil {
				return err
			}
			data, err := json.Marshal(cred)
			if err != nil {
				return fmt.Errorf("encode the ExecCredential: %w", err)
			}
			_, err = fmt.Fprintf(s.out, "%s\n", data)
			return err
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", credclient.DefaultExecTTL, "lifetime of each credential asked for; above the policy's cap it is refused, never shortened")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long the request may take, from asking who you are to the controller's answer, and how long to wait for another run asking at once")
	return cmd
}
