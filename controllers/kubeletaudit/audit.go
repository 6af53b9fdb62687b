// Package kubeletaudit audits the kubelet serving certificates in service:
// for every machine of a cluster with kubelet serving certificates enabled,
// it reads the certificate the kubelet presents on its port (servingcert),
// reads the node's identity of today from its Talos API, and asks the
// audit rule (ichor/kubelet_serving/audit) whether the certificate is still
// the node's. Approval is a moment; a certificate lives for a year.
//
// Auditor is the gathering and the asking, shared by `ichor audit
// kubelet-serving` and by Runner, the manager's periodic audit, which acts:
// the TalosMachine condition KubeletServingCertificateCurrent, a metric and
// an Event when a certificate drifts.
package kubeletaudit

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
)

// DefaultConcurrency bounds the machines of one cluster audited at once: a
// handshake or a Talos read that hangs costs its timeout, and no more than
// this many run side by side.
const DefaultConcurrency = 8

// Decider is what the audit asks of the policy engine.
type Decider interface {
	KubeletServingAudit(context.Context, servingcert.Audit) (engine.AuditDecision, error)
}

// Auditor gathers the facts of each machine's certificate and asks the rule.
type Auditor struct {
	// Reader reads the cluster's secrets Secret (uncached: get on that one
	// Secret is all the rights the audit needs beyond the machines').
	Reader client.Reader
	// SecretsClaims is what the secrets Secret must say of the cluster
	// before its Kubernetes CA judges certificates (clustersecrets.Claims).
	SecretsClaims clustersecrets.Claims
	// NodeReaders gives a cluster's Talos identity reader, as the approver
	// has it.
	NodeReaders *kubeletserving.NodeReaders
	Engine      Decider
	// Port is the kubelet's serving port; servingcert.DefaultPort if zero.
	Port int
	// Timeout bounds one handshake; servingcert.DefaultTimeout if zero.
	Timeout time.Duration
	// Dial opens the connection to a kubelet (servingcert.Reader.Dial).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Denied are the networks no kubelet is reached in
	// (servingcert.Reader.Denied).
	Denied netguard.Denied
	// Clock is the audit's "now"; the real clock if nil.
	Clock clock.PassiveClock
}

// Result is the audit of one machine.
type Result struct {
	Machine     types.NamespacedName
	Node        string
	Certificate Served
	// Decision is the rule's answer; when Err is set there is none (the
	// bundle is broken), which is neither current nor drift.
	Decision engine.AuditDecision
	Err      error
}

// Served is what a report says of the certificate a kubelet served: where
// it was read, and if it was, its serial and end (each bounded as read). Not
// its names or subject, which the decision has judged: a kubelet chooses
// them, up to a TLS message's quarter megabyte, and a pass holds every
// machine's result of a cluster until its last is in (review 197C F4).
type Served struct {
	Address  string
	Read     bool
	Serial   string
	NotAfter string
}

// Audit audits the machines of cluster, in their order. An error is a
// cluster-wide failure (its secrets bundle unreadable): without the
// cluster's CA no certificate can be judged, and a certificate must never
// look drifted for want of it.
func (a *Auditor) Audit(ctx context.Context, cluster *ichorv1alpha1.TalosCluster, machines []ichorv1alpha1.TalosMachine) ([]Result, error) {
	bundles, err := clustersecrets.Load(ctx, a.Reader, cluster, a.SecretsClaims)
	if err != nil {
		return nil, err
	}
	// The previous bundle's CA too, as the approver's record: during a
	// rotation the certificates it signed are still the cluster's, and
	// every machine's was said drifted (review 197C F2).
	roots, _, err := bundles.KubernetesCAs()
	if err != nil {
		return nil, fmt.Errorf("the Kubernetes CA of cluster %s/%s: %w", cluster.Namespace, cluster.Name, err)
	}
	clk := a.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	certs := &servingcert.Reader{Roots: roots, Timeout: a.Timeout, Dial: a.Dial, Clock: clk, Denied: a.Denied}
	// One identity reader for the pass: a cluster this replica does not
	// serve keeps none between reads (NodeReaders), and each machine
	// asking for its own would be a Secret read and a credential signed.
	nodes := nodeReader{}
	nodes.reader, nodes.err = a.NodeReaders.Get(ctx, cluster)
	results := make([]Result, len(machines))
	sem := make(chan struct{}, DefaultConcurrency)
	var wg sync.WaitGroup
	for i := range machines {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = a.machine(ctx, &machines[i], nodes, certs, clk)
		}()
	}
	wg.Wait()
	return results, nil
}

// nodeReader is the pass's identity reader of the cluster, or why there is
// none.
type nodeReader struct {
	reader *talosnode.Reader
	err    error
}

func (a *Auditor) machine(ctx context.Context, m *ichorv1alpha1.TalosMachine, nodes nodeReader, certs *servingcert.Reader, clk clock.PassiveClock) Result {
	node := readNode(ctx, nodes, m)
	cert := certs.Read(ctx, servingcert.Address(kubeletHost(m, node), a.port()))
	now := clk.Now()
	in := servingcert.Audit{
		Machine:     csrinput.Machine{Name: m.Name, Namespace: m.Namespace, Cluster: m.Spec.ClusterName},
		Node:        node,
		Certificate: cert,
		Now:         now.UTC().Format(time.RFC3339),
		NowUnix:     now.Unix(),
	}
	d, err := a.Engine.KubeletServingAudit(ctx, in)
	name := node.Nodename
	if name == "" {
		name = m.Status.NodeName
	}
	served := Served{Address: cert.Address, Read: cert.Read, Serial: cert.Serial, NotAfter: cert.NotAfter}
	return Result{Machine: types.NamespacedName{Namespace: m.Namespace, Name: m.Name}, Node: name, Certificate: served, Decision: d, Err: err}
}

// readNode reads today's identity; a failure is a fact for the rule, its
// text bounded as the certificate's are (a node's Talos API chooses it).
func readNode(ctx context.Context, nodes nodeReader, m *ichorv1alpha1.TalosMachine) csrinput.Node {
	if nodes.err != nil {
		return csrinput.Node{Error: servingcert.Clip(nodes.err.Error(), servingcert.MaxText), Addresses: []string{}}
	}
	id, err := nodes.reader.Read(ctx, m.Spec.Endpoint)
	if err != nil {
		return csrinput.Node{Error: servingcert.Clip(err.Error(), servingcert.MaxText), Addresses: []string{}}
	}
	return csrinput.Node{Readable: true, Nodename: id.Nodename, Hostname: id.Hostname, Addresses: id.Addresses}
}

// kubeletHost is where the kubelet is reached: the first address Talos
// gives the kubelet (what it serves on), or, when the node could not be
// read, the host of the machine's Talos endpoint, so that the certificate's
// issuer and expiry are still judged.
func kubeletHost(m *ichorv1alpha1.TalosMachine, node csrinput.Node) string {
	if len(node.Addresses) > 0 {
		return node.Addresses[0]
	}
	host, _, err := net.SplitHostPort(m.Spec.Endpoint)
	if err != nil {
		return m.Spec.Endpoint
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return addr.String()
	}
	return host
}

func (a *Auditor) port() int {
	if a.Port == 0 {
		return servingcert.DefaultPort
	}
	return a.Port
}
