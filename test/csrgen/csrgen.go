// Package csrgen makes real PKCS#10 certificate requests and CSR objects for
// tests and the demo: the same bytes a kubelet would send, and the forged ones
// a compromised node might.
package csrgen

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KeyType selects the request's key algorithm.
type KeyType string

// The key types the kubelet and its tests use.
const (
	ECDSA   KeyType = "ecdsa"
	RSA     KeyType = "rsa"
	Ed25519 KeyType = "ed25519"
)

// Key makes a private key of the given type.
func Key(t KeyType) (crypto.Signer, error) {
	switch t {
	case ECDSA, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case RSA:
		return rsa.GenerateKey(rand.Reader, 2048)
	case Ed25519:
		_, key, err := ed25519.GenerateKey(rand.Reader)
		return key, err
	default:
		return nil, fmt.Errorf("unknown key type %q", t)
	}
}

// Request describes a certificate request to make.
type Request struct {
	Subject    pkix.Name
	DNSNames   []string
	IPs        []net.IP
	Emails     []string
	URIs       []*url.URL
	Extensions []pkix.Extension
	Key        crypto.Signer // made as ECDSA P-256 when nil
}

// PEM signs the request and returns it PEM-encoded.
func PEM(r Request) ([]byte, error) {
	key := r.Key
	if key == nil {
		var err error
		if key, err = Key(ECDSA); err != nil {
			return nil, err
		}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:         r.Subject,
		DNSNames:        r.DNSNames,
		IPAddresses:     r.IPs,
		EmailAddresses:  r.Emails,
		URIs:            r.URIs,
		ExtraExtensions: r.Extensions,
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// NodeSubject is the subject a kubelet asks for: CN=system:node:NAME, O=system:nodes.
func NodeSubject(node string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
}

// TamperSignature flips one bit of the request's signature, so it still
// parses but no longer verifies.
func TamperSignature(pemBytes []byte) ([]byte, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, fmt.Errorf("no PEM block")
	}
	der := append([]byte(nil), block.Bytes...)
	// The signature BIT STRING is the last element of the request, so its
	// last byte is signature material for every algorithm.
	der[len(der)-1] ^= 0x01
	return pem.EncodeToMemory(&pem.Block{Type: block.Type, Bytes: der}), nil
}

// ServingObject wraps request bytes in a kubelet-serving CSR object as the
// node named node would submit it.
func ServingObject(name, node string, request []byte, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
	if len(usages) == 0 {
		usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	}
	return &certificatesv1.CertificateSigningRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "CertificateSigningRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    request,
			SignerName: certificatesv1.KubeletServingSignerName,
			Usages:     usages,
			Username:   "system:node:" + node,
			Groups:     []string{"system:nodes", "system:authenticated"},
		},
	}
}
