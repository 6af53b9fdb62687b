package csrinput_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// Review of 2026-12-06: the rule's input is built before the rule can refuse
// anything, and a tenant's API server sends CSRs of up to 16 MiB, unchecked
// by any API server: six million empty DNS names were about 3 GB as the
// rule's input. A request beyond a bound is not parsed, and says which.
func TestARequestBeyondTheBoundsIsNotParsed(t *testing.T) {
	node := csrgen.NodeSubject("worker-1")
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("n%d", i)
		}
		return out
	}
	attributes := func(n int) pkix.Name {
		s := node
		for i := range n - len(node.Organization) - 1 {
			s.ExtraNames = append(s.ExtraNames, pkix.AttributeTypeAndValue{Type: asn1.ObjectIdentifier{2, 5, 4, 11}, Value: fmt.Sprintf("ou%d", i)})
		}
		return s
	}
	extensions := func(n int) []pkix.Extension {
		out := make([]pkix.Extension, n)
		for i := range out {
			out[i] = pkix.Extension{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, i + 1}, Value: []byte{5, 0}}
		}
		return out
	}
	for name, c := range map[string]struct {
		within, beyond csrgen.Request
		want           string
	}{
		"names": {
			within: csrgen.Request{Subject: node, DNSNames: names(csrinput.MaxSubjectAltNames)},
			beyond: csrgen.Request{Subject: node, DNSNames: names(csrinput.MaxSubjectAltNames - 1), Emails: []string{"x@example.com", "y@example.com"}},
			want:   "subjectAltName extension: more than 1000 names",
		},
		"subject attributes": {
			within: csrgen.Request{Subject: attributes(csrinput.MaxSubjectAttributes)},
			beyond: csrgen.Request{Subject: attributes(csrinput.MaxSubjectAttributes + 1)},
			want:   "the subject has 65 attributes, more than the 64",
		},
		"extensions": {
			within: csrgen.Request{Subject: node, Extensions: extensions(csrinput.MaxExtensions)},
			beyond: csrgen.Request{Subject: node, Extensions: extensions(csrinput.MaxExtensions + 1)},
			want:   "asks for 65 extensions, more than the 64",
		},
	} {
		t.Run(name, func(t *testing.T) {
			req := csrinput.ParseRequest(mustPEM(t, c.within))
			require.True(t, req.Parsed, req.ParseError)
			assert.True(t, req.SignatureValid, req.SignatureError)

			req = csrinput.ParseRequest(mustPEM(t, c.beyond))
			assert.False(t, req.Parsed)
			assert.Contains(t, req.ParseError, c.want)
			assert.Empty(t, req.SubjectAltNames)
			assert.Empty(t, req.Subject)
			assert.Empty(t, req.Extensions)
		})
	}

	// A request past the bytes a request is read to is not even decoded:
	// its node name is not taken either.
	big := mustPEM(t, csrgen.Request{Subject: node, DNSNames: []string{strings.Repeat("x", csrinput.MaxRequestBytes)}})
	req := csrinput.ParseRequest(big)
	assert.False(t, req.Parsed)
	assert.Contains(t, req.ParseError, fmt.Sprintf("more than the %d a certificate request is read to", csrinput.MaxRequestBytes))
	assert.Zero(t, req.PEM.Blocks, "not decoded")
	assert.Empty(t, csrinput.NodeName(csrgen.ServingObject("big", "worker-1", big)))
	assert.Equal(t, "worker-1", csrinput.NodeName(csrgen.ServingObject("small", "worker-1", mustPEM(t, csrgen.Request{Subject: node}))))
}

// withKey is the request der with its public key replaced by key and a
// random signature of the key's length: a request crypto/x509 would not
// make (it checks what it signs), as a requester may send it.
func withKey(t *testing.T, der []byte, key *rsa.PublicKey) []byte {
	t.Helper()
	type publicKeyInfo struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	type info struct {
		Version       int
		Subject       asn1.RawValue
		PublicKey     publicKeyInfo
		RawAttributes []asn1.RawValue `asn1:"tag:0"`
	}
	type request struct {
		Info               info
		SignatureAlgorithm pkix.AlgorithmIdentifier
		Signature          asn1.BitString
	}
	var r request
	_, err := asn1.Unmarshal(der, &r)
	require.NoError(t, err)
	spki, err := x509.MarshalPKIXPublicKey(key)
	require.NoError(t, err)
	_, err = asn1.Unmarshal(spki, &r.Info.PublicKey)
	require.NoError(t, err)
	sig := make([]byte, (key.N.BitLen()+7)/8)
	_, err = rand.Read(sig[1:])
	require.NoError(t, err)
	r.Signature = asn1.BitString{Bytes: sig, BitLength: len(sig) * 8}
	out, err := asn1.Marshal(r)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: out})
}

// crypto/rsa bounds a key from below only: the signature of a key of a few
// megabits takes minutes to hours to check, in a call no context cancels,
// before the rule's key size limit is asked (review of 2026-12-06). A key
// beyond MaxVerifiedRSABits is described, its signature not checked and so
// not valid; one at the bound is checked.
func TestTheSignatureOfAHugeRSAKeyIsNotChecked(t *testing.T) {
	// An odd number of the bits, and the largest exponent crypto/rsa
	// takes: it asks no more of a key.
	key := func(bits int) *rsa.PublicKey {
		n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), uint(bits-1)))
		require.NoError(t, err)
		n.SetBit(n, bits-1, 1).SetBit(n, 0, 1)
		return &rsa.PublicKey{N: n, E: 1<<31 - 1}
	}
	block, _ := pem.Decode(mustPEM(t, csrgen.Request{Subject: csrgen.NodeSubject("worker-1"), Key: mustKey(t, csrgen.RSA)}))
	over := key(csrinput.MaxVerifiedRSABits + 8)
	req := csrinput.ParseRequest(withKey(t, block.Bytes, over))
	require.True(t, req.Parsed, req.ParseError)
	assert.False(t, req.SignatureValid)
	assert.Equal(t, fmt.Sprintf("not checked: an RSA key of %d bits, more than the %d whose signature is checked", over.N.BitLen(), csrinput.MaxVerifiedRSABits), req.SignatureError)
	assert.Equal(t, csrinput.PublicKey{Algorithm: "RSA", Bits: over.N.BitLen()}, req.PublicKey)

	// At the bound the signature is checked, and found wrong.
	req = csrinput.ParseRequest(withKey(t, block.Bytes, key(csrinput.MaxVerifiedRSABits)))
	require.True(t, req.Parsed, req.ParseError)
	assert.False(t, req.SignatureValid)
	assert.NotEmpty(t, req.SignatureError)
	assert.NotContains(t, req.SignatureError, "not checked")
}

func mustKey(t *testing.T, typ csrgen.KeyType) crypto.Signer {
	t.Helper()
	k, err := csrgen.Key(typ)
	require.NoError(t, err)
	return k
}
