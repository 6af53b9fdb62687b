package cli

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// completionTimeout bounds what a shell's completion waits for the API
// server: a slow cluster must not hang a Tab.
const completionTimeout = 5 * time.Second

// maxCompletions bounds how many names are offered.
const maxCompletions = 1000

// completeCSRs offers the names of the cluster's CSRs, read with the
// command's kubeconfig flags; pending, only the undecided ones of a signer
// Ichor decides (what approve and deny accept).
func completeCSRs(k genericclioptions.RESTClientGetter, pending bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
		c, _, _, err := kube.Client(k)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		var list certificatesv1.CertificateSigningRequestList
		if err := c.List(ctx, &list, client.Limit(maxCompletions)); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []cobra.Completion
		for _, csr := range list.Items {
			if !strings.HasPrefix(csr.Name, prefix) || slices.Contains(args, csr.Name) {
				continue
			}
			if termsafe.Escape(csr.Name) != csr.Name || strings.ContainsAny(csr.Name, " \t\n") {
				// Kubernetes does not check a request's name: one with a
				// tab or a line break would be a description or another
				// candidate to the shell, and one with an escape would
				// reach the terminal (the hostile review of 2026-12-05).
				continue
			}
			if pending && (!slices.Contains(ichorSigners, csr.Spec.SignerName) || hasVerdict(&csr)) {
				continue
			}
			names = append(names, csr.Name)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// hasVerdict reports whether the request carries a verdict.
func hasVerdict(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return true
		}
	}
	return false
}

// completeTalosClusters offers the names of the TalosClusters of the
// namespace the command's flags name (-n, else the context's).
func completeTalosClusters(k genericclioptions.RESTClientGetter) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, namespace, _, err := kube.Client(k)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		var list ichorv1alpha1.TalosClusterList
		if err := c.List(ctx, &list, client.InNamespace(namespace), client.Limit(maxCompletions)); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []cobra.Completion
		for _, tc := range list.Items {
			if strings.HasPrefix(tc.Name, prefix) {
				names = append(names, tc.Name)
			}
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeFlag registers fixed values for a flag of cmd, if it has it.
func completeFlag(cmd *cobra.Command, flag string, values ...string) {
	if cmd.Flags().Lookup(flag) == nil {
		return
	}
	_ = cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
}

// completeFlagValues registers the values of the flags that take one of a
// few, in c and every command under it.
func completeFlagValues(c *cobra.Command) {
	completeFlag(c, "action", decisionlog.Actions...)
	if c.HasParent() && c.Parent().Name() == "decisions" {
		// Elsewhere (policy doc, bundle build) --policy is a directory.
		completeFlag(c, "policy", slices.Sorted(maps.Keys(decisionlog.Policies))...)
	}
	completeFlag(c, "fail-on", decisionlog.FailOnValues()...)
	completeFlag(c, "authorized", "selfnodeclient", "nodeclient", "none")
	completeFlag(c, "role", string(ichorv1alpha1.MachineRoleControlPlane), string(ichorv1alpha1.MachineRoleWorker))
	completeFlag(c, "bundle-key-algorithm", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "HS256", "HS384", "HS512")
	for _, sub := range c.Commands() {
		completeFlagValues(sub)
	}
}
