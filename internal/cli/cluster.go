package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/ichor-dev/ichor-policy/internal/credclient"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// credentialFlags are the flags of every credential command.
type credentialFlags struct {
	ttl            time.Duration
	out            string
	force          bool
	timeout        time.Duration
	decisionLog    string
	talosEndpoints []string
	breakGlass     bool
	merge          bool
	exec           bool   // cluster kubeconfig --exec (cluster_exec.go)
	execCommand    string // cluster kubeconfig --exec-command
}

// request is what the flags ask for.
func (o credentialFlags) request(cmd *cobra.Command, k genericclioptions.RESTClientGetter, cluster string, s streams) credclient.Request {
	r := credclient.Request{
		Kube: k, Cluster: cluster, Out: o.out, Force: o.force, Timeout: o.timeout,
		DecisionLog: o.decisionLog, TalosEndpoints: o.talosEndpoints, BreakGlass: o.breakGlass, Merge: o.merge,
		Progress: s.err,
	}
	if cmd.Flags().Changed("ttl") {
		ttl := o.ttl
		r.TTL = &ttl
	}
	return r
}

// positiveTimeout refuses a --timeout that would end the exchange before
// it starts (review 186: "did not answer within 0s", and an exec
// kubeconfig that carries it to every run).
func positiveTimeout(d time.Duration) error {
	if d <= 0 {
		return usage.Errorf("--timeout %s: give a duration above 0 (2m by default)", d)
	}
	return nil
}

// writeCredential asks for the credential and says what was written.
func writeCredential(cmd *cobra.Command, s streams, ask func(context.Context, credclient.Request) (credclient.Written, error), r credclient.Request) error {
	if err := retired(cmd, "--out FILE"); err != nil {
		return err
	}
	if err := positiveTimeout(r.Timeout); err != nil {
		return err
	}
	w, err := ask(cmd.Context(), r)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "Wrote %s to %s (expires %s).\nUse it with: %s\n", w.Description, w.Path, w.Expires, w.UseWith)
	return nil
}

func newClusterCommand(s streams) *cobra.Command {
	k := kube.NewConfigFlags()
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Ask for short-lived credentials of a Talos cluster",
		Long: `Ask Ichor for a short-lived credential of a TalosCluster with your own Kubernetes
identity. The key is made here and never leaves this process except in the file
written; the request carries only the public key. Whether you may have the
credential is decided by the policy at admission (the webhook checks your RBAC
verb and records an Event naming you) and again by the controller before it signs.`,
	}
	// kubectl's own flags, so that whatever reaches the cluster with kubectl
	// (a context, impersonation, a token) reaches it here; -n is the
	// TalosCluster's namespace, by default the context's.
	k.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(newTalosconfigCommand(s, k), newKubeconfigCommand(s, k), newExecCredentialCommand(s, k))
	cmd.AddCommand(newAdminsCommand(s, k))
	return cmd
}

func addCredentialFlags(cmd *cobra.Command, o *credentialFlags, what string) {
	f := cmd.Flags()
	f.DurationVar(&o.ttl, "ttl", 0, "lifetime of the "+what+" (default: the policy's default for it); above the policy's cap it is refused, never shortened")
	f.StringVar(&o.out, "out", "", "file to write")
	addRetiredOutput(f)
	f.BoolVar(&o.force, "force", false, "replace --out if it exists (never the file you are using now)")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long the request may take, from asking who you are to the controller's answer; each call to the API server before it is cut off after as long")
	f.StringVar(&o.decisionLog, "decision-log", "", "append the local policy check's decision log (JSON lines) to this file")
}

func newTalosconfigCommand(s streams, k genericclioptions.RESTClientGetter) *cobra.Command {
	o := credentialFlags{}
	cmd := &cobra.Command{
		Use:   "talosconfig NAME [--ttl 1h] [--out FILE | --merge] [--talos-endpoints HOST,...] [-n NAMESPACE]",
		Short: "Get a read-only (os:reader) talosconfig for talosctl",
		Long: `Get a talosconfig whose certificate carries the Talos role os:reader: talosctl can
read (version, get members, logs, dmesg, processes) and is refused anything that
changes a node. You need the RBAC verb download on talosclusters/talosconfig-reader
for the cluster (ichor-operator and ichor-admin hold it).

The file is written with mode 0600. By default it goes beside your current
talosconfig ($TALOSCONFIG or ~/.talos/config) with the suffix .ichor-reader; the
current talosconfig is never overwritten, nor any existing file without --force.
With --merge the credential is merged into your talosconfig instead, as
talosctl config merge does: its context (NAME-reader, renamed NAME-reader-1, ...
when the name is taken) becomes the current one, and the others are kept.
The endpoints are --talos-endpoints, else the cluster's control-plane
machines, else those of your current talosconfig.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTalosClusters(k),
		RunE: func(cmd *cobra.Command, args []string) error {
			return writeCredential(cmd, s, credclient.Talosconfig, o.request(cmd, k, args[0], s))
		},
	}
	addCredentialFlags(cmd, &o, "talosconfig")
	cmd.Flags().StringSliceVar(&o.talosEndpoints, "talos-endpoints", nil, "Talos API endpoints to write, instead of the cluster's control-plane TalosMachines'")
	cmd.Flags().BoolVar(&o.merge, "merge", false, "merge into your talosconfig ($TALOSCONFIG, else ~/.talos/config) as talosctl config merge does, instead of writing --out")
	return cmd
}

func newKubeconfigCommand(s streams, k genericclioptions.RESTClientGetter) *cobra.Command {
	o := credentialFlags{}
	cmd := &cobra.Command{
		Use:   "kubeconfig NAME [--out FILE] [--ttl DURATION] [--break-glass | --exec] [-n NAMESPACE]",
		Short: "Get a cluster-admin kubeconfig (revocable by RBAC)",
		Long: `Get a kubeconfig for the cluster Ichor runs in whose certificate names you
(common name ichor-admin:u:USERNAME, or a hash of an unusual username) and whose
only group is bound to cluster-admin by a ClusterRoleBinding of your own, which
Ichor makes before it signs: 'ichor cluster admins revoke USERNAME' revokes yours
without touching anyone else's. You need download on talosclusters/kubeconfig-admin.

--break-glass asks for the super-admin kubeconfig instead (group system:masters,
which RBAC cannot restrict; only its short lifetime limits it). It needs download
on talosclusters/kubeconfig-super-admin, which no shipped role holds, and every
issuance is a Warning Event on the cluster.

The server and its CA come from your kubeconfig. The file is written with mode
0600, by default beside your kubeconfig with the suffix .ichor-admin (or
.ichor-break-glass); your kubeconfig is never overwritten, nor any existing file
without --force.

--exec writes a kubeconfig (suffix .ichor-admin-exec) that holds no credential:
its user runs "cluster exec-credential NAME" as a client.authentication.k8s.io/v1
exec plugin, which asks for a short-lived admin certificate (--ttl, default 1h)
when kubectl needs one and caches it until shortly before it expires.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTalosClusters(k),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.exec {
				if err := retired(cmd, "--out FILE"); err != nil {
					return err
				}
				return writeExecKubeconfig(cmd, s, k, o, args[0])
			}
			return writeCredential(cmd, s, credclient.Kubeconfig, o.request(cmd, k, args[0], s))
		},
	}
	addCredentialFlags(cmd, &o, "kubeconfig")
	cmd.Flags().BoolVar(&o.breakGlass, "break-glass", false, "ask for the break-glass super-admin kubeconfig (system:masters)")
	cmd.Flags().BoolVar(&o.exec, "exec", false, "write a kubeconfig that holds no credential: kubectl runs ichor cluster exec-credential for a short-lived one (--ttl, default 1h) when it needs one")
	cmd.Flags().StringVar(&o.execCommand, "exec-command", "", "with --exec, the program kubectl runs (default: this binary, as you ran it)")
	return cmd
}
