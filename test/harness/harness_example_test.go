package harness_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/ichor-policy/internal/talos/talosnode"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// Example is the shape of a controller test: a cluster, a Talos node that
// knows its identity, a kubelet asking for a serving certificate, and the
// approver under test in between. Here the approval is done by hand where the
// controller would run. (Not run by `go test`: TestHarness covers the same
// ground on one shared environment.)
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	env, err := harness.Start(ctx, harness.Options{})
	if err != nil {
		log.Fatal(err)
	}

	defer func() {
		if err := env.Stop(); err != nil {
			log.Print(err)
		}
	}()

	// What Talos says about the node: the approver's source of truth.
	node, err := env.StartTalosNode(ctx, harness.NodeOptions{
		Name:      "worker-1",
		Addresses: []netip.Addr{netip.MustParseAddr("10.5.0.2")},
	})
	if err != nil {
		log.Fatal(err)
	}

	// The controller under test gets env.Config and env.Scheme for its
	// manager (metrics off), a talosnode.Reader on env.OSCA(), and
	// node.Endpoint() as worker-1's Talos endpoint. A TalosCluster would name
	// env.SecretsBundleSecret(namespace, name) as its secretsRef.
	caCert, caKey := env.OSCA()

	reader, err := talosnode.NewReader(talosnode.Options{CACertPEM: caCert, CAKeyPEM: caKey})
	if err != nil {
		log.Fatal(err)
	}

	id, err := reader.Read(ctx, node.Endpoint())
	if err != nil {
		log.Fatal(err)
	}

	// The kubelet asks for what it claims; the approver compares it with id.
	kubelet, err := env.StartKubelet(ctx, harness.KubeletOptions{
		NodeName: "worker-1",
		DNSNames: []string{"worker-1"},
		IPs:      []net.IP{net.ParseIP("10.5.0.2")},
	})
	if err != nil {
		log.Fatal(err)
	}

	csr, err := kubelet.WaitForPendingCSR(ctx)
	if err != nil {
		log.Fatal(err)
	}

	// Stand-in for the approver.
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type:    certificatesv1.CertificateApproved,
		Status:  corev1.ConditionTrue,
		Reason:  "Example",
		Message: fmt.Sprintf("Talos reports %v", id.Addresses),
	})

	if _, err = env.Clientset.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		log.Fatal(err)
	}

	// The CSR signer signs with the bundle's Kubernetes CA.
	cert, err := kubelet.WaitForCertificate(ctx)
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println(cert.Subject.CommonName, cert.IPAddresses)
}
