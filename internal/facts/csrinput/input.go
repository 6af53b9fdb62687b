package csrinput

// KubeletServing is the whole input of the kubelet-serving rule. The caller
// fills Machine and Node; Build fills CSR.
type KubeletServing struct {
	CSR CSR `json:"csr"`
	// Machine is the managed machine whose node name is the request's; nil
	// when none is, which the rule leaves pending.
	Machine *Machine `json:"machine,omitempty"`
	// MachineCandidates is how many machines, of every cluster judging this
	// API server, answer to the request's node name. More than one is
	// ambiguous, whichever of them Machine is.
	MachineCandidates int `json:"machine_candidates"`
	// Node is the identity read from the machine's Talos API; nil when it was
	// not read (no machine), Readable=false when reading failed.
	Node *Node `json:"node,omitempty"`
	// Requests are the counts of undecided requests the flood guards read;
	// nil when the caller has none (check-csr), which counts as zero.
	Requests *Requests `json:"requests,omitempty"`
}

// Requests are counts, from the approver's cache of the API server the
// request is in, of the undecided kubelet serving requests.
type Requests struct {
	// FromRequester are the requester's (spec.username), this one included.
	FromRequester int `json:"from_requester"`
	// NewerFromRequester are the requester's kubelet serving requests, decided
	// or not, created after this one.
	NewerFromRequester int `json:"newer_from_requester"`
	// Undecided are those Ichor could approve for the clusters that judge
	// this API server (the requester is system:node:<name>, <name> is the
	// request's node name and one of their machines answers to it), each
	// requester's counted up to the rule's max_undecided_per_requester (the
	// rest it denies).
	Undecided int `json:"undecided"`
	// Unknown are every other undecided request (a node name no machine of
	// theirs has, or a requester that is not that node), counted the same way.
	Unknown int `json:"unknown"`
	// Machines are the machines of the clusters that judge this API server.
	Machines int `json:"machines"`
}

// Machine names the TalosMachine found for the request.
type Machine struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
}

// Node is the node's identity as the Talos API reports it: the NodeIP
// resource "kubelet", the Nodename and the HostnameStatus.
type Node struct {
	Readable bool   `json:"readable"`
	Error    string `json:"error"`
	Nodename string `json:"nodename"`
	Hostname string `json:"hostname"`
	// Addresses are canonical text (netip.Addr.String), as the builder writes
	// the request's IP addresses, so the rule compares strings.
	Addresses []string `json:"addresses"`
}
