package engine_test

import (
	"context"
	"io"
	"net"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/test/csrgen"
)

// FuzzKubeletServingDecision feeds arbitrary request bytes and usages through
// the input builder and the rule. Whatever the bytes, building must not panic,
// and a request whose PEM does not parse or whose signature does not verify
// must never be approved.
func FuzzKubeletServingDecision(f *testing.F) {
	good, err := csrgen.PEM(csrgen.Request{
		Subject:  csrgen.NodeSubject("worker-1"),
		DNSNames: []string{"worker-1"},
		IPs:      []net.IP{net.ParseIP("10.5.0.2")},
	})
	if err != nil {
		f.Fatal(err)
	}
	tampered, err := csrgen.TamperSignature(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, "system:node:worker-1", uint8(0))
	f.Add(good, "system:node:worker-1", uint8(1))
	f.Add(tampered, "system:node:worker-1", uint8(0))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"), "system:node:worker-1", uint8(0))
	f.Add([]byte{}, "", uint8(7))

	e, err := engine.New(context.Background(), engine.Options{DecisionLog: io.Discard, Log: io.Discard})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { e.Stop(context.Background()) })
	allUsages := []certificatesv1.KeyUsage{"digital signature", "key encipherment", "server auth", "client auth"}

	f.Fuzz(func(t *testing.T, request []byte, username string, usageBits uint8) {
		obj := csrgen.ServingObject("csr-fuzz", "worker-1", request)
		obj.Spec.Username = username
		obj.Spec.Usages = nil
		for i, u := range allUsages {
			if usageBits&(1<<i) != 0 {
				obj.Spec.Usages = append(obj.Spec.Usages, u)
			}
		}
		in := csrinput.KubeletServing{
			CSR:     csrinput.Build(obj),
			Machine: &csrinput.Machine{Name: "worker-1"},
			Node:    &csrinput.Node{Readable: true, Nodename: "worker-1", Hostname: "worker-1", Addresses: []string{"10.5.0.2"}},
		}
		d, err := e.KubeletServing(context.Background(), in)
		if err != nil {
			t.Fatalf("no decision: %v", err)
		}
		if d.Action == engine.ActionApprove && (!in.CSR.Request.Parsed || !in.CSR.Request.SignatureValid) {
			t.Fatalf("approved a request that does not parse or verify: %+v", in.CSR.Request)
		}
	})
}
