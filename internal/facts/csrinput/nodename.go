package csrinput

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// NodeUserPrefix is how Kubernetes names a node's user and certificate
// subject: system:node:<name>.
const NodeUserPrefix = "system:node:"

// NodeName is the node name a request's subject claims, as the rules read
// it: the one common name, with the node prefix and a name after it. It is
// "" for a request that does not parse, has no or several common names, or
// a common name without the prefix. The controllers use it only as the key
// to find the request's machine; the rules judge the subject themselves.
func NodeName(csr *certificatesv1.CertificateSigningRequest) string {
	req, err := parseRequest(csr)
	if err != nil {
		return ""
	}
	return nodeNameOfSubject(req.Subject.Names)
}

// RequestPublicKey is the public key of a request's spec.request, read as
// NodeName reads it: the key an issued certificate must carry.
func RequestPublicKey(csr *certificatesv1.CertificateSigningRequest) (crypto.PublicKey, error) {
	req, err := parseRequest(csr)
	if err != nil {
		return nil, err
	}
	return req.PublicKey, nil
}

// parseRequest parses the first PEM block of a request's spec.request, one
// no longer than a request is read to (ParseRequest does not parse a longer
// one either).
func parseRequest(csr *certificatesv1.CertificateSigningRequest) (*x509.CertificateRequest, error) {
	if len(csr.Spec.Request) > MaxRequestBytes {
		return nil, fmt.Errorf("the request is %d bytes, more than the %d a certificate request is read to", len(csr.Spec.Request), MaxRequestBytes)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return nil, errors.New("no PEM block found in the request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse the certificate request: %w", err)
	}
	return req, nil
}

// NodeNameOfCertificate is the node name an issued certificate is for, read
// the same way.
func NodeNameOfCertificate(cert *x509.Certificate) string {
	return nodeNameOfSubject(cert.Subject.Names)
}

func nodeNameOfSubject(names []pkix.AttributeTypeAndValue) string {
	var cns []string
	for _, atv := range names {
		if atv.Type.String() == "2.5.4.3" {
			cns = append(cns, fmt.Sprint(atv.Value))
		}
	}
	if len(cns) != 1 {
		return ""
	}
	node, ok := strings.CutPrefix(cns[0], NodeUserPrefix)
	if !ok || node == "" {
		return ""
	}
	return node
}
