package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineRole is the role of a Talos machine in its cluster.
// +kubebuilder:validation:Enum=controlplane;worker
type MachineRole string

// Machine roles, spelled as Talos spells its machine types.
const (
	// MachineRoleControlPlane runs etcd and the Kubernetes control plane.
	MachineRoleControlPlane MachineRole = "controlplane"
	// MachineRoleWorker runs workloads only.
	MachineRoleWorker MachineRole = "worker"
)

// Condition types of a TalosMachine.
const (
	// ConditionKubeletServingCertificateCurrent is the periodic audit of the
	// kubelet serving certificate in service (`ichor manager
	// --kubelet-serving-audit-interval`): True when the certificate the
	// kubelet serves names only the node's identity read today from its
	// Talos API, was issued by the cluster's CA and does not expire soon;
	// False when it drifted; Unknown when it could not be judged. The
	// reason is the audit rule's first reason code (CertificateCurrent,
	// CertificateNamesNotNode, ...), the message its reasons and decision id;
	// or ReasonAuditError when the rule gave no decision.
	ConditionKubeletServingCertificateCurrent = "KubeletServingCertificateCurrent"

	// ReasonAuditError is the reason of KubeletServingCertificateCurrent,
	// Unknown, when the audit decision of the machine failed (an evaluation
	// error, a broken bundle): the message says why. The condition is never
	// left as it was, so a certificate whose audit fails does not stay
	// CertificateCurrent.
	ReasonAuditError = "AuditError"
)

// TalosMachineSpec is the desired state of a Talos machine.
type TalosMachineSpec struct {
	// ClusterName is the name of the TalosCluster, in the same namespace, the
	// machine belongs to. It cannot change: the kubelet approver trusts this
	// link to decide whose certificate requests a machine may answer for.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterName is immutable"
	// +required
	ClusterName string `json:"clusterName"`

	// Hostname is the machine's hostname; before the node has registered, it
	// is the name a kubelet serving CSR is matched against.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +required
	Hostname string `json:"hostname"`

	// Endpoint is the machine's Talos API endpoint as host:port (an IPv6
	// address in brackets), for example "10.0.0.2:50000". The node's identity
	// is read from here, not from the Kubernetes Node, which the kubelet
	// itself writes.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:Pattern=`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$`
	// +required
	Endpoint string `json:"endpoint"`

	// Role of the machine in its cluster.
	// +required
	Role MachineRole `json:"role"`
}

// KubeletServingCertificateStatus records the kubelet serving certificate
// last issued to a machine, as read from its signed CSR.
type KubeletServingCertificateStatus struct {
	// Request is the name of the CertificateSigningRequest the certificate
	// was issued for. Kubernetes does not bound a CSR's name; one longer
	// than a DNS subdomain is not recorded.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Request string `json:"request"`

	// IssuedAt is the certificate's NotBefore.
	// +required
	IssuedAt metav1.Time `json:"issuedAt"`

	// NotAfter is the certificate's expiry.
	// +required
	NotAfter metav1.Time `json:"notAfter"`
}

// TalosMachineStatus is the observed state of a Talos machine.
type TalosMachineStatus struct {
	// NodeName is the name of the machine's Kubernetes Node, as Talos reports
	// it (the Nodename resource).
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// KubeletServingCertificate is the kubelet serving certificate last
	// issued to the machine; unset until one is.
	// +optional
	KubeletServingCertificate *KubeletServingCertificateStatus `json:"kubeletServingCertificate,omitempty"`

	// ObservedGeneration is the generation of the spec the status was
	// computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions of the machine.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// The certificate expiry is a string column, not a date one: kubectl prints a
// date column as an age, and a time in the future as "<invalid>".

// TalosMachine is one machine of a TalosCluster.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=tm,categories=ichor
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Role",type=string,JSONPath=`.spec.role`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Cert NotAfter",type=string,JSONPath=`.status.kubeletServingCertificate.notAfter`,description="Expiry of the kubelet serving certificate"
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TalosMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TalosMachineSpec `json:"spec"`

	// +optional
	Status TalosMachineStatus `json:"status,omitzero"`
}

// TalosMachineList is a list of TalosMachine.
//
// +kubebuilder:object:root=true
type TalosMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TalosMachine `json:"items"`
}

func init() {
	register(&TalosMachine{}, &TalosMachineList{})
}
