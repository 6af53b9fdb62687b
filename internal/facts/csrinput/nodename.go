package csrinput

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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
	if len(csr.Spec.Request) > MaxRequestBytes {
		// Not parsed, as ParseRequest does not parse it.
		return ""
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil {
		return ""
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return ""
	}
	return nodeNameOfSubject(req.Subject.Names)
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
