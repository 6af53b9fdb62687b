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
