package csrinput

// KubeletClient is the whole input of the kubelet-client rule
// (policy/ichor/kubelet_client). Build fills CSR; the caller fills
// Authorization with the SubjectAccessReviews it made as the requester, and
// Machine when a managed machine has the request's node name.
type KubeletClient struct {
	CSR           CSR                  `json:"csr"`
	Authorization KubeletAuthorization `json:"authorization"`
	// Machine is the managed machine whose node name is the request's; nil
	// when none is. The rule looks at it only when its data requires a
	// managed machine.
	Machine *Machine `json:"machine,omitempty"`
}

// KubeletAuthorization holds the two SubjectAccessReviews kube-controller-
// manager's approver makes for a kubelet client request, both made as the
// requester (spec.username, uid, groups and extra): "create
// certificatesigningrequests/selfnodeclient" and "create
// certificatesigningrequests/nodeclient" in certificates.k8s.io.
type KubeletAuthorization struct {
	SelfNodeClient AccessReview `json:"selfnodeclient"`
	NodeClient     AccessReview `json:"nodeclient"`
}

// AccessReview is one SubjectAccessReview: what was asked (the requester is
// the CSR's, so it is not repeated, and neither is extra, which the decision
// log masks under csr) and the authorizer's answer as it gave it.
type AccessReview struct {
	Verb        string `json:"verb"`
	Group       string `json:"group"`
	Version     string `json:"version"`
	Resource    string `json:"resource"`
	Subresource string `json:"subresource"`

	Allowed bool `json:"allowed"`
	// Denied is the authorizer's explicit denial; false with Allowed false
	// means no authorizer had an opinion.
	Denied          bool   `json:"denied"`
	Reason          string `json:"reason"`
	EvaluationError string `json:"evaluation_error"`
}
