package render

import (
	"errors"
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/types/meta"
	talosv1alpha1 "github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// KubeletServerTLSBootstrapField is the kubelet configuration-file field
// (KubeletConfiguration.serverTLSBootstrap) that makes the kubelet request its
// serving certificate from the kubernetes.io/kubelet-serving signer. It is
// not among machinery's kubelet.ProtectedConfigurationFields, so Talos
// accepts it in KubeletConfig.config and machine.kubelet.extraConfig. The
// deprecated rotate-server-certificates flag is never rendered (ADR 0125).
const KubeletServerTLSBootstrapField = "serverTLSBootstrap"

// KubeletCertificateAuthorityArg is the kube-apiserver flag, without the
// leading dashes, that makes it verify kubelet serving certificates.
const KubeletCertificateAuthorityArg = "kubelet-certificate-authority"

// KubeletCertificateAuthorityPath is the CA file the kube-apiserver verifies
// kubelets against: the Kubernetes CA certificate Talos writes for the
// kube-apiserver, the same file Talos gives kube-controller-manager as
// --cluster-signing-cert-file, so the serving certificates are signed and
// verified with one CA.
const KubeletCertificateAuthorityPath = constants.KubernetesAPIServerSecretsDir + "/ca.crt"

// KubeletServing renders spec.security.kubeletServingCertificates of cluster
// (ADR 0125):
//
//   - enabled: every machine gets serverTLSBootstrap: true in the kubelet's
//     configuration file: the standalone KubeletConfig document's config from
//     contract v1.14 on, machine.kubelet.extraConfig before it.
//   - verifyFromAPIServer: control-plane machines also get the kube-apiserver
//     flag --kubelet-certificate-authority (KubeAPIServerConfig.extraArgs
//     from v1.14 on, cluster.apiServer.extraArgs before it), but only while
//     the cluster's KubeletServingVerified condition is True. Rendering it
//     earlier would break logs and exec for every node whose kubelet has no
//     CA-signed certificate yet; the controller latches the condition once
//     every machine has one.
//
// With enabled unset the patch is empty (Patch.Empty): the option renders
// nothing at all, so a cluster that does not opt in keeps its configuration
// byte for byte. An unparseable spec.talosVersion is refused with an error
// wrapping ErrInvalidTalosVersion, even when the option is unset, so a bad
// contract is reported where it is first read.
func KubeletServing(cluster *ichorv1alpha1.TalosCluster) (Patch, error) {
	if cluster == nil {
		return Patch{}, errors.New("rendering kubelet serving certificates: no TalosCluster")
	}

	contract, err := parseContract(cluster.Spec.TalosVersion)
	if err != nil {
		return Patch{}, fmt.Errorf("rendering kubelet serving certificates for TalosCluster %s/%s: %w",
			cluster.Namespace, cluster.Name, err)
	}

	opts := cluster.Spec.Security.KubeletServingCertificates
	if !opts.Enabled {
		return Patch{contract: contract}, nil
	}

	// The latch is the condition, not the spec: verifyFromAPIServer alone
	// says "when it is safe", the condition says "it is safe now".
	verify := opts.VerifyFromAPIServer &&
		apimeta.IsStatusConditionTrue(cluster.Status.Conditions, ichorv1alpha1.ConditionKubeletServingVerified)

	multidoc := contract.MultidocKubernetesConfigSupported()

	patch, err := newPatch(contract, func(role ichorv1alpha1.MachineRole) []config.Document {
		apiServer := verify && role == ichorv1alpha1.MachineRoleControlPlane

		if multidoc {
			return kubeletServingDocuments(apiServer)
		}

		return []config.Document{kubeletServingV1Alpha1(apiServer)}
	})
	if err != nil {
		return Patch{}, fmt.Errorf("rendering kubelet serving certificates for TalosCluster %s/%s (contract %s): %w",
			cluster.Namespace, cluster.Name, contract, err)
	}

	return patch, nil
}

// kubeletServingDocuments is the v1.14-and-later form: standalone documents.
// Only the fields set here are merged: machinery's strategic merge skips
// empty values, so the empty image fields leave the configured images alone.
func kubeletServingDocuments(apiServer bool) []config.Document {
	kubelet := k8s.NewKubeletConfigV1Alpha1()
	kubelet.KubeletConfig = meta.Unstructured{
		Object: map[string]any{KubeletServerTLSBootstrapField: true},
	}

	docs := []config.Document{kubelet}

	if apiServer {
		kubeAPIServer := k8s.NewKubeAPIServerConfigV1Alpha1()
		kubeAPIServer.PodArgs = meta.Args{
			KubeletCertificateAuthorityArg: meta.NewArgValue(KubeletCertificateAuthorityPath, nil),
		}

		docs = append(docs, kubeAPIServer)
	}

	return docs
}

// kubeletServingV1Alpha1 is the pre-v1.14 form: the legacy machine
// configuration document with only the kubelet (and, on a control plane, the
// kube-apiserver) section set. machinery marks these sections deprecated in
// favour of the standalone documents, which a pre-v1.14 configuration does
// not have, hence the staticcheck exemptions.
func kubeletServingV1Alpha1(apiServer bool) *talosv1alpha1.Config {
	cfg := &talosv1alpha1.Config{
		ConfigVersion: talosv1alpha1.Version,
		MachineConfig: &talosv1alpha1.MachineConfig{
			//lint:ignore SA1019 the pre-v1.14 contract has no KubeletConfig document
			MachineKubelet: &talosv1alpha1.KubeletConfig{ //nolint:staticcheck // SA1019: the pre-v1.14 contract
				//lint:ignore SA1019 the pre-v1.14 contract has no KubeletConfig document
				KubeletExtraConfig: meta.Unstructured{ //nolint:staticcheck // SA1019: the pre-v1.14 contract
					Object: map[string]any{KubeletServerTLSBootstrapField: true},
				},
			},
		},
	}

	if apiServer {
		cfg.ClusterConfig = &talosv1alpha1.ClusterConfig{
			//lint:ignore SA1019 the pre-v1.14 contract has no KubeAPIServerConfig document
			APIServerConfig: &talosv1alpha1.APIServerConfig{ //nolint:staticcheck // SA1019: the pre-v1.14 contract
				ExtraArgsConfig: meta.Args{
					KubeletCertificateAuthorityArg: meta.NewArgValue(KubeletCertificateAuthorityPath, nil),
				},
			},
		}
	}

	return cfg
}
