package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/privatefile"
	"github.com/ichor-dev/ichor-policy/internal/talos/render"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

func newRenderCommand(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the Talos machine-configuration patches a cluster's options render to",
	}
	var file, role, outDir string
	k := kube.NewConfigFlags()
	serving := &cobra.Command{
		Use:   "kubelet-serving [NAME] [-f FILE] [--role controlplane|worker] [--output-dir DIR]",
		Short: "The kubelet serving certificate patch of a TalosCluster (ADR 0125)",
		Long: `Print the machine-configuration patch that kubelet serving certificates render to
for a TalosCluster: the KubeletConfig document with serverTLSBootstrap from Talos
v1.14 on, machine.kubelet.extraConfig before it, and --kubelet-certificate-authority
for the kube-apiserver, on control planes only, once the cluster's
KubeletServingVerified condition is True. Nothing is printed when the option is off.

A patch is for one machine role. When the roles' patches are the same it is
printed once; when they differ, --role chooses the one to print, or --output-dir DIR
writes one file per role (DIR/controlplane.yaml, DIR/worker.yaml, replaced if they exist),
each ready for talosctl patch mc --patch @FILE. Only the fields the patch sets
are written.

The cluster is read from FILE (-f, as kubectl get taloscluster NAME -o yaml
prints it) or from the API server (NAME, with kubectl's flags: -n NAMESPACE, by
default the kubeconfig context's, --context, --kubeconfig, ...).`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeTalosClusters(k),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := retired(cmd, "--output-dir DIR"); err != nil {
				return err
			}
			cluster, err := readTalosCluster(cmd, k, file, args)
			if err != nil {
				return err
			}
			roles := []ichorv1alpha1.MachineRole{ichorv1alpha1.MachineRoleControlPlane, ichorv1alpha1.MachineRoleWorker}
			switch role {
			case "":
			case string(ichorv1alpha1.MachineRoleControlPlane), string(ichorv1alpha1.MachineRoleWorker):
				roles = []ichorv1alpha1.MachineRole{ichorv1alpha1.MachineRole(role)}
			default:
				return usage.Errorf("--role %q: want controlplane or worker", role)
			}
			patch, err := render.KubeletServing(cluster)
			if err != nil {
				return err
			}
			if patch.Empty() {
				fmt.Fprintf(s.err, "kubelet serving certificates are off for %s/%s: nothing to render\n", cluster.Namespace, cluster.Name)
				return nil
			}
			patches, err := patchesByRole(patch, roles)
			if err != nil {
				return err
			}
			if outDir != "" {
				return writePatches(s, outDir, patches)
			}
			return printPatch(s, cluster, patches)
		},
	}
	f := serving.Flags()
	f.StringVarP(&file, "file", "f", "", "a TalosCluster manifest (YAML or JSON)")
	f.StringVar(&role, "role", "", "render only the patch of this machine role (controlplane or worker)")
	f.StringVar(&outDir, "output-dir", "", "write one file per role into this directory (ROLE.yaml) instead of printing")
	addRetiredOutput(f)
	k.AddFlags(f)
	cmd.AddCommand(serving)
	return cmd
}

// rolePatch is the encoded patch of one machine role.
type rolePatch struct {
	role ichorv1alpha1.MachineRole
	data []byte
}

func patchesByRole(patch render.Patch, roles []ichorv1alpha1.MachineRole) ([]rolePatch, error) {
	var out []rolePatch
	for _, r := range roles {
		b, err := patch.Bytes(r)
		if err != nil {
			return nil, err
		}
		if b != nil {
			out = append(out, rolePatch{role: r, data: b})
		}
	}
	return out, nil
}

// printPatch prints the one patch the roles asked for share. Two different
// patches in one stream would be read as one patch by whoever applies it,
// the kube-apiserver's document on a worker included, so they are refused.
func printPatch(s streams, cluster *ichorv1alpha1.TalosCluster, patches []rolePatch) error {
	names := make([]string, 0, len(patches))
	for _, p := range patches {
		names = append(names, string(p.role))
		if !bytes.Equal(p.data, patches[0].data) {
			return usage.Errorf("the patches of the roles %s and %s differ for %s/%s: pass --role %s or --role %s to print one, or --output-dir DIR to write one file per role",
				patches[0].role, p.role, cluster.Namespace, cluster.Name, patches[0].role, p.role)
		}
	}
	if len(patches) == 0 {
		return nil
	}
	label := "role"
	if len(names) > 1 {
		label = "roles"
	}
	fmt.Fprintf(s.rawOut, "# %s: %s; Talos %s\n%s", label, strings.Join(names, ", "), cluster.Spec.TalosVersion, patches[0].data)
	return nil
}

// writePatches writes DIR/ROLE.yaml for each role. A patch holds no secret;
// it is rendered from the cluster and replaced each time, whole: a link or a
// FIFO at its path (a shared repository's) is replaced, never written
// through (review of 2026-12-06).
func writePatches(s streams, dir string, patches []rolePatch) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, p := range patches {
		path := filepath.Join(dir, string(p.role)+".yaml")
		if err := privatefile.WriteMode(path, p.data, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(s.err, "wrote %s\n", path)
	}
	return nil
}

// readTalosCluster reads the TalosCluster from -f FILE or from the API server.
func readTalosCluster(cmd *cobra.Command, k genericclioptions.RESTClientGetter, file string, args []string) (*ichorv1alpha1.TalosCluster, error) {
	var cluster ichorv1alpha1.TalosCluster
	switch {
	case file != "" && len(args) > 0:
		return nil, usage.Errorf("give either NAME or -f FILE, not both")
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, usage.Errorf("read %s: %w", file, err)
		}
		if err := yaml.UnmarshalStrict(data, &cluster); err != nil {
			return nil, usage.Errorf("%s is not a TalosCluster manifest: %v", file, err)
		}
		if cluster.Kind != "TalosCluster" {
			return nil, usage.Errorf("%s is a %q, not a TalosCluster", file, cluster.Kind)
		}
		// The names are printed in messages: held to what the API server
		// would take, as those of one read from it are.
		if errs := apivalidation.NameIsDNSSubdomain(cluster.Name, false); cluster.Name != "" && len(errs) > 0 {
			return nil, usage.Errorf("%s: metadata.name %q: %s", file, cluster.Name, strings.Join(errs, "; "))
		}
		if errs := apivalidation.ValidateNamespaceName(cluster.Namespace, false); cluster.Namespace != "" && len(errs) > 0 {
			return nil, usage.Errorf("%s: metadata.namespace %q: %s", file, cluster.Namespace, strings.Join(errs, "; "))
		}
	case len(args) == 1:
		c, namespace, _, err := kube.Client(k)
		if err != nil {
			return nil, err
		}
		if err := c.Get(cmd.Context(), types.NamespacedName{Namespace: namespace, Name: args[0]}, &cluster); err != nil {
			return nil, fmt.Errorf("get TalosCluster %s/%s: %w", namespace, args[0], err)
		}
	default:
		return nil, usage.Errorf("give the cluster: NAME (with -n NAMESPACE) or -f FILE")
	}
	return &cluster, nil
}
