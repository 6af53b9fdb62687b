package csrinput_test

import (
	"crypto/x509/pkix"
	"encoding/asn1"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

func TestNodeNameIsTheOneCommonNameWithThePrefix(t *testing.T) {
	cn := asn1.ObjectIdentifier{2, 5, 4, 3}
	for _, tc := range []struct {
		name    string
		subject pkix.Name
		want    string
	}{
		{"node", csrgen.NodeSubject("worker-1"), "worker-1"},
		{"no prefix", pkix.Name{CommonName: "worker-1", Organization: []string{"system:nodes"}}, ""},
		{"bare prefix", pkix.Name{CommonName: "system:node:"}, ""},
		{"no common name", pkix.Name{Organization: []string{"system:nodes"}}, ""},
		{"two common names", pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{
			{Type: cn, Value: "system:node:worker-1"}, {Type: cn, Value: "system:node:worker-2"},
		}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := csrgen.ServingObject("csr", "worker-1", mustPEM(t, csrgen.Request{Subject: tc.subject}))
			assert.Equal(t, tc.want, csrinput.NodeName(obj))
		})
	}
	garbage := csrgen.ServingObject("csr", "worker-1", []byte("not a PEM"))
	assert.Empty(t, csrinput.NodeName(garbage))
}
