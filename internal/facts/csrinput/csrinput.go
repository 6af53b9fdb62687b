// Package csrinput turns a certificates.k8s.io/v1 CertificateSigningRequest into
// the input document the Rego rules decide on.
//
// The document names facts, never conclusions: whether the PEM parsed and why
// not, whether the signature verified, every subject attribute with its OID,
// every subject alternative name of every type, every requested extension. A
// rule that needs a fact the request already carries must find it here without
// a Go change, and a logged input must replay to the same decision.
//
// Build never panics and never fails: a request it cannot read is described as
// such (parsed=false), because "this request is malformed" is itself a fact a
// rule decides on.
package csrinput

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// CSR is input.csr: the request object and everything its PEM carries.
type CSR struct {
	Name       string `json:"name"`
	SignerName string `json:"signer_name"`
	Username   string `json:"username"`
	// UID is the requesting user's (spec.uid), as the API server named
	// them; ObjectUID is the request object's own (metadata.uid), which
	// no rule reads: the decision log names the object by it, so that a
	// record that a verdict was applied is matched with its decision
	// (review 188: they were compared with the user's).
	UID       string              `json:"uid"`
	ObjectUID string              `json:"object_uid"`
	Groups    []string            `json:"groups"`
	Extra     map[string][]string `json:"extra"`
	Usages    []string            `json:"usages"`
	// ExpirationSeconds is absent when the requester did not ask for a lifetime.
	ExpirationSeconds *int32  `json:"expiration_seconds,omitempty"`
	Request           Request `json:"request"`
}

// Request is input.csr.request: the parsed PKCS#10 request.
type Request struct {
	// PEM is what spec.request holds as PEM. Parsed and what follows are of
	// its first block, the one kube-controller-manager reads (and signs, if
	// its type is CERTIFICATE REQUEST), whatever its type and headers.
	PEM                PEM         `json:"pem"`
	Parsed             bool        `json:"parsed"`
	ParseError         string      `json:"parse_error"`
	SignatureValid     bool        `json:"signature_valid"`
	SignatureError     string      `json:"signature_error"`
	SignatureAlgorithm string      `json:"signature_algorithm"`
	Subject            []Attribute `json:"subject"`
	SubjectAltNames    []SAN       `json:"subject_alt_names"`
	Extensions         []Extension `json:"extensions"`
	PublicKey          PublicKey   `json:"public_key"`
}

// PEM describes the PEM blocks of spec.request.
type PEM struct {
	// Blocks is how many PEM blocks there are.
	Blocks int `json:"blocks"`
	// Types are their types in order, the first MaxPEMTypes of them, each
	// cut to MaxPEMTypeBytes: a type is text the requester wrote.
	Types []string `json:"types"`
	// Headers is how many headers the first block has. The signer reads the
	// block's bytes, never its headers.
	Headers int `json:"headers"`
}

// The bounds of PEM's facts, so that a request of a thousand blocks costs a
// bounded input and log entry.
const (
	MaxPEMTypes     = 8
	MaxPEMTypeBytes = 64
)

// What a request may hold for the rule to be given it, each far above what
// a kubelet sends (about a kilobyte, a few names) and below what costs the
// manager: the input is built before the rule can refuse anything, and a
// name costs about 500 bytes as OPA's value (review of 2026-12-06: a tenant's
// API server could send a CSR of 16 MiB, six million empty DNS names, about
// 3 GB as the rule's input). A request beyond one is not parsed
// (ParseError says which bound), which the rule treats as any malformed
// request.
const (
	// MaxRequestBytes bounds spec.request, PEM and all: crypto/x509 parses
	// every name of a request before any bound here is asked (an empty
	// URI name is two bytes of DER and a url.URL), so this bound is also
	// what x509 allocates.
	MaxRequestBytes = 64 << 10
	// MaxSubjectAltNames bounds the names of the subjectAltName extension.
	MaxSubjectAltNames = 1000
	// MaxSubjectAttributes bounds the subject's attributes.
	MaxSubjectAttributes = 64
	// MaxExtensions bounds the requested extensions.
	MaxExtensions = 64
	// MaxVerifiedRSABits is the largest RSA key whose signature is checked:
	// crypto/rsa bounds a key's size from below only, and checking the
	// signature of a key of a few megabits takes hours of CPU that no
	// context cancels. A larger key's signature is unchecked, and so not
	// valid.
	MaxVerifiedRSABits = 16384
)

// Attribute is one subject attribute, in the order the request lists them.
type Attribute struct {
	OID string `json:"oid"`
	// Name is the short name (CN, O, OU, …) when the OID has one, else empty.
	Name  string `json:"name"`
	Value string `json:"value"`
}

// SAN is one subject alternative name. Type is one of dns, ip, email, uri,
// other_name, x400_address, directory_name, edi_party_name, registered_id,
// or unknown (another class or tag, or a tag in the other DER form than its
// alternative's, which crypto/x509 reads as no name). Names of the types
// crypto/x509 does not decode carry their DER in hex, so that a rule sees
// them rather than nothing.
type SAN struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

// Extension is one requested extension.
type Extension struct {
	OID      string `json:"oid"`
	Critical bool   `json:"critical"`
}

// PublicKey describes the request's key: RSA with its modulus size, ECDSA
// with its curve, or Ed25519.
type PublicKey struct {
	Algorithm string `json:"algorithm"`
	Bits      int    `json:"bits,omitempty"`
	Curve     string `json:"curve,omitempty"`
}

// Build describes a CSR object. The PEM is read from spec.request.
func Build(csr *certificatesv1.CertificateSigningRequest) CSR {
	out := CSR{
		Name:       csr.Name,
		SignerName: csr.Spec.SignerName,
		Username:   csr.Spec.Username,
		UID:        csr.Spec.UID,
		ObjectUID:  string(csr.UID),
		Groups:     nonNil(csr.Spec.Groups),
		Extra:      map[string][]string{},
		Usages:     make([]string, 0, len(csr.Spec.Usages)),
		Request:    ParseRequest(csr.Spec.Request),
	}
	for k, v := range csr.Spec.Extra {
		out.Extra[k] = nonNil(v)
	}
	for _, u := range csr.Spec.Usages {
		out.Usages = append(out.Usages, string(u))
	}
	if csr.Spec.ExpirationSeconds != nil {
		seconds := *csr.Spec.ExpirationSeconds
		out.ExpirationSeconds = &seconds
	}
	return out
}

// describePEM counts the PEM blocks of data and lists their types.
func describePEM(data []byte) PEM {
	out := PEM{Types: []string{}}
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return out
		}
		if out.Blocks == 0 {
			out.Headers = len(block.Headers)
		}
		out.Blocks++
		if len(out.Types) < MaxPEMTypes {
			t := block.Type
			if len(t) > MaxPEMTypeBytes {
				t = t[:MaxPEMTypeBytes]
			}
			out.Types = append(out.Types, strings.ToValidUTF8(t, "\uFFFD"))
		}
	}
}

// ParseRequest describes PEM-encoded PKCS#10 bytes.
func ParseRequest(pemBytes []byte) Request {
	req := Request{
		Subject:         []Attribute{},
		SubjectAltNames: []SAN{},
		Extensions:      []Extension{},
	}
	if len(pemBytes) > MaxRequestBytes {
		req.PEM.Types = []string{}
		req.ParseError = fmt.Sprintf("the request is %d bytes, more than the %d a certificate request is read to", len(pemBytes), MaxRequestBytes)
		return req
	}
	req.PEM = describePEM(pemBytes)
	// The first block, as kube-controller-manager reads it: its type and
	// headers are facts for the rule (PEM), not reasons to look no further.
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		req.ParseError = "no PEM block found"
		return req
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		req.ParseError = err.Error()
		return req
	}
	if err := withinBounds(csr); err != nil {
		req.ParseError = err.Error()
		return req
	}
	req.Parsed = true
	if key, ok := csr.PublicKey.(*rsa.PublicKey); ok && key.N.BitLen() > MaxVerifiedRSABits {
		req.SignatureError = fmt.Sprintf("not checked: an RSA key of %d bits, more than the %d whose signature is checked", key.N.BitLen(), MaxVerifiedRSABits)
	} else if err := csr.CheckSignature(); err != nil {
		req.SignatureError = err.Error()
	} else {
		req.SignatureValid = true
	}
	req.SignatureAlgorithm = csr.SignatureAlgorithm.String()
	req.PublicKey = DescribeKey(csr.PublicKey, csr.PublicKeyAlgorithm)
	req.Subject = Subject(csr.Subject)
	for _, ext := range csr.Extensions {
		req.Extensions = append(req.Extensions, Extension{OID: ext.Id.String(), Critical: ext.Critical})
		if ext.Id.Equal(OIDSubjectAltName) {
			sans, err := SubjectAltNames(ext.Value)
			if err != nil {
				// A partial list of names is the shape of a smuggling bypass:
				// a name the rule never sees, that another parser reads.
				return Request{
					PEM: req.PEM, Subject: []Attribute{}, SubjectAltNames: []SAN{}, Extensions: []Extension{},
					ParseError: "subjectAltName extension: " + err.Error(),
				}
			}
			req.SubjectAltNames = append(req.SubjectAltNames, sans...)
		}
	}
	return req
}

// withinBounds refuses a parsed request of more subject attributes or
// extensions than MaxSubjectAttributes and MaxExtensions: crypto/x509 has
// parsed them by then, within the request's byte bound, but the rule's input
// would hold each again. SubjectAltNames bounds the names.
func withinBounds(csr *x509.CertificateRequest) error {
	switch {
	case len(csr.Subject.Names) > MaxSubjectAttributes:
		return fmt.Errorf("the subject has %d attributes, more than the %d a request is read with", len(csr.Subject.Names), MaxSubjectAttributes)
	case len(csr.Extensions) > MaxExtensions:
		return fmt.Errorf("the request asks for %d extensions, more than the %d it is read with", len(csr.Extensions), MaxExtensions)
	}
	return nil
}

// OIDSubjectAltName is the subjectAltName extension.
var OIDSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// Subject lists every attribute of a parsed name, in its order, with its OID:
// how a request's subject is described, and a certificate's (servingcert).
func Subject(name pkix.Name) []Attribute {
	out := make([]Attribute, 0, len(name.Names))
	for _, atv := range name.Names {
		out = append(out, Attribute{
			OID:   atv.Type.String(),
			Name:  attributeNames[atv.Type.String()],
			Value: fmt.Sprint(atv.Value),
		})
	}
	return out
}

// attributeNames are the short names of the attributes crypto/x509 knows,
// so that messages read "OU=ops" rather than "2.5.4.11=ops".
var attributeNames = map[string]string{
	"2.5.4.3":                    "CN",
	"2.5.4.5":                    "SERIALNUMBER",
	"2.5.4.6":                    "C",
	"2.5.4.7":                    "L",
	"2.5.4.8":                    "ST",
	"2.5.4.9":                    "STREET",
	"2.5.4.10":                   "O",
	"2.5.4.11":                   "OU",
	"2.5.4.17":                   "POSTALCODE",
	"0.9.2342.19200300.100.1.25": "DC",
	"0.9.2342.19200300.100.1.1":  "UID",
	"1.2.840.113549.1.9.1":       "emailAddress",
}

// sanTypes maps the context-specific tags of GeneralName (RFC 5280 4.2.1.6)
// to each alternative's name and DER form: the strings, the address and the
// OID are primitive (IMPLICIT tags), the others constructed (directoryName's
// tag is EXPLICIT, around a Name).
var sanTypes = map[int]struct {
	name        string
	constructed bool
}{
	0: {"other_name", true},
	1: {"email", false},
	2: {"dns", false},
	3: {"x400_address", true},
	4: {"directory_name", true},
	5: {"edi_party_name", true},
	6: {"uri", false},
	7: {"ip", false},
	8: {"registered_id", false},
}

// SubjectAltNames lists every GeneralName of a subjectAltName extension value. The
// value must parse completely: one SEQUENCE with nothing after it, each of
// its elements a whole ASN.1 value. crypto/x509 has accepted the extension by
// then, but reads it more leniently; anything it let through that this reader
// cannot account for byte for byte is an error, never a shorter list. A
// name of another class or tag, or in the other DER form than its tag's
// alternative, is listed as type "unknown" with its bytes in hex.
func SubjectAltNames(der []byte) ([]SAN, error) {
	var seq asn1.RawValue
	rest, err := asn1.Unmarshal(der, &seq)
	switch {
	case err != nil:
		return nil, fmt.Errorf("not a SEQUENCE of names: %w", err)
	case len(rest) != 0:
		return nil, fmt.Errorf("%d bytes after the SEQUENCE of names", len(rest))
	case !seq.IsCompound || seq.Class != asn1.ClassUniversal || seq.Tag != asn1.TagSequence:
		return nil, fmt.Errorf("not a SEQUENCE of names (class %d, tag %d)", seq.Class, seq.Tag)
	}
	sans := []SAN{}
	rest = seq.Bytes
	for i := 0; len(rest) > 0; i++ {
		if i == MaxSubjectAltNames {
			return nil, fmt.Errorf("more than %d names", MaxSubjectAltNames)
		}
		var name asn1.RawValue
		if rest, err = asn1.Unmarshal(rest, &name); err != nil {
			return nil, fmt.Errorf("name %d: %w", i, err)
		}
		typ, ok := sanTypes[name.Tag]
		if name.Class != asn1.ClassContextSpecific || !ok || name.IsCompound != typ.constructed {
			// A tag in the wrong form is not its alternative: crypto/x509,
			// and so the API server and the signer, read a constructed [2]
			// holding "worker-1" as no DNS name at all.
			sans = append(sans, SAN{Type: "unknown", Value: hex.EncodeToString(name.FullBytes)})
			continue
		}
		sans = append(sans, SAN{Type: typ.name, Value: sanValue(typ.name, name)})
	}
	return sans, nil
}

func sanValue(typ string, name asn1.RawValue) string {
	switch typ {
	case "email", "dns", "uri":
		return string(name.Bytes)
	case "ip":
		// Canonical text, so that a rule compares strings: the IPv4-mapped
		// form of an IPv4 address reads as the IPv4 address, as Talos reports it.
		if addr, ok := netip.AddrFromSlice(name.Bytes); ok {
			return addr.Unmap().String()
		}
		return net.IP(name.Bytes).String()
	default:
		return hex.EncodeToString(name.FullBytes)
	}
}

// DescribeKey is the facts of a public key the key policy reads.
func DescribeKey(key any, algorithm x509.PublicKeyAlgorithm) PublicKey {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return PublicKey{Algorithm: "RSA", Bits: k.N.BitLen()}
	case *ecdsa.PublicKey:
		return PublicKey{Algorithm: "ECDSA", Bits: k.Curve.Params().BitSize, Curve: k.Curve.Params().Name}
	case ed25519.PublicKey:
		return PublicKey{Algorithm: "Ed25519", Bits: 256}
	default:
		return PublicKey{Algorithm: algorithm.String()}
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return append([]string(nil), s...)
}
