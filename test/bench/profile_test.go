package bench

import (
	"testing"
	"time"
)

func TestCategorize(t *testing.T) {
	traces := `File: benchmanager
Type: cpu
Duration: 1s, Total samples = 460ms (46%)
-----------+-------------------------------------------------------
     300ms   runtime.memmove
             github.com/open-policy-agent/opa/v1/topdown.eval
             github.com/ichor-dev/ichor-policy/engine.(*Engine).Decide
             github.com/ichor-dev/ichor-policy/controllers/kubeletserving.(*pass).decide
-----------+-------------------------------------------------------
     100ms   crypto/tls.(*Conn).HandshakeContext
             github.com/ichor-dev/ichor-policy/talosnode.(*Reader).Read
             github.com/ichor-dev/ichor-policy/controllers/kubeletserving.(*pass).readNode
-----------+-------------------------------------------------------
      50ms   runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
      10ms   syscall.Syscall
-----------+-------------------------------------------------------
`
	total, cats, err := categorize(traces, cpuCategories, parseCPU)
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(total) != 460*time.Millisecond {
		t.Errorf("total %s, want 460ms", time.Duration(total))
	}
	want := []Category{
		{"policy evaluation (OPA, engine)", float64(300 * time.Millisecond)},
		{"Talos reads: TLS handshake (a new connection per read)", float64(100 * time.Millisecond)},
		{"GC and runtime", float64(50 * time.Millisecond)},
		{otherCategory, float64(10 * time.Millisecond)},
	}
	if len(cats) != len(want) {
		t.Fatalf("categories %v, want %v", cats, want)
	}
	for i := range want {
		if cats[i] != want[i] {
			t.Errorf("category %d is %v, want %v", i, cats[i], want[i])
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]float64{"0": 0, "512B": 512, "1.50kB": 1536, "3MB": 3 << 20, "2GB": 2 << 30} {
		got, err := parseBytes(in)
		if err != nil || got != want {
			t.Errorf("parseBytes(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

func TestCategorizeHeap(t *testing.T) {
	traces := `Type: inuse_space
-----------+-------------------------------------------------------
     bytes:  256kB
       2MB   k8s.io/api/certificates/v1.(*CertificateSigningRequest).Unmarshal
             k8s.io/client-go/tools/cache.(*Reflector).watch
-----------+-------------------------------------------------------
     bytes:  48B
       1MB   github.com/open-policy-agent/opa/v1/ast.NewTerm
-----------+-------------------------------------------------------
     bytes:  1kB
         0   runtime/pprof.(*profileBuilder).emitLocation
-----------+-------------------------------------------------------
`
	total, cats, err := categorize(traces, heapCategories, parseBytes)
	if err != nil {
		t.Fatal(err)
	}
	if total != 3<<20 || len(cats) != 2 || cats[0].Name != "informer cache: CertificateSigningRequests" || cats[1].Value != 1<<20 {
		t.Errorf("total %v, categories %+v", total, cats)
	}
}
