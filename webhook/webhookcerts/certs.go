package webhookcerts

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1" //nolint:gosec // the subject key identifier of RFC 5280 4.2.1.2, not a security hash
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// Keys of the Secret the certificates are kept in. Opaque, not
// kubernetes.io/tls: the chart creates the Secret empty, and a TLS Secret
// must hold a certificate from its creation.
const (
	// KeyCACert is the current CA, the one that signs.
	KeyCACert = "ca.crt"
	// KeyCAKey is the current CA's private key (PKCS #8).
	KeyCAKey = "ca.key"
	// KeyCABundle is every CA the API server is told to trust: the current
	// one first, then each earlier one until it expires, so a replica still
	// serving a certificate of the previous CA stays trusted during a CA
	// rotation.
	KeyCABundle = "ca-bundle.crt"
	// KeyServingCert and KeyServingKey are the webhook's serving certificate
	// and its key, the names the webhook server reads from its cert dir.
	KeyServingCert = "tls.crt"
	KeyServingKey  = "tls.key"
)

// secretKeys is every key the rotator owns in the Secret.
var secretKeys = []string{KeyCACert, KeyCAKey, KeyCABundle, KeyServingCert, KeyServingKey}

// backdate is how far before now a certificate's validity starts, so that an
// API server whose clock is a little behind already accepts it.
const backdate = 5 * time.Minute

// issuance is what the certificates are made for: the Service's DNS names and
// the lifetimes.
type issuance struct {
	dnsNames        []string
	caValidity      time.Duration
	servingValidity time.Duration
}

// material is the parsed content of the Secret, once planned: every field is
// set and valid.
type material struct {
	ca      *x509.Certificate
	caKey   crypto.Signer
	serving *x509.Certificate
	data    map[string][]byte
}

// caBundle is the PEM of every trusted CA.
func (m *material) caBundle() []byte { return m.data[KeyCABundle] }

// nextRenewal is when the first of the CA and the serving certificate is due.
func (m *material) nextRenewal() time.Time {
	ca, serving := renewalTime(m.ca), renewalTime(m.serving)
	if ca.Before(serving) {
		return ca
	}
	return serving
}

// renewalTime is two thirds into a certificate's life: a 90-day serving
// certificate is renewed after 60 days, leaving 30 to notice a failure.
func renewalTime(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life / 3 * 2)
}

// plan reads the Secret's data and returns the material that should be in
// it at now: what is there when it is complete, valid and not due; otherwise
// a new serving certificate, and a new CA first when the CA is missing,
// unreadable or due. changed reports whether the data differs from what was
// there. It is pure (no I/O besides the random source), so every rotation
// rule is unit-tested on its own.
func plan(data map[string][]byte, now time.Time, is issuance) (m *material, changed bool, err error) {
	m = &material{data: map[string][]byte{}}

	m.ca, m.caKey = parseCA(data[KeyCACert], data[KeyCAKey], now)
	if m.ca == nil {
		if m.ca, m.caKey, err = newCA(now, is.caValidity); err != nil {
			return nil, false, err
		}
	}
	m.data[KeyCACert] = encodeCert(m.ca)
	if m.data[KeyCAKey], err = encodeKey(m.caKey); err != nil {
		return nil, false, err
	}
	// Keep the key bytes as they were when the CA is kept: PKCS #8 encoding
	// is deterministic for ECDSA, but a key written by another encoder must
	// not count as a change.
	if bytes.Equal(data[KeyCACert], m.data[KeyCACert]) {
		m.data[KeyCAKey] = data[KeyCAKey]
	}

	m.data[KeyCABundle] = trustBundle(m.ca, data[KeyCABundle], data[KeyCACert], now)

	servingKeyPEM := data[KeyServingKey]
	m.serving = parseServing(data[KeyServingCert], servingKeyPEM, m.ca, now, is.dnsNames)
	if m.serving == nil {
		var key crypto.Signer
		if m.serving, key, err = newServing(m.ca, m.caKey, now, is); err != nil {
			return nil, false, err
		}
		if servingKeyPEM, err = encodeKey(key); err != nil {
			return nil, false, err
		}
	}
	m.data[KeyServingCert] = encodeCert(m.serving)
	m.data[KeyServingKey] = servingKeyPEM

	for _, k := range secretKeys {
		if !bytes.Equal(data[k], m.data[k]) {
			changed = true
		}
	}
	return m, changed, nil
}

// parseCA returns the CA when the certificate and key parse, belong
// together, the certificate is a CA and it is not yet due for renewal; nil
// otherwise.
func parseCA(certPEM, keyPEM []byte, now time.Time) (*x509.Certificate, crypto.Signer) {
	cert, err := parseCert(certPEM)
	if err != nil || !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, nil
	}
	key, err := parseKey(keyPEM)
	if err != nil || !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, nil
	}
	if now.Before(cert.NotBefore) || !now.Before(renewalTime(cert)) {
		return nil, nil
	}
	return cert, key
}

// parseServing returns the serving certificate when it and its key parse and
// belong together, the current CA signed it, it names exactly the Service's
// DNS names, and it is not yet due for renewal; nil otherwise.
func parseServing(certPEM, keyPEM []byte, ca *x509.Certificate, now time.Time, dnsNames []string) *x509.Certificate {
	cert, err := parseCert(certPEM)
	if err != nil || cert.CheckSignatureFrom(ca) != nil {
		return nil
	}
	key, err := parseKey(keyPEM)
	if err != nil || !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil
	}
	if !slices.Equal(sorted(cert.DNSNames), sorted(dnsNames)) {
		return nil
	}
	if now.Before(cert.NotBefore) || !now.Before(renewalTime(cert)) {
		return nil
	}
	return cert
}

// trustBundle is the current CA followed by every other CA of the previous
// bundle (and the previous current CA) that has not expired at now.
func trustBundle(current *x509.Certificate, previousBundle, previousCA []byte, now time.Time) []byte {
	out := encodeCert(current)
	seen := [][]byte{current.Raw}
	rest := append(append([]byte{}, previousBundle...), previousCA...)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil || !cert.IsCA || !now.Before(cert.NotAfter) {
			continue
		}
		if slices.ContainsFunc(seen, func(raw []byte) bool { return bytes.Equal(raw, cert.Raw) }) {
			continue
		}
		seen = append(seen, cert.Raw)
		out = append(out, encodeCert(cert)...)
	}
	return out
}

func newCA(now time.Time, validity time.Duration) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate the CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	skid, err := subjectKeyID(key.Public())
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// The date in the name tells one CA from the next in a bundle.
		Subject:               pkix.Name{CommonName: "ichor-policy webhook CA " + now.UTC().Format("2006-01-02T15:04:05Z")},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// It signs only the serving certificates, never another CA.
		MaxPathLenZero: true,
		KeyUsage:       x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:   skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func newServing(ca *x509.Certificate, caKey crypto.Signer, now time.Time, is issuance) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate the serving key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(is.servingValidity)
	// Never outlive the CA: a certificate valid past its issuer's end is not
	// valid then anyway, and its renewal time would come too late.
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: is.dnsNames[0]},
		DNSNames:     is.dnsNames,
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func serialNumber() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return serial, nil
}

func subjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	sum := sha1.Sum(der) //nolint:gosec // RFC 5280 4.2.1.2 method (1)
	return sum[:], nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(p)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKey(p []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(p)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM private key")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T is not a signing key", key)
	}
	return signer, nil
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode a private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
