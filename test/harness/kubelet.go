package harness

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/retry"
)

// KubeletOptions describes a simulated kubelet. The defaults are what a
// kubelet with serverTLSBootstrap does; every other field exists to make the
// kubelet misbehave the way a test needs.
type KubeletOptions struct {
	// NodeName is the kubelet's node name. Required.
	NodeName string

	// DNSNames and IPs are the addresses the kubelet asks for, in the kubelet
	// from its Node's status addresses. As in the kubelet, no serving CSR is
	// made while there is no IP (see AllowDNSOnly); SetAddresses changes them.
	DNSNames []string
	IPs      []net.IP

	// AllowDNSOnly requests with DNS names alone, as the kubelet does under
	// the AllowDNSOnlyNodeCSR feature gate (off by default).
	AllowDNSOnly bool

	// SignerName is kubernetes.io/kubelet-serving if empty. With
	// kubernetes.io/kube-apiserver-client-kubelet the kubelet requests its
	// client certificate instead, as NewKubeletClientCertificateManager does:
	// no SANs, client usages.
	SignerName string

	// Usages replace the kubelet's (certificate.DefaultKubeletServingGetUsages
	// or DefaultKubeletClientGetUsages, which add key encipherment for an RSA
	// key only).
	Usages []certificatesv1.KeyUsage

	// GenerateKey makes each new key; ECDSA P-256 if nil, as in the kubelet.
	// The certificate manager accepts ECDSA and RSA keys only.
	GenerateKey func() (crypto.Signer, error)

	// RequestedLifetime sets spec.expirationSeconds; zero leaves it unset, as
	// the kubelet does.
	RequestedLifetime time.Duration

	// Username and Groups are who the kubelet authenticates as (a requester
	// other than the node, say): system:node:NodeName if Username is empty,
	// system:nodes if Groups is nil. The CSR's subject stays the node's.
	Username string
	Groups   []string
}

// Kubelet is the certificate side of a kubelet: k8s.io/client-go's certificate
// manager, configured as the kubelet's NewKubeletServerCertificateManager
// configures it, with a file store in a temporary directory, authenticated as
// the node. It requests a certificate at once and again whenever the one it
// holds no longer covers its addresses or nears expiry.
type Kubelet struct {
	// Name is the node name.
	Name string

	env     *Env
	opts    KubeletOptions
	cfg     *rest.Config
	client  kubernetes.Interface
	manager certificate.Manager
	dir     string
	serving *servingListener

	stopWithCtx func() bool

	mu       sync.Mutex
	dnsNames []string
	ips      []net.IP

	stopOnce sync.Once
}

// StartKubelet starts a kubelet's certificate manager. It runs until ctx is
// done, Stop, or Env.Stop.
func (e *Env) StartKubelet(ctx context.Context, opts KubeletOptions) (*Kubelet, error) {
	if opts.NodeName == "" {
		return nil, errors.New("harness: KubeletOptions.NodeName is required")
	}

	if opts.SignerName == "" {
		opts.SignerName = certificatesv1.KubeletServingSignerName
	}

	username := opts.Username
	if username == "" {
		username = "system:node:" + opts.NodeName
	}

	groups := opts.Groups
	if groups == nil {
		groups = []string{NodesGroup}
	}

	cfg, err := e.UserConfig(username, groups...)
	if err != nil {
		return nil, err
	}

	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: clientset: %w", opts.NodeName, err)
	}

	dir, err := os.MkdirTemp(e.WorkDir, "kubelet-"+opts.NodeName+"-")
	if err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: certificate directory: %w", opts.NodeName, err)
	}

	k := &Kubelet{
		Name:   opts.NodeName,
		env:    e,
		opts:   opts,
		cfg:    cfg,
		client: clientset,
		dir:    dir,
	}
	k.dnsNames, k.ips = normalizeAddresses(opts.DNSNames, opts.IPs)

	// The listener is up before the manager starts, so that stopping the
	// manager (Stop, or ctx done) always finds it to close.
	if k.serving, err = newServingListener(k.Current); err != nil {
		os.RemoveAll(dir) //nolint:errcheck // best effort; the work directory goes with the Env

		return nil, fmt.Errorf("harness: kubelet %s: %w", opts.NodeName, err)
	}

	if err = k.start(ctx); err != nil {
		k.serving.close()
		os.RemoveAll(dir) //nolint:errcheck // best effort; the work directory goes with the Env

		return nil, fmt.Errorf("harness: kubelet %s: %w", opts.NodeName, err)
	}

	if err = e.track(func() { e.kubelets = append(e.kubelets, k) }); err != nil {
		k.Stop()

		return nil, err
	}

	return k, nil
}

// start mirrors NewKubeletServerCertificateManager (and, for the client
// signer, NewKubeletClientCertificateManager) without the kubelet's metrics.
func (k *Kubelet) start(ctx context.Context) error {
	pairName := "kubelet-server"
	getUsages := certificate.DefaultKubeletServingGetUsages

	if k.opts.SignerName == certificatesv1.KubeAPIServerClientKubeletSignerName {
		pairName = "kubelet-client"
		getUsages = certificate.DefaultKubeletClientGetUsages
	}

	if k.opts.Usages != nil {
		usages := slices.Clone(k.opts.Usages)
		getUsages = func(any) []certificatesv1.KeyUsage { return usages }
	}

	store, err := certificate.NewFileStore(pairName, k.dir, k.dir, "", "")
	if err != nil {
		return fmt.Errorf("certificate store: %w", err)
	}

	var lifetime *time.Duration
	if k.opts.RequestedLifetime != 0 {
		lifetime = &k.opts.RequestedLifetime
	}

	manager, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kubernetes.Interface, error) {
			return k.client, nil
		},
		GetTemplate:                  k.template,
		SignerName:                   k.opts.SignerName,
		RequestedCertificateLifetime: lifetime,
		GetUsages:                    getUsages,
		CertificateStore:             store,
		GenerateKey:                  k.opts.GenerateKey,
		Name:                         pairName + "/" + k.Name,
	})
	if err != nil {
		return fmt.Errorf("certificate manager: %w", err)
	}

	k.manager = manager
	manager.Start()
	k.stopWithCtx = context.AfterFunc(ctx, k.stopManager)

	return nil
}

// template is the kubelet's newGetTemplateFn over the harness's addresses:
// nil (no request) without an IP unless AllowDNSOnly; the client certificate
// has no SANs.
func (k *Kubelet) template() *x509.CertificateRequest {
	subject := pkix.Name{
		CommonName:   "system:node:" + k.Name,
		Organization: []string{NodesGroup},
	}

	if k.opts.SignerName == certificatesv1.KubeAPIServerClientKubeletSignerName {
		return &x509.CertificateRequest{Subject: subject}
	}

	k.mu.Lock()
	dnsNames, ips := slices.Clone(k.dnsNames), slices.Clone(k.ips)
	k.mu.Unlock()

	if len(ips) == 0 && (!k.opts.AllowDNSOnly || len(dnsNames) == 0) {
		return nil
	}

	return &x509.CertificateRequest{Subject: subject, DNSNames: dnsNames, IPAddresses: ips}
}

// normalizeAddresses deduplicates and sorts as the kubelet's
// addressesToHostnamesAndIPs does, so the request has the kubelet's shape and
// the manager's template comparison is stable.
func normalizeAddresses(dnsNames []string, ips []net.IP) ([]string, []net.IP) {
	names := slices.Compact(slices.Sorted(slices.Values(dnsNames)))
	names = slices.DeleteFunc(names, func(s string) bool { return s == "" })

	seen := map[string]bool{}

	var out []net.IP

	for _, ip := range ips {
		if ip == nil || seen[ip.String()] {
			continue
		}

		seen[ip.String()] = true
		out = append(out, net.ParseIP(ip.String()))
	}

	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })

	return names, out
}

// SetAddresses changes what the kubelet asks for. Within about a second the
// manager sees that its certificate no longer covers them and requests a new
// one, as a kubelet does when its Node's addresses change.
func (k *Kubelet) SetAddresses(dnsNames []string, ips []net.IP) {
	names, addrs := normalizeAddresses(dnsNames, ips)

	k.mu.Lock()
	defer k.mu.Unlock()

	k.dnsNames, k.ips = names, addrs
}

// Current is the certificate the kubelet would serve with, nil before one is
// issued.
func (k *Kubelet) Current() *tls.Certificate {
	if k.manager == nil {
		return nil
	}

	return k.manager.Current()
}

// WaitForCertificate waits until the kubelet holds a certificate.
func (k *Kubelet) WaitForCertificate(ctx context.Context) (*x509.Certificate, error) {
	return k.WaitFor(ctx, func(*x509.Certificate) bool { return true })
}

// WaitFor waits until the kubelet holds a certificate satisfying cond (a
// rotated one, one with a new address), and returns it.
func (k *Kubelet) WaitFor(ctx context.Context, cond func(*x509.Certificate) bool) (*x509.Certificate, error) {
	var leaf *x509.Certificate

	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		if c := k.manager.Current(); c != nil && c.Leaf != nil && cond(c.Leaf) {
			leaf = c.Leaf

			return true, nil
		}

		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: wait for certificate: %w", k.Name, err)
	}

	return leaf, nil
}

// CSRs are the CSRs this kubelet's user made for its signer, oldest first.
func (k *Kubelet) CSRs(ctx context.Context) ([]certificatesv1.CertificateSigningRequest, error) {
	list, err := k.env.Clientset.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.signerName=" + k.opts.SignerName,
	})
	if err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: list CSRs: %w", k.Name, err)
	}

	username := k.username()
	out := slices.DeleteFunc(list.Items, func(c certificatesv1.CertificateSigningRequest) bool {
		return c.Spec.Username != username
	})

	slices.SortStableFunc(out, func(a, b certificatesv1.CertificateSigningRequest) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})

	return out, nil
}

// WaitForPendingCSR waits for a CSR from this kubelet that is neither
// approved, denied nor failed, and returns the newest such.
func (k *Kubelet) WaitForPendingCSR(ctx context.Context) (*certificatesv1.CertificateSigningRequest, error) {
	return k.WaitForCSR(ctx, func(c *certificatesv1.CertificateSigningRequest) bool {
		return len(c.Status.Conditions) == 0
	})
}

// WaitForCSR waits for a CSR from this kubelet satisfying cond (denied, say,
// once the approver under test has judged it) and returns the newest such.
func (k *Kubelet) WaitForCSR(ctx context.Context, cond func(*certificatesv1.CertificateSigningRequest) bool) (*certificatesv1.CertificateSigningRequest, error) {
	var found *certificatesv1.CertificateSigningRequest

	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		csrs, err := k.CSRs(ctx)
		if err != nil {
			return false, err
		}

		for i := len(csrs) - 1; i >= 0; i-- {
			if cond(&csrs[i]) {
				found = &csrs[i]

				return true, nil
			}
		}

		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: wait for CSR: %w", k.Name, err)
	}

	return found, nil
}

func (k *Kubelet) username() string {
	if k.opts.Username != "" {
		return k.opts.Username
	}

	return "system:node:" + k.Name
}

// Config is the kubelet's client configuration (its user, its groups).
func (k *Kubelet) Config() *rest.Config {
	return rest.CopyConfig(k.cfg)
}

// Client is a clientset authenticated as the kubelet: what a compromised node
// could do is what this client can do.
func (k *Kubelet) Client() kubernetes.Interface {
	return k.client
}

// RegisterNode creates the kubelet's Node as the kubelet, with status.addresses
// set to addresses or, if none are given, to what the kubelet asks for (a
// Hostname for the first DNS name, an InternalIP for each IP).
func (k *Kubelet) RegisterNode(ctx context.Context, addresses ...corev1.NodeAddress) (*corev1.Node, error) {
	if len(addresses) == 0 {
		addresses = k.nodeAddresses()
	}

	// A Node's status is accepted on create, which is how the kubelet
	// registers.
	node, err := k.client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: k.Name},
		Status:     corev1.NodeStatus{Addresses: addresses},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: register Node: %w", k.Name, err)
	}

	return node, nil
}

// SetNodeAddresses rewrites the Node's status.addresses as the kubelet, which
// a compromised node can do to its own Node.
func (k *Kubelet) SetNodeAddresses(ctx context.Context, addresses ...corev1.NodeAddress) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := k.client.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		node.Status.Addresses = slices.Clone(addresses)
		_, err = k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})

		return err
	})
	if err != nil {
		return fmt.Errorf("harness: kubelet %s: set Node addresses: %w", k.Name, err)
	}

	return nil
}

func (k *Kubelet) nodeAddresses() []corev1.NodeAddress {
	k.mu.Lock()
	defer k.mu.Unlock()

	var out []corev1.NodeAddress

	if len(k.dnsNames) > 0 {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeHostName, Address: k.dnsNames[0]})
	}

	for _, ip := range k.ips {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}

	return out
}

// CertificateDir is where the file store keeps the kubelet's key and
// certificates (kubelet-server-current.pem, as in /var/lib/kubelet/pki).
func (k *Kubelet) CertificateDir() string {
	return k.dir
}

// Stop stops the certificate manager; a CSR it is waiting on stays in the
// cluster. It is idempotent.
func (k *Kubelet) Stop() {
	k.stopWithCtx()
	k.stopManager()
}

func (k *Kubelet) stopManager() {
	k.stopOnce.Do(func() {
		k.manager.Stop()
		k.serving.close()
	})
}
