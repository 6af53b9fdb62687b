package talosapi

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"

	siderox509 "github.com/siderolabs/crypto/x509"
)

// caValidity matches the ten years `talosctl gen secrets` gives the OS CA.
const caValidity = 10 * 365 * 24 * time.Hour

// CA is a Talos OS CA (the `certs.os` pair of a secrets bundle): Ed25519,
// self-signed, O=talos.
type CA struct {
	// CertPEM and KeyPEM are encoded exactly as a Talos secrets bundle stores them
	// (the key as "ED25519 PRIVATE KEY", PKCS#8 inside).
	CertPEM []byte
	KeyPEM  []byte

	cert *x509.Certificate
	key  crypto.Signer
}

// NewCA makes a fresh OS CA the way Talos's secrets.NewTalosCA does.
func NewCA() (*CA, error) {
	now := time.Now()

	ca, err := siderox509.NewSelfSignedCertificateAuthority(
		siderox509.Organization("talos"),
		siderox509.NotBefore(now),
		siderox509.NotAfter(now.Add(caValidity)),
	)
	if err != nil {
		return nil, fmt.Errorf("generate OS CA: %w", err)
	}

	signer, ok := ca.Key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("OS CA key of type %T cannot sign", ca.Key)
	}

	return &CA{CertPEM: ca.CrtPEM, KeyPEM: ca.KeyPEM, cert: ca.Crt, key: signer}, nil
}

// PEMEncoded returns the CA in the secrets-bundle type Talos code passes around.
func (ca *CA) PEMEncoded() *siderox509.PEMEncodedCertificateAndKey {
	return &siderox509.PEMEncodedCertificateAndKey{Crt: ca.CertPEM, Key: ca.KeyPEM}
}

// Pool returns a pool holding only this CA, for a client's RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)

	return pool
}

// ClientCertificate signs a client certificate whose O= is exactly orgs (none,
// unknown or several are allowed on purpose: tests need the credentials Talos
// must refuse too), valid for an hour.
//
// It deliberately does not reuse the production signer, so a test proves that
// signer against an independent one.
func (ca *CA) ClientCertificate(orgs ...string) (tls.Certificate, error) {
	return ca.leaf(pkix.Name{CommonName: "talosapi-test-client", Organization: orgs},
		x509.ExtKeyUsageClientAuth, nil, nil)
}

// ClientTLSConfig is a ready client configuration for client.WithTLSConfig: it
// trusts this CA and presents a certificate with O= orgs.
func (ca *CA) ClientTLSConfig(orgs ...string) (*tls.Config, error) {
	cert, err := ca.ClientCertificate(orgs...)
	if err != nil {
		return nil, err
	}

	return &tls.Config{
		RootCAs:      ca.Pool(),
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// serverCertificate is the apid-style serving certificate: the node's names and
// addresses as SANs, signed by the OS CA.
func (ca *CA) serverCertificate(dnsNames []string, ips []net.IP) (tls.Certificate, error) {
	return ca.leaf(pkix.Name{Organization: []string{"talos"}}, x509.ExtKeyUsageServerAuth, dnsNames, ips)
}

func (ca *CA) leaf(subject pkix.Name, usage x509.ExtKeyUsage, dnsNames []string, ips []net.IP) (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}

	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial: %w", err)
	}

	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{usage},
		BasicConstraintsValid: true,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
	}

	der, err := x509.CreateCertificate(rand.Reader, template, ca.cert, pub, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("sign certificate: %w", err)
	}

	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})

	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("marshal key: %w", err)
	}

	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load key pair: %w", err)
	}

	return cert, nil
}
