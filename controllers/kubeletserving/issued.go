package kubeletserving

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
)

// ReasonCertificateNotRecorded is the reason of the Warning Event on a
// machine whose request was approved and signed, but whose certificate is
// not recorded on it: it is for another node, was not signed by the
// cluster's Kubernetes CA, is not for serving, or does not carry the
// request's key, or the request's name is too long to record.
const ReasonCertificateNotRecorded = "CertificateNotRecorded"

// maxRecordedRequestName is the longest request name recorded on a machine
// (KubeletServingCertificateStatus.Request's maxLength): a DNS subdomain's.
const maxRecordedRequestName = 253

// recordable is nil when cert, issued for csr (a request for node), may be
// recorded on its machine; otherwise why not.
func recordable(cert *x509.Certificate, csr *certificatesv1.CertificateSigningRequest, node string, roots *x509.CertPool, now time.Time) error {
	if issued := csrinput.NodeNameOfCertificate(cert); issued != node {
		// The signer put another name in the certificate than the request
		// asked for: it is not this machine's.
		return fmt.Errorf("it is for node %q, the request for node %q", issued, node)
	}
	if len(csr.Name) > maxRecordedRequestName {
		// Kubernetes does not bound a CSR's name, and a tenant's server
		// sends what it likes: the machine's status holds one no longer
		// than the kubelet's names ever are (review 191 F3).
		return fmt.Errorf("its request's name is %d bytes, more than the %d recorded", len(csr.Name), maxRecordedRequestName)
	}
	return issuedForRequest(cert, csr, roots, now)
}

// issuedForRequest is nil when cert is what the cluster's kubelet serving
// signer issues for csr: signed by one of the cluster's Kubernetes CAs
// (roots), for server auth, and for the request's key; otherwise why not.
// Only the leaf is read, as kube-controller-manager's signer issues it,
// signed by the CA itself: no intermediate from the API server is trusted.
func issuedForRequest(cert *x509.Certificate, csr *certificatesv1.CertificateSigningRequest, roots *x509.CertPool, now time.Time) error {
	if err := servingcert.Verify(roots, []*x509.Certificate{cert}, now); err != nil {
		return err
	}
	// As the audit's CertificateNotForServing: named, not implied by a
	// certificate without the extension.
	if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		return fmt.Errorf("it is not for serving: server auth is not among its extended key usages [%s]",
			strings.Join(servingcert.ExtKeyUsages(cert), ", "))
	}
	requested, err := csrinput.RequestPublicKey(csr)
	if err != nil {
		return fmt.Errorf("the request's public key cannot be read: %w", err)
	}
	key, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !key.Equal(requested) {
		return errors.New("its public key is not the request's")
	}
	return nil
}

// recordedFacts is a digest of what recordable judges of a request besides
// the cluster's CAs: its name, its request and its certificate.
func recordedFacts(csr *certificatesv1.CertificateSigningRequest) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(csr.Name), csr.Spec.Request, csr.Status.Certificate} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(part))))
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// relatedRequest is the request as an Event's related object: by name and
// UID, without the version its server changes with any label (each version
// would start an Event series of its own), and not at all when its name is
// longer than any a kubelet makes (the note says it, cut).
func relatedRequest(csr *certificatesv1.CertificateSigningRequest) runtime.Object {
	if len(csr.Name) > maxRecordedRequestName {
		return nil
	}
	return &certificatesv1.CertificateSigningRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: certificatesv1.SchemeGroupVersion.String(), Kind: "CertificateSigningRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: csr.Name, UID: csr.UID},
	}
}

// refusals are the machines whose last issued certificate was refused a
// record, and why (notRecorded's note), for the cluster's condition to say
// while they wait: the Event that says it expires within the hour, and a
// refusal is judged (and said) once (Reconciler.unrecorded).
type refusals struct {
	mu sync.Mutex
	m  map[types.NamespacedName]recordRefusal
}

type recordRefusal struct {
	cluster types.NamespacedName
	// machine is the machine's UID: one made again under its name has not
	// been refused anything.
	machine types.UID
	why     string
}

func (f *refusals) set(cluster types.NamespacedName, machine *ichorv1alpha1.TalosMachine, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[types.NamespacedName]recordRefusal{}
	}
	f.m[types.NamespacedName{Namespace: machine.Namespace, Name: machine.Name}] = recordRefusal{cluster: cluster, machine: machine.UID, why: why}
}

func (f *refusals) clear(machine types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, machine)
}

// of is why the machine's last certificate was refused a record, if it was,
// for the cluster.
func (f *refusals) of(cluster types.NamespacedName, machine *ichorv1alpha1.TalosMachine) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.m[types.NamespacedName{Namespace: machine.Namespace, Name: machine.Name}]
	if !ok || r.cluster != cluster || r.machine != machine.UID {
		return "", false
	}
	return r.why, true
}

// forget forgets the refusals of a cluster's machines.
func (f *refusals) forget(cluster types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for m, r := range f.m {
		if r.cluster == cluster {
			delete(f.m, m)
		}
	}
}
