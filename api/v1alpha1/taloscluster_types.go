package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultSecretsBundleKey is the key of the Secret named by
// TalosClusterSpec.SecretsRef that holds the secrets bundle when the
// reference names no key. It is the file name `talosctl gen secrets` writes,
// so `kubectl create secret generic NAME --from-file=secrets.yaml` just works.
const DefaultSecretsBundleKey = "secrets.yaml"

// SecretsClaimAnnotation is the annotation of a Secret a TalosCluster's
// secretsRef or kubeconfigRef names that says which TalosClusters of its
// namespace may use it: their names, separated by commas, or "*" for every
// one. Whoever may write the Secret chooses which clusters its CAs sign for
// and whose API server its kubeconfig reaches: whoever may write a
// TalosCluster but not the Secret cannot point a cluster granted to them at
// another cluster's CAs or API server (docs/hardening.md).
const SecretsClaimAnnotation = "ichor.dev/talos-clusters" //nolint:gosec // G101: an annotation's name, not a secret

// DefaultKubeconfigKey is the key of the Secret named by
// TalosClusterSpec.KubeconfigRef that holds the kubeconfig when the reference
// names no key.
const DefaultKubeconfigKey = "kubeconfig"

// TalosVersionPattern is the pattern of TalosClusterSpec.TalosVersion: a
// Talos version contract is a major and minor version, never a patch
// release. Keep it equal to the Pattern marker on the field (a test checks
// the generated CRD).
const TalosVersionPattern = `^v[0-9]+\.[0-9]+$`

// Condition types of a TalosCluster (ADR 0125).
const (
	// ConditionKubeletServingCertificates is True when every machine of the
	// cluster has an unexpired kubelet serving certificate recorded, False
	// (naming the machines still waiting) otherwise, and absent while
	// spec.security.kubeletServingCertificates.enabled is off. Its name is
	// deliberately not a health word: a rollout in progress is not a fault.
	ConditionKubeletServingCertificates = "KubeletServingCertificates"

	// ConditionKubeletServingVerified is True once verifyFromAPIServer is set
	// and ConditionKubeletServingCertificates has been True. It is a latch: a
	// machine joining later does not clear it, because clearing it would take
	// --kubelet-certificate-authority away and restart every kube-apiserver
	// each time a node is added. It is removed when either option is switched
	// off. The kube-apiserver flag is rendered only while it is True.
	ConditionKubeletServingVerified = "KubeletServingVerified"

	// ConditionKubeletServingRequests is False while the rule withholds
	// approvals because the API server holds more undecided kubelet serving
	// requests than its machines explain (the flood guard, reason
	// TooManyPendingRequests), True otherwise; absent while kubelet serving
	// certificates are off. A person decides: the requests of a flood are
	// deleted or denied, and approvals resume.
	ConditionKubeletServingRequests = "KubeletServingRequests"

	// ConditionServedBy names, while the manager's replicas share the
	// clusters out (--shards), the replica that serves the cluster and the
	// shard it holds the cluster through; absent when sharding is off. The
	// replica that takes the shard over writes it; the shard's Lease
	// (ichor-policy-shard-<shards>-<shard> in the manager's namespace) is what decides.
	ConditionServedBy = "ServedBy"

	// A TalosCluster has ConditionReady too, which says whether Ichor
	// serves it as configured, not how far its nodes are; see
	// ConditionReady.
)

// Condition reasons of a TalosCluster.
const (
	// ReasonAllMachinesIssued is the reason of a True
	// ConditionKubeletServingCertificates: every machine has an unexpired
	// serving certificate.
	ReasonAllMachinesIssued = "AllMachinesIssued"

	// ReasonMachinesPending is the reason of a False
	// ConditionKubeletServingCertificates: at least one machine has no
	// unexpired serving certificate yet, and the message names them.
	ReasonMachinesPending = "MachinesPending"

	// ReasonVerificationLatched is the reason of a True
	// ConditionKubeletServingVerified: every machine had been issued a
	// certificate when verification was requested, so the kube-apiserver
	// verifies the kubelets from now on.
	ReasonVerificationLatched = "VerificationLatched"

	// ReasonAwaitingCertificates is the reason of a False
	// ConditionKubeletServingVerified: verification is requested but not every
	// machine has a certificate yet, so the flag is not rendered.
	ReasonAwaitingCertificates = "AwaitingCertificates"

	// ReasonRequestsWithinBounds is the reason of a True
	// ConditionKubeletServingRequests.
	ReasonRequestsWithinBounds = "RequestsWithinBounds"

	// ReasonTooManyPendingRequests is the reason of a False
	// ConditionKubeletServingRequests, the rule's reason code of the
	// requests it withholds.
	ReasonTooManyPendingRequests = "TooManyPendingRequests"

	// ReasonServing is the reason of a True ConditionReady of a TalosCluster
	// while kubelet serving certificates are on: the spec is accepted and
	// the cluster's requests are decided, whatever the nodes' progress.
	ReasonServing = "Serving"

	// ReasonTalosAPIUnreachable is the reason of a False ConditionReady of a
	// TalosCluster: every machine whose identity Ichor read in the last
	// minutes failed to answer over the Talos API (or the cluster's Talos
	// credentials could not be made), so no request can be judged.
	ReasonTalosAPIUnreachable = "TalosAPIUnreachable"

	// ReasonSecretsUnusable is the reason of a False
	// ConditionKubeletServingCertificates, and so of a False ConditionReady:
	// the cluster's secrets bundle (spec.secretsRef) is gone, does not name
	// the cluster, holds no usable OS CA, or may not be read by the manager,
	// so no node's identity can be read and nothing is approved; or its
	// Kubernetes CA is no certificate, so no issued certificate is recorded.
	ReasonSecretsUnusable = "SecretsUnusable"

	// ReasonShardHeld is the reason of a True ConditionServedBy: the replica
	// named holds the cluster's shard.
	ReasonShardHeld = "ShardHeld"

	// ReasonKubeletServingOff is the reason of a True ConditionReady of a
	// TalosCluster while kubelet serving certificates are off: nothing is to
	// be approved.
	ReasonKubeletServingOff = "KubeletServingOff"

	// ReasonDeleting is the reason of a True ConditionReady of a
	// TalosCluster being deleted (another controller's finalizer holds it):
	// nothing is approved for it any more.
	ReasonDeleting = "Deleting"
)

// TalosClusterSpec is the desired state of a Talos cluster.
type TalosClusterSpec struct {
	// TalosVersion is the Talos version contract the cluster's machine
	// configuration is rendered for, as vMAJOR.MINOR (for example "v1.14").
	// It chooses the shape of rendered configuration: from v1.14 on the
	// Kubernetes components are configured by their own documents
	// (KubeletConfig, KubeAPIServerConfig), before it by the v1alpha1
	// machine and cluster sections.
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+$`
	// +kubebuilder:validation:MaxLength=16
	// +required
	TalosVersion string `json:"talosVersion"`

	// SecretsRef names the Secret, in the TalosCluster's namespace, holding
	// the cluster's Talos secrets bundle in the format `talosctl gen secrets`
	// writes (the CAs and keys every credential is signed with). The Secret
	// must name this cluster in its annotation ichor.dev/talos-clusters
	// (names separated by commas, or "*" for every cluster of the namespace).
	// +required
	SecretsRef SecretsBundleReference `json:"secretsRef"`

	// KubeconfigRef names a Secret, in the TalosCluster's namespace, holding a
	// kubeconfig for the cluster whose kubelet CSRs are judged. Unset: the
	// cluster the controller itself runs in. The Secret must name this
	// cluster in its annotation ichor.dev/talos-clusters, as the secretsRef
	// Secret does.
	// +optional
	KubeconfigRef *KubeconfigReference `json:"kubeconfigRef,omitempty"`

	// Security holds the opt-in hardening options of ADR 0108 and later; every
	// one is off by default, for new and existing clusters alike.
	// +optional
	Security ClusterSecurity `json:"security,omitzero"`
}

// SecretsBundleReference names a key of a Secret in the referrer's namespace
// holding a Talos secrets bundle. Cross-namespace references are not offered
// so that who may read the CA keys stays a question of that one namespace's
// RBAC.
type SecretsBundleReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`

	// Key of the Secret's data holding the bundle.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:default="secrets.yaml"
	// +optional
	Key string `json:"key,omitempty"`
}

// KubeconfigReference names a key of a Secret in the referrer's namespace
// holding a kubeconfig.
type KubeconfigReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`

	// Key of the Secret's data holding the kubeconfig.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:default="kubeconfig"
	// +optional
	Key string `json:"key,omitempty"`
}

// ClusterSecurity groups the cluster's security options.
type ClusterSecurity struct {
	// KubeletServingCertificates makes the kubelets serve CA-signed
	// certificates approved by Ichor (ADR 0125).
	// +optional
	KubeletServingCertificates KubeletServingCertificates `json:"kubeletServingCertificates,omitzero"`
}

// KubeletServingCertificates configures kubelet serving certificates
// (ADR 0125). Both options are off unless set.
type KubeletServingCertificates struct {
	// Enabled makes every kubelet request its serving certificate from the
	// kubernetes.io/kubelet-serving signer (serverTLSBootstrap) and Ichor's
	// controller approve the requests that name exactly the node's identity as
	// read over the Talos API.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// VerifyFromAPIServer also makes the kube-apiserver verify the kubelets
	// against the Kubernetes CA (--kubelet-certificate-authority). It takes
	// effect only with Enabled, and only once every machine has been issued a
	// certificate (condition KubeletServingVerified); from then on it stays
	// on until switched off. It restarts the kube-apiserver on each control
	// plane when it takes effect.
	// +optional
	VerifyFromAPIServer bool `json:"verifyFromAPIServer,omitempty"`
}

// TalosClusterStatus is the observed state of a Talos cluster.
type TalosClusterStatus struct {
	// ObservedGeneration is the generation of the spec the conditions were
	// computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions of the cluster; see the Condition* constants.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// TalosCluster is a Talos Linux cluster managed by Ichor.
//
// It is namespaced, like Ichor's other resources, because it references
// Secrets (the secrets bundle with every CA key, a kubeconfig) that must live
// beside it: a namespace is then the unit of delegation, and granting someone
// a cluster never needs a cluster-wide right on Secrets.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=tcl,categories=ichor
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Ichor serves the cluster as its spec asks (not whether every node has its certificate: see Issued)"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1,description="Why the cluster is or is not ready"
// +kubebuilder:printcolumn:name="Talos",type=string,JSONPath=`.spec.talosVersion`
// +kubebuilder:printcolumn:name="Serving",type=boolean,JSONPath=`.spec.security.kubeletServingCertificates.enabled`,description="Kubelet serving certificates enabled"
// +kubebuilder:printcolumn:name="Issued",type=string,JSONPath=`.status.conditions[?(@.type=="KubeletServingCertificates")].status`,description="Every machine has a kubelet serving certificate"
// +kubebuilder:printcolumn:name="Verified",type=string,JSONPath=`.status.conditions[?(@.type=="KubeletServingVerified")].status`,description="The kube-apiserver verifies kubelets against the cluster CA"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TalosCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TalosClusterSpec `json:"spec"`

	// +optional
	Status TalosClusterStatus `json:"status,omitzero"`
}

// TalosClusterList is a list of TalosCluster.
//
// +kubebuilder:object:root=true
type TalosClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TalosCluster `json:"items"`
}

func init() {
	register(&TalosCluster{}, &TalosClusterList{})
}
