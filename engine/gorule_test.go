package engine_test

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
)

// goKubeletServing is the kubelet-serving rule written by hand in Go, for the
// benchmark only: it measures what evaluating the Rego costs beside the
// cheapest faithful implementation. It follows the Rego rule check for check.
func goKubeletServing(in *csrinput.KubeletServing) engine.CSRDecision {
	const prefix = "system:node:"
	req := &in.CSR.Request
	var cns, orgs []string
	for _, a := range req.Subject {
		switch a.OID {
		case "2.5.4.3":
			cns = append(cns, a.Value)
		case "2.5.4.10":
			orgs = append(orgs, a.Value)
		}
	}
	node := ""
	if len(cns) == 1 && strings.HasPrefix(cns[0], prefix) {
		node = strings.TrimPrefix(cns[0], prefix)
	}
	verdict := func(action string, reasons []engine.Reason) engine.CSRDecision {
		slices.SortFunc(reasons, func(a, b engine.Reason) int {
			if c := strings.Compare(a.Code, b.Code); c != 0 {
				return c
			}
			return strings.Compare(a.Message, b.Message)
		})
		return engine.CSRDecision{Action: action, Reasons: reasons, Node: node}
	}

	if req.Parsed && in.Machine == nil {
		return verdict(engine.ActionPending, []engine.Reason{{Code: "MachineUnknown", Message: fmt.Sprintf("no managed machine has node name %q", node)}})
	}
	var rejected []engine.Reason
	if !req.Parsed {
		rejected = append(rejected, engine.Reason{Code: "MalformedRequest", Message: "spec.request does not parse as a certificate request: " + req.ParseError})
	} else if !req.SignatureValid {
		rejected = append(rejected, engine.Reason{Code: "InvalidSignature", Message: "the request's signature does not verify with its public key: " + req.SignatureError})
	}
	if len(rejected) > 0 {
		return verdict(engine.ActionDeny, rejected)
	}

	var pending []engine.Reason
	if in.Machine == nil {
		pending = append(pending, engine.Reason{Code: "MachineUnknown", Message: fmt.Sprintf("no managed machine has node name %q", node)})
	} else if in.Node == nil || !in.Node.Readable {
		pending = append(pending, engine.Reason{Code: "NodeUnreadable", Message: fmt.Sprintf("the identity of node %q could not be read", node)})
	}
	if in.Node != nil && in.Node.Readable && in.Node.Nodename != node {
		pending = append(pending, engine.Reason{Code: "NodenameMismatch", Message: fmt.Sprintf("Talos reports Nodename %q", in.Node.Nodename)})
	}
	if len(pending) > 0 {
		return verdict(engine.ActionPending, pending)
	}

	var deny []engine.Reason
	if in.CSR.Username != prefix+node {
		deny = append(deny, engine.Reason{Code: "UsernameMismatch", Message: fmt.Sprintf("requested by %q, not by %q", in.CSR.Username, prefix+node)})
	}
	if !slices.Contains(in.CSR.Groups, "system:nodes") {
		deny = append(deny, engine.Reason{Code: "GroupMissing", Message: fmt.Sprintf("the requester's groups %v do not include system:nodes", in.CSR.Groups)})
	}
	if len(req.Subject) != 2 || node == "" || len(orgs) != 1 || orgs[0] != "system:nodes" {
		deny = append(deny, engine.Reason{Code: "SubjectMismatch", Message: "the subject is not exactly CN=system:node:<name>, O=system:nodes"})
	}
	if len(req.SubjectAltNames) == 0 {
		deny = append(deny, engine.Reason{Code: "SANMissing", Message: "the request has no subject alternative name"})
	}
	for _, san := range req.SubjectAltNames {
		switch san.Type {
		case "dns":
			if san.Value == "" || (san.Value != in.Node.Nodename && san.Value != in.Node.Hostname) {
				deny = append(deny, engine.Reason{Code: "DNSNameNotNode", Message: fmt.Sprintf("DNS name %q is not the node's", san.Value)})
			}
		case "ip":
			if !slices.Contains(in.Node.Addresses, san.Value) {
				deny = append(deny, engine.Reason{Code: "IPNotNode", Message: fmt.Sprintf("IP address %s is not one of the node's addresses %v", san.Value, in.Node.Addresses)})
			}
		default:
			deny = append(deny, engine.Reason{Code: "SANTypeForbidden", Message: fmt.Sprintf("subject alternative name %q of type %s is not allowed", san.Value, san.Type)})
		}
	}
	usages := slices.Clone(in.CSR.Usages)
	slices.Sort(usages)
	if !slices.Equal(usages, []string{"digital signature", "server auth"}) &&
		!slices.Equal(usages, []string{"digital signature", "key encipherment", "server auth"}) {
		deny = append(deny, engine.Reason{Code: "UsagesNotAllowed", Message: fmt.Sprintf("usages %v are not allowed", in.CSR.Usages)})
	}
	for _, ext := range req.Extensions {
		if ext.OID != "2.5.29.17" {
			deny = append(deny, engine.Reason{Code: "ExtensionForbidden", Message: fmt.Sprintf("requested extension %s is not allowed", ext.OID)})
		}
	}
	if in.CSR.ExpirationSeconds != nil && *in.CSR.ExpirationSeconds > 31536000 {
		deny = append(deny, engine.Reason{Code: "ExpirationTooLong", Message: fmt.Sprintf("expirationSeconds %d exceeds the cap", *in.CSR.ExpirationSeconds)})
	}
	if len(deny) > 0 {
		return verdict(engine.ActionDeny, deny)
	}
	return verdict(engine.ActionApprove, engine.Reasons{{Code: "IchorKubeletServing", Message: fmt.Sprintf("kubelet serving certificate for node %q matches", node)}})
}
