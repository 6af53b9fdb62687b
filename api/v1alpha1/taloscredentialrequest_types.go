package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CredentialPurpose says what a requested credential is for; the purpose, not
// the requester, fixes the credential's roles and its lifetime cap.
//
// The set is append-only: a value once released is never renamed or removed,
// because stored requests and the policies that judge them name it. Add new
// values at the end of the Enum marker and of CredentialPurposes.
//
// +kubebuilder:validation:Enum=talosconfig-reader;node-reader;support-bundle;etcd-snapshot;packet-capture;credentials-talos;kubeconfig-admin;kubeconfig-super-admin
type CredentialPurpose string

// Credential purposes.
const (
	// PurposeTalosconfigReader is an os:reader talosconfig for a person
	// (ADR 0124): default lifetime 1 hour, cap 12 hours.
	PurposeTalosconfigReader CredentialPurpose = "talosconfig-reader"
	// PurposeNodeReader is Ichor's own short identity to read one node.
	PurposeNodeReader CredentialPurpose = "node-reader"
	// PurposeSupportBundle is Ichor's own short identity to collect a support
	// bundle.
	PurposeSupportBundle CredentialPurpose = "support-bundle"
	// PurposeEtcdSnapshot is Ichor's own short identity to take an etcd
	// snapshot.
	PurposeEtcdSnapshot CredentialPurpose = "etcd-snapshot"
	// PurposePacketCapture is Ichor's own short identity to run one packet
	// capture.
	PurposePacketCapture CredentialPurpose = "packet-capture"
	// PurposeCredentialsTalos is the talosconfig of the CA-rotation hand-off.
	PurposeCredentialsTalos CredentialPurpose = "credentials-talos"
	// PurposeKubeconfigAdmin is a cluster-admin kubeconfig.
	PurposeKubeconfigAdmin CredentialPurpose = "kubeconfig-admin"
	// PurposeKubeconfigSuperAdmin is a kubeconfig in the system:masters group,
	// which no RBAC rule can restrict.
	PurposeKubeconfigSuperAdmin CredentialPurpose = "kubeconfig-super-admin"
)

// CredentialPurposes returns every purpose, in the order they were added.
func CredentialPurposes() []CredentialPurpose {
	return []CredentialPurpose{
		PurposeTalosconfigReader,
		PurposeNodeReader,
		PurposeSupportBundle,
		PurposeEtcdSnapshot,
		PurposePacketCapture,
		PurposeCredentialsTalos,
		PurposeKubeconfigAdmin,
		PurposeKubeconfigSuperAdmin,
	}
}

// Condition types of a TalosCredentialRequest, and of a TalosCluster.
const (
	// ConditionReady of a TalosCredentialRequest is True once the
	// certificate is issued, and False with the reason when the request was
	// refused; a refused request is not retried, ask again with a new
	// request.
	//
	// ConditionReady of a TalosCluster says whether Ichor serves the
	// cluster as its spec asks, for whatever reads one condition (kubectl
	// wait, kstatus, and with it Flux's and Argo CD's health checks): True
	// once the spec of its observedGeneration is accepted (reason
	// ReasonServing; ReasonKubeletServingOff while kubelet serving
	// certificates are off, ReasonDeleting once it is being deleted),
	// False when the configuration is refused, with the reason and message
	// of the refusal (a kubeconfigRef that cannot be read, a local cluster
	// the operator did not name), or when none of the
	// machines Ichor had to read answers over the Talos API
	// (ReasonTalosAPIUnreachable). It does not follow
	// the nodes: a node joining, pending or denied, and a flood withheld, are
	// ConditionKubeletServingCertificates and
	// ConditionKubeletServingRequests, which any node can move.
	ConditionReady = "Ready"
)

// Condition reasons of a TalosCredentialRequest.
const (
	// ReasonIssued is the reason of a True ConditionReady.
	ReasonIssued = "Issued"
	// ReasonRefused is the reason of a False ConditionReady: the request
	// breaks a rule (for example a lifetime above the purpose's cap); the
	// message names the rule.
	ReasonRefused = "Refused"
	// ReasonFailed is the reason of a False ConditionReady when what the
	// policy allowed could not be carried out (a binding that cannot be
	// made, a certificate that cannot be signed); a cluster or secrets
	// bundle that is missing or unusable is a refusal (ClusterNotFound,
	// SecretsUnusable).
	ReasonFailed = "Failed"
)

// TalosCredentialRequestSpec is what a requester asks for. It is immutable:
// admission judged exactly this content, and what was judged is what is
// signed.
type TalosCredentialRequestSpec struct {
	// ClusterName is the name of the TalosCluster, in the same namespace, the
	// credential is for: a TalosCluster's name, a DNS subdomain.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +required
	ClusterName string `json:"clusterName"`

	// Purpose of the credential; it fixes the roles and the lifetime cap.
	// +required
	Purpose CredentialPurpose `json:"purpose"`

	// TTL is the requested lifetime. Unset: the purpose's default. A TTL
	// above the purpose's cap is refused, at admission and again by the
	// controller, never shortened.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="ttl must be positive"
	// +optional
	TTL *metav1.Duration `json:"ttl,omitempty"`

	// PublicKey is the PEM-encoded public key ("PUBLIC KEY", PKIX) the
	// certificate is issued for. The private key never leaves the requester,
	// so neither the API server nor the controller ever holds it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16384
	// +kubebuilder:validation:XValidation:rule="self.startsWith('-----BEGIN PUBLIC KEY-----')",message="publicKey must be a PEM PUBLIC KEY block"
	// +required
	PublicKey string `json:"publicKey"`

	// Requester is who asks, exactly as the API server authenticates them:
	// `ichor cluster` fills it in from a SelfSubjectReview. It is a claim the
	// requester writes, pinned to the creating request's user by the
	// ValidatingAdmissionPolicy ichor-credential-requester (deploy/admission),
	// which the API server evaluates itself, and checked again by the
	// admission webhook; the issuer makes its SubjectAccessReview as this
	// user right before it signs.
	// +required
	Requester Requester `json:"requester"`
}

// Requester is a user as the API server authenticated them: the fields of
// authentication.k8s.io/v1 UserInfo.
type Requester struct {
	// Username is the user's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +required
	Username string `json:"username"`
	// UID is the user's unique identifier, when the authenticator gives one.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	UID string `json:"uid,omitempty"`
	// Groups are the user's groups.
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Groups []string `json:"groups,omitempty"`
	// Extra holds the authenticator's additional attributes.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Extra map[string][]string `json:"extra,omitempty"`
}

// TalosCredentialRequestStatus is the controller's answer.
type TalosCredentialRequestStatus struct {
	// Certificate is the issued PEM-encoded certificate for spec.publicKey.
	// +optional
	Certificate string `json:"certificate,omitempty"`

	// TrustBundle holds the PEM-encoded CA certificates that verify the
	// server the credential is used against; during a CA rotation both the
	// old and the new CA, so a credential issued in the cut-over keeps
	// working.
	// +optional
	TrustBundle string `json:"trustBundle,omitempty"`

	// ExpiresAt is the certificate's NotAfter.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// ObservedGeneration is the generation of the spec the status answers.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions of the request; see ConditionReady.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Expires is a string column, not a date one: kubectl prints a date column as
// an age, and a time in the future as "<invalid>".

// TalosCredentialRequest asks the controller to sign a short-lived
// certificate for a key the requester keeps.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=tcr,categories=ichor
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Purpose",type=string,JSONPath=`.spec.purpose`
// +kubebuilder:printcolumn:name="TTL",type=string,JSONPath=`.spec.ttl`
// +kubebuilder:printcolumn:name="Requester",type=string,JSONPath=`.spec.requester.username`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.expiresAt`,priority=1,description="Expiry of the issued certificate"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TalosCredentialRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
	// +required
	Spec TalosCredentialRequestSpec `json:"spec"`

	// +optional
	Status TalosCredentialRequestStatus `json:"status,omitzero"`
}

// TalosCredentialRequestList is a list of TalosCredentialRequest.
//
// +kubebuilder:object:root=true
type TalosCredentialRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TalosCredentialRequest `json:"items"`
}

func init() {
	register(&TalosCredentialRequest{}, &TalosCredentialRequestList{})
}
