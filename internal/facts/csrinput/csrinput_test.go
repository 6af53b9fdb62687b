package csrinput_test

import (
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/utils/ptr"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

func mustPEM(t *testing.T, r csrgen.Request) []byte {
	t.Helper()
	b, err := csrgen.PEM(r)
	require.NoError(t, err)
	return b
}

func TestBuildDescribesEachKeyType(t *testing.T) {
	for _, tc := range []struct {
		key  csrgen.KeyType
		want csrinput.PublicKey
		sig  string
	}{
		{csrgen.ECDSA, csrinput.PublicKey{Algorithm: "ECDSA", Bits: 256, Curve: "P-256"}, "ECDSA-SHA256"},
		{csrgen.RSA, csrinput.PublicKey{Algorithm: "RSA", Bits: 2048}, "SHA256-RSA"},
		{csrgen.Ed25519, csrinput.PublicKey{Algorithm: "Ed25519", Bits: 256}, "Ed25519"},
	} {
		t.Run(string(tc.key), func(t *testing.T) {
			key, err := csrgen.Key(tc.key)
			require.NoError(t, err)
			obj := csrgen.ServingObject("csr-1", "worker-1", mustPEM(t, csrgen.Request{
				Subject:  csrgen.NodeSubject("worker-1"),
				DNSNames: []string{"worker-1"},
				IPs:      []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("fd00::2")},
				Key:      key,
			}))
			obj.Spec.UID = "uid-1"
			obj.Spec.Extra = map[string]certificatesv1.ExtraValue{"k": {"v"}}
			obj.Spec.ExpirationSeconds = ptr.To[int32](3600)

			got := csrinput.Build(obj)

			assert.Equal(t, "csr-1", got.Name)
			assert.Equal(t, certificatesv1.KubeletServingSignerName, got.SignerName)
			assert.Equal(t, "system:node:worker-1", got.Username)
			assert.Equal(t, "uid-1", got.UID)
			assert.Equal(t, []string{"system:nodes", "system:authenticated"}, got.Groups)
			assert.Equal(t, map[string][]string{"k": {"v"}}, got.Extra)
			assert.Equal(t, []string{"digital signature", "server auth"}, got.Usages)
			assert.Equal(t, ptr.To[int32](3600), got.ExpirationSeconds)
			req := got.Request
			assert.True(t, req.Parsed)
			assert.Empty(t, req.ParseError)
			assert.True(t, req.SignatureValid, req.SignatureError)
			assert.Equal(t, tc.sig, req.SignatureAlgorithm)
			assert.Equal(t, tc.want, req.PublicKey)
			assert.Equal(t, []csrinput.Attribute{
				{OID: "2.5.4.10", Name: "O", Value: "system:nodes"},
				{OID: "2.5.4.3", Name: "CN", Value: "system:node:worker-1"},
			}, req.Subject)
			assert.Equal(t, []csrinput.SAN{
				{Type: "dns", Value: "worker-1"},
				{Type: "ip", Value: "10.5.0.2"},
				{Type: "ip", Value: "fd00::2"},
			}, req.SubjectAltNames)
			assert.Equal(t, []csrinput.Extension{{OID: "2.5.29.17", Critical: false}}, req.Extensions)
		})
	}
}

func TestBuildReportsTamperedSignature(t *testing.T) {
	for _, keyType := range []csrgen.KeyType{csrgen.ECDSA, csrgen.RSA, csrgen.Ed25519} {
		t.Run(string(keyType), func(t *testing.T) {
			key, err := csrgen.Key(keyType)
			require.NoError(t, err)
			good := mustPEM(t, csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), DNSNames: []string{"worker-1"}, Key: key})
			bad, err := csrgen.TamperSignature(good)
			require.NoError(t, err)

			req := csrinput.ParseRequest(bad)

			assert.True(t, req.Parsed, req.ParseError)
			assert.False(t, req.SignatureValid)
			assert.NotEmpty(t, req.SignatureError)
		})
	}
}

func TestBuildReportsMalformedPEM(t *testing.T) {
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"empty":       {nil, "no PEM block found"},
		"not PEM":     {[]byte("hello"), "no PEM block found"},
		"a cert":      {[]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), "asn1: structure error"},
		"garbage DER": {[]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"), "asn1: structure error"},
	} {
		t.Run(name, func(t *testing.T) {
			req := csrinput.ParseRequest(tc.in)
			assert.False(t, req.Parsed)
			assert.False(t, req.SignatureValid)
			assert.Contains(t, req.ParseError, tc.want)
			// Empty lists, not nulls: a rule iterating over them must not see undefined.
			b, err := json.Marshal(req)
			require.NoError(t, err)
			assert.Contains(t, string(b), `"subject":[]`)
			assert.Contains(t, string(b), `"subject_alt_names":[]`)
			assert.Contains(t, string(b), `"extensions":[]`)
			assert.Contains(t, string(b), `"types":[`)
		})
	}
}

// What kube-controller-manager signs is the first PEM block, and only when its
// type is CERTIFICATE REQUEST; its headers change nothing, and it reads no
// further block (k8s.io/kubernetes pkg/apis/certificates/v1.ParseCSR). The
// facts say all of it, and the rules decide: the first block is parsed
// whatever its type, its headers and what follows.
func TestBuildDescribesThePEMBlocksAndParsesTheFirst(t *testing.T) {
	good := mustPEM(t, csrgen.Request{Subject: csrgen.NodeSubject("worker-1")})
	block, _ := pem.Decode(good)
	require.NotNil(t, block)
	withType := func(typ string, headers map[string]string) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: typ, Headers: headers, Bytes: block.Bytes})
	}
	for name, tc := range map[string]struct {
		in   []byte
		want csrinput.PEM
	}{
		"one request":             {good, csrinput.PEM{Blocks: 1, Types: []string{"CERTIFICATE REQUEST"}}},
		"new certificate request": {withType("NEW CERTIFICATE REQUEST", nil), csrinput.PEM{Blocks: 1, Types: []string{"NEW CERTIFICATE REQUEST"}}},
		"headers":                 {withType("CERTIFICATE REQUEST", map[string]string{"Proc-Type": "4,ENCRYPTED", "X": "y"}), csrinput.PEM{Blocks: 1, Types: []string{"CERTIFICATE REQUEST"}, Headers: 2}},
		"two requests":            {append(append([]byte{}, good...), withType("CERTIFICATE", nil)...), csrinput.PEM{Blocks: 2, Types: []string{"CERTIFICATE REQUEST", "CERTIFICATE"}}},
	} {
		t.Run(name, func(t *testing.T) {
			req := csrinput.ParseRequest(tc.in)
			assert.True(t, req.Parsed, req.ParseError)
			assert.True(t, req.SignatureValid, req.SignatureError)
			assert.Equal(t, tc.want, req.PEM)
		})
	}
}

// Two hundred blocks, of long types, cost a bounded input.
func TestPEMFactsAreBounded(t *testing.T) {
	var in []byte
	// Within MaxRequestBytes, whose requests are not decoded at all.
	long := strings.Repeat("X", 100)
	for range 200 {
		in = append(in, pem.EncodeToMemory(&pem.Block{Type: long, Bytes: []byte{1}})...)
	}
	req := csrinput.ParseRequest(in)
	assert.Equal(t, 200, req.PEM.Blocks)
	require.Len(t, req.PEM.Types, csrinput.MaxPEMTypes)
	for _, typ := range req.PEM.Types {
		assert.Len(t, typ, csrinput.MaxPEMTypeBytes)
	}
}

func TestBuildListsEveryNameType(t *testing.T) {
	uri, err := url.Parse("spiffe://cluster.local/ns/default/sa/x")
	require.NoError(t, err)
	req := csrinput.ParseRequest(mustPEM(t, csrgen.Request{
		Subject:  csrgen.NodeSubject("worker-1"),
		DNSNames: []string{"worker-1"},
		IPs:      []net.IP{net.ParseIP("::ffff:10.5.0.2")},
		Emails:   []string{"root@worker-1"},
		URIs:     []*url.URL{uri},
	}))
	assert.ElementsMatch(t, []csrinput.SAN{
		{Type: "dns", Value: "worker-1"},
		{Type: "ip", Value: "10.5.0.2"},
		{Type: "email", Value: "root@worker-1"},
		{Type: "uri", Value: "spiffe://cluster.local/ns/default/sa/x"},
	}, req.SubjectAltNames)
}

func TestBuildListsNameTypesCryptoX509Ignores(t *testing.T) {
	// An otherName (tag 0, as Microsoft's UPN) and a registeredID (tag 8):
	// crypto/x509 drops both, the builder must not.
	otherName, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: mustMarshal(t, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3})})
	require.NoError(t, err)
	registered, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 8, Bytes: []byte{0x2a, 0x03}})
	require.NoError(t, err)
	dns, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte("worker-1")})
	require.NoError(t, err)
	value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: append(append(otherName, registered...), dns...)})
	require.NoError(t, err)

	req := csrinput.ParseRequest(mustPEM(t, csrgen.Request{
		Subject:    csrgen.NodeSubject("worker-1"),
		Extensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: value}},
	}))

	require.True(t, req.Parsed, req.ParseError)
	require.Len(t, req.SubjectAltNames, 3)
	assert.Equal(t, "other_name", req.SubjectAltNames[0].Type)
	assert.Equal(t, "registered_id", req.SubjectAltNames[1].Type)
	assert.Equal(t, csrinput.SAN{Type: "dns", Value: "worker-1"}, req.SubjectAltNames[2])
}

func TestANameInTheWrongFormIsNotItsAlternative(t *testing.T) {
	// A DNS name and an IP address tagged as constructed: crypto/x509 (so
	// the API server, Kubernetes' own checks and the signer) reads neither
	// as a name, and neither must the builder. The reviewed rule approved
	// such a request for its node's name, which Kubernetes calls invalid.
	constructed := func(tag int, b []byte) []byte {
		v, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tag, IsCompound: true, Bytes: b})
		require.NoError(t, err)
		return v
	}
	dns, ip := constructed(2, []byte("worker-1")), constructed(7, []byte{10, 5, 0, 2})
	for name, der := range map[string][]byte{"dns": dns, "ip": ip} {
		t.Run(name, func(t *testing.T) {
			value, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: der})
			require.NoError(t, err)

			req := csrinput.ParseRequest(mustPEM(t, csrgen.Request{
				Subject:    csrgen.NodeSubject("worker-1"),
				Extensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: value}},
			}))

			require.True(t, req.Parsed, req.ParseError)
			assert.Equal(t, []csrinput.SAN{{Type: "unknown", Value: hex.EncodeToString(der)}}, req.SubjectAltNames)
		})
	}
}

func TestBuildListsExtraExtensionsAndSubjectAttributes(t *testing.T) {
	subject := csrgen.NodeSubject("worker-1")
	subject.OrganizationalUnit = []string{"ops"}
	subject.Organization = append(subject.Organization, "system:masters")
	subject.ExtraNames = []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{1, 2, 3, 4}, Value: "x"}}
	req := csrinput.ParseRequest(mustPEM(t, csrgen.Request{
		Subject:  subject,
		DNSNames: []string{"worker-1"},
		Extensions: []pkix.Extension{
			{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: mustMarshal(t, struct{ CA bool }{true})},
		},
	}))
	require.True(t, req.Parsed, req.ParseError)
	assert.Equal(t, []csrinput.Extension{
		{OID: "2.5.29.17", Critical: false},
		{OID: "2.5.29.19", Critical: true},
	}, req.Extensions)
	assert.Equal(t, []csrinput.Attribute{
		{OID: "2.5.4.10", Name: "O", Value: "system:nodes"},
		{OID: "2.5.4.10", Name: "O", Value: "system:masters"},
		{OID: "2.5.4.11", Name: "OU", Value: "ops"},
		{OID: "2.5.4.3", Name: "CN", Value: "system:node:worker-1"},
		{OID: "1.2.3.4", Name: "", Value: "x"},
	}, req.Subject)
}

func TestBuildNeverReturnsNilLists(t *testing.T) {
	got := csrinput.Build(&certificatesv1.CertificateSigningRequest{})
	b, err := json.Marshal(got)
	require.NoError(t, err)
	assert.JSONEq(t, `{
		"name": "", "signer_name": "", "username": "", "uid": "", "object_uid": "", "groups": [], "extra": {}, "usages": [],
		"request": {"pem": {"blocks": 0, "types": [], "headers": 0}, "parsed": false, "parse_error": "no PEM block found", "signature_valid": false, "signature_error": "",
		  "signature_algorithm": "", "subject": [], "subject_alt_names": [], "extensions": [], "public_key": {"algorithm": ""}}
	}`, string(b))
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := asn1.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestASubjectAltNameThatDoesNotParseCompletelyMakesTheRequestUnparsed(t *testing.T) {
	dns := func(name string) []byte {
		b, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte(name)})
		require.NoError(t, err)
		return b
	}
	sequence := func(content []byte) []byte {
		b, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: content})
		require.NoError(t, err)
		return b
	}
	good := append(dns("worker-1"), dns("worker-1.example")...)
	// The second name's length says 40 bytes where 16 follow.
	truncated := append(dns("worker-1"), 0x82, 40)
	truncated = append(truncated, []byte("worker-2.example")...)
	for name, value := range map[string][]byte{
		// A second SEQUENCE after the first: names another reader may see.
		"bytes after the sequence": append(sequence(good), sequence(dns("evil.example"))...),
		"a bad element":            sequence(truncated),
		"not a sequence":           dns("worker-1"),
	} {
		t.Run(name, func(t *testing.T) {
			req := csrinput.ParseRequest(mustPEM(t, csrgen.Request{
				Subject:    csrgen.NodeSubject("worker-1"),
				Extensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: value}},
			}))
			assert.False(t, req.Parsed, "a partial list of names is never a fact")
			assert.NotEmpty(t, req.ParseError)
			assert.Empty(t, req.SubjectAltNames)
			t.Log(req.ParseError)
		})
	}
	// The same names, whole, parse.
	req := csrinput.ParseRequest(mustPEM(t, csrgen.Request{
		Subject:    csrgen.NodeSubject("worker-1"),
		Extensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: sequence(good)}},
	}))
	require.True(t, req.Parsed, req.ParseError)
	assert.Len(t, req.SubjectAltNames, 2)
}
