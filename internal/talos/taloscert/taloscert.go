// Package taloscert signs client certificates with the CAs of a Talos secrets
// bundle: Talos API certificates from the OS CA, Kubernetes client
// certificates from the Kubernetes CA.
//
// Talos authorizes an API client by the roles in the Subject Organization (O=) of
// its certificate, so the role written here is the whole of the credential's
// power; the Kubernetes API server reads O= as the user's groups. The package is
// shared by the node identity reader (which only ever asks for os:reader) and by
// the credential issuer (which asks for what policy allowed).
package taloscert

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
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	siderox509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/role"
)

// CA is a parsed CA of a Talos secrets bundle, ready to sign.
type CA struct {
	Cert   *x509.Certificate
	signer crypto.Signer
}

// ParseCA parses a CA certificate and key in the PEM encoding of a Talos
// secrets bundle (certs.os or certs.k8s): the key may be "ED25519 PRIVATE
// KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY" or PKCS#8 "PRIVATE KEY".
//
// Whoever writes the secrets bundle Secret (a tenant, for its own cluster)
// writes the key: its kind and size are checked before it is parsed, since
// parsing an RSA key checks and precomputes over its modulus, and a key of a
// megabit (its primes need not even be prime) costs seconds to parse and hours
// to sign with. A CA of Ed25519 (what Talos makes for the OS CA), ECDSA on
// P-256, P-384 or P-521, or RSA of 2048 to 4096 bits is taken.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	// Parsing through siderolabs/crypto keeps us byte-compatible with what
	// `talosctl gen secrets` writes, including its non-standard Ed25519 PEM type.
	pair := &siderox509.PEMEncodedCertificateAndKey{Crt: certPEM, Key: keyPEM}

	cert, err := pair.GetCert()
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}

	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate is not a signing CA")
	}

	if err := caKeyAllowed(cert.PublicKey); err != nil {
		return nil, err
	}

	// The key matches the certificate's (checked once parsed) only if it
	// is of the same size; a key PEM longer than a 4096-bit RSA key's is
	// refused before it is parsed.
	if block, _ := pem.Decode(keyPEM); block != nil && len(block.Bytes) > maxCAKeyDER {
		return nil, fmt.Errorf("parse CA key: %d bytes, longer than any key of the kinds taken (%d)", len(block.Bytes), maxCAKeyDER)
	}

	key, err := pair.GetKey()
	if err != nil {
		return nil, fmt.Errorf("parse CA key: %w", err)
	}

	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key of type %T cannot sign", key)
	}

	if !publicKeysEqual(cert.PublicKey, signer.Public()) {
		return nil, errors.New("CA key does not match the CA certificate")
	}

	return &CA{Cert: cert, signer: signer}, nil
}

// ClientCertificate describes one Talos API client certificate.
type ClientCertificate struct {
	// Role is the single Talos role (e.g. "os:reader") written as the only O=.
	Role string
	// PublicKey is the holder's key; the holder keeps the private half.
	PublicKey crypto.PublicKey
	// CommonName is optional; Talos ignores it, audit logs show it.
	CommonName string
	// NotBefore starts the validity; NotAfter is NotBefore+Lifetime.
	NotBefore time.Time
	Lifetime  time.Duration
}

// Issue signs a client certificate. It refuses unknown roles (Talos would treat
// them as no role, a useless credential) and os:impersonator (Talos then trusts
// roles from request metadata, which is every role).
func (ca *CA) Issue(req ClientCertificate) ([]byte, error) {
	if err := validateRole(req.Role); err != nil {
		return nil, err
	}

	der, err := ca.sign(pkix.Name{CommonName: req.CommonName, Organization: []string{req.Role}}, req.PublicKey, req.NotBefore, req.Lifetime)
	if err != nil {
		return nil, fmt.Errorf("sign %s client certificate: %w", req.Role, err)
	}
	return der, nil
}

// KubernetesClientCertificate describes one Kubernetes client certificate:
// the API server reads CN as the user and each O as a group.
type KubernetesClientCertificate struct {
	CommonName string
	Groups     []string
	PublicKey  crypto.PublicKey
	NotBefore  time.Time
	Lifetime   time.Duration
}

// IssueKubernetes signs a Kubernetes client certificate.
func (ca *CA) IssueKubernetes(req KubernetesClientCertificate) ([]byte, error) {
	if req.CommonName == "" {
		return nil, errors.New("a Kubernetes client certificate needs a common name")
	}
	der, err := ca.sign(pkix.Name{CommonName: req.CommonName, Organization: append([]string(nil), req.Groups...)}, req.PublicKey, req.NotBefore, req.Lifetime)
	if err != nil {
		return nil, fmt.Errorf("sign Kubernetes client certificate for %q: %w", req.CommonName, err)
	}
	return der, nil
}

// sign makes a client-auth certificate for subject, with the same key usages
// as Talos's own NewAdminCertificateAndKey.
func (ca *CA) sign(subject pkix.Name, publicKey crypto.PublicKey, notBefore time.Time, lifetime time.Duration) ([]byte, error) {
	if publicKey == nil {
		return nil, errors.New("client certificate needs a public key")
	}
	if lifetime <= 0 {
		return nil, fmt.Errorf("client certificate lifetime %s is not positive", lifetime)
	}
	if notBefore.IsZero() {
		return nil, errors.New("client certificate needs a NotBefore time")
	}
	// 128 random bits, as RFC 5280 recommends, so serials never collide across issuers.
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(lifetime),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.Cert, publicKey, ca.signer)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// IssueClientCertificate parses the OS CA and signs one client certificate for
// role and publicKey, valid from notBefore for lifetime.
func IssueClientCertificate(caCertPEM, caKeyPEM []byte, role string, publicKey crypto.PublicKey, notBefore time.Time, lifetime time.Duration) ([]byte, error) {
	ca, err := ParseCA(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, err
	}

	return ca.Issue(ClientCertificate{
		Role:      role,
		PublicKey: publicKey,
		NotBefore: notBefore,
		Lifetime:  lifetime,
	})
}

func validateRole(r string) error {
	if r == "" {
		return errors.New("client certificate needs a Talos role")
	}

	if role.Role(r) == role.Impersonator {
		return fmt.Errorf("role %q is never issued: Talos would trust any role named in request metadata", r)
	}

	// Talos trims O= values before matching; we only write the canonical spelling.
	if _, unknown := role.Parse([]string{r}); len(unknown) > 0 || strings.TrimSpace(r) != r {
		return fmt.Errorf("role %q is not a Talos role", r)
	}

	return nil
}

// maxCAKeyDER bounds a CA key's DER: a 4096-bit RSA key, the largest taken,
// is about 2,400 bytes in PKCS#1 or PKCS#8.
const maxCAKeyDER = 4 << 10

// caKeyAllowed refuses a CA whose key is of a kind or size ParseCA does not
// take.
func caKeyAllowed(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return nil
		}
		return fmt.Errorf("CA key is ECDSA on %s; P-256, P-384 or P-521 is taken", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < 2048 || bits > 4096 {
			return fmt.Errorf("CA key is RSA of %d bits; 2048 to 4096 are taken", bits)
		}
		return nil
	default:
		return fmt.Errorf("CA key is a %T; Ed25519, ECDSA or RSA is taken", pub)
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface {
		Equal(crypto.PublicKey) bool
	}

	ea, ok := a.(equaler)

	return ok && ea.Equal(b)
}
