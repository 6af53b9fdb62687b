package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/talos/render"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

func newRenderCommand(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the Talos machine-configuration patches a cluster's options render to",
	}
	var file, namespace, kubeconfig, role string
	serving := &cobra.Command{
		Use:   "kubelet-serving [NAME] [-f FILE] [--role controlplane|worker]",
		Short: "The kubelet serving certificate patch of a TalosCluster (ADR 0125)",
		Long: `Print the machine-configuration patch that kubelet serving certificates render to
for a TalosCluster, for each machine role (or one with --role): the KubeletConfig
document with serverTLSBootstrap from Talos v1.14 on, machine.kubelet.extraConfig
before it, and --kubelet-certificate-authority for the kube-apiserver only once
the cluster's KubeletServingVerified condition is True. Nothing is printed when
the option is off.

The cluster is read from FILE (-f, as kubectl get taloscluster NAME -o yaml
prints it) or from the API server (NAME, -n NAMESPACE).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var cluster ichorv1alpha1.TalosCluster
			switch {
			case file != "" && len(args) > 0:
				return usage.Errorf("give either NAME or -f FILE, not both")
			case file != "":
				data, err := os.ReadFile(file)
				if err != nil {
					return usage.Errorf("read %s: %w", file, err)
				}
				if err := yaml.UnmarshalStrict(data, &cluster); err != nil {
					return usage.Errorf("%s is not a TalosCluster manifest: %v", file, err)
				}
				if cluster.Kind != "TalosCluster" {
					return usage.Errorf("%s is a %q, not a TalosCluster", file, cluster.Kind)
				}
			case len(args) == 1:
				cfg, err := kube.RESTConfig(kubeconfig)
				if err != nil {
					return err
				}
				scheme, err := kube.Scheme()
				if err != nil {
					return err
				}
				c, err := client.New(cfg, client.Options{Scheme: scheme})
				if err != nil {
					return fmt.Errorf("client: %w", err)
				}
				if err := c.Get(cmd.Context(), types.NamespacedName{Namespace: namespace, Name: args[0]}, &cluster); err != nil {
					return fmt.Errorf("get TalosCluster %s/%s: %w", namespace, args[0], err)
				}
			default:
				return usage.Errorf("give the cluster: NAME (with -n NAMESPACE) or -f FILE")
			}
			roles := []ichorv1alpha1.MachineRole{ichorv1alpha1.MachineRoleControlPlane, ichorv1alpha1.MachineRoleWorker}
			switch role {
			case "":
			case string(ichorv1alpha1.MachineRoleControlPlane), string(ichorv1alpha1.MachineRoleWorker):
				roles = []ichorv1alpha1.MachineRole{ichorv1alpha1.MachineRole(role)}
			default:
				return usage.Errorf("--role %q: want controlplane or worker", role)
			}
			patch, err := render.KubeletServing(&cluster)
			if err != nil {
				return err
			}
			if patch.Empty() {
				fmt.Fprintf(s.err, "kubelet serving certificates are off for %s/%s: nothing to render\n", cluster.Namespace, cluster.Name)
				return nil
			}
			for _, r := range roles {
				b, err := patch.Bytes(r)
				if err != nil {
					return err
				}
				if b == nil {
					continue
				}
				fmt.Fprintf(s.out, "# role: %s, Talos %s\n%s", r, cluster.Spec.TalosVersion, b)
				if len(roles) > 1 && r != roles[len(roles)-1] {
					fmt.Fprintln(s.out, "---")
				}
			}
			return nil
		},
	}
	f := serving.Flags()
	f.StringVarP(&file, "file", "f", "", "a TalosCluster manifest (YAML or JSON)")
	f.StringVarP(&namespace, "namespace", "n", "default", "namespace of the TalosCluster")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to read the cluster with")
	f.StringVar(&role, "role", "", "print only the patch of this machine role (controlplane or worker)")
	cmd.AddCommand(serving)
	return cmd
}
