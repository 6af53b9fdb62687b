package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The kubelet's serving port. A real kubelet serves its API on port 10250
// with its serving certificate; the harness's kubelet serves a TLS listener
// on a local port that does nothing but the handshake, which is all that an
// audit of the certificate in service needs (servingcert).

// servingListener shows the kubelet's certificate to whoever connects.
type servingListener struct {
	l net.Listener
	// current is the certificate the kubelet's certificate manager holds.
	current func() *tls.Certificate

	mu      sync.Mutex
	instead *tls.Certificate
	silent  bool
	held    []net.Conn
}

func newServingListener(current func() *tls.Certificate) (*servingListener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("serving listener: %w", err)
	}
	s := &servingListener{l: l, current: current}
	go s.serve()
	return s, nil
}

func (s *servingListener) serve() {
	cfg := &tls.Config{GetCertificate: s.certificate, MinVersion: tls.VersionTLS12}
	for {
		conn, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.silent {
			// Accepted and never answered, as a kubelet wedged behind a
			// proxy that accepts TCP: only the reader's timeout ends it.
			s.held = append(s.held, conn)
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		go func() {
			defer conn.Close() //nolint:errcheck // only the handshake is served
			_ = tls.Server(conn, cfg).HandshakeContext(context.Background())
		}()
	}
}

func (s *servingListener) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	instead := s.instead
	s.mu.Unlock()
	if instead != nil {
		return instead, nil
	}
	if c := s.current(); c != nil {
		return c, nil
	}
	return nil, errors.New("the kubelet holds no serving certificate yet")
}

func (s *servingListener) close() {
	_ = s.l.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.held {
		_ = c.Close()
	}
	s.held = nil
}

// ServingAddress is the local address (127.0.0.1:port) where the kubelet
// serves its current serving certificate, as a kubelet does on port 10250.
func (k *Kubelet) ServingAddress() string {
	return k.serving.l.Addr().String()
}

// ServeInstead makes the kubelet serve cert rather than the certificate its
// manager holds, as a node whose certificate was replaced by hand (self-
// signed, or from another CA); nil serves the manager's again.
func (k *Kubelet) ServeInstead(cert *tls.Certificate) {
	k.serving.mu.Lock()
	defer k.serving.mu.Unlock()
	k.serving.instead = cert
}

// SetSilent makes the kubelet accept connections on its serving port and
// never answer the handshake while silent is true.
func (k *Kubelet) SetSilent(silent bool) {
	k.serving.mu.Lock()
	defer k.serving.mu.Unlock()
	k.serving.silent = silent
}

// Hosts maps addresses (host:port) to others, as /etc/hosts maps names: the
// harness's node addresses (10.42.0.2, say) are not routable on the test
// machine, so a test that dials a node's kubelet port maps NODE_IP:10250 to
// the kubelet's ServingAddress. Its Dial has the shape of
// net.Dialer.DialContext.
type Hosts struct {
	mu sync.Mutex
	to map[string]string
}

// Map sends connections to address to to.
func (h *Hosts) Map(address, to string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.to == nil {
		h.to = map[string]string{}
	}
	h.to[address] = to
}

// Dial connects to where address is mapped; an address not mapped is
// refused, as an address nobody listens on.
func (h *Hosts) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	h.mu.Lock()
	to, ok := h.to[address]
	h.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("dial %s %s: connection refused (no host of the test maps it)", network, address)
	}
	return (&net.Dialer{}).DialContext(ctx, network, to)
}

// ApproveServing approves the kubelet's newest undecided CSR as the admin,
// standing in for an approver that a test does not run, and waits until the
// kubelet holds the certificate the CSR signer signs for it.
func (k *Kubelet) ApproveServing(ctx context.Context) (*x509.Certificate, error) {
	csr, err := k.WaitForPendingCSR(ctx)
	if err != nil {
		return nil, err
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "HarnessApproved", Message: "approved by the test harness",
	})
	if _, err = k.env.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("harness: kubelet %s: approve %s: %w", k.Name, csr.Name, err)
	}
	return k.WaitForCertificate(ctx)
}
